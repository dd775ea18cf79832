"""The dataset registry: every dataset ldpbench can prepare, with its official files and checksums."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from ldpbench.data import adult, images, leaf, synthetic, tabular, text
from ldpbench.data.download import RemoteFile, fetch_file, locally_available, sha256_of
from ldpbench.data.prepared import ArrayDataset, PreparedDataset, save_arrays, save_prepared
from ldpbench.errors import ConfigError, DatasetUnavailable
from ldpbench.registry import Registry

_SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")


@dataclass(frozen=True)
class LocalInput:
    """A file or directory the user provides (no official download exists), with its format."""

    name: str  # its name under raw_dir/<mirror_dir>/ (or the mirror)
    description: str  # the expected format, shown when it is missing


TABULAR = "tabular"  # the kind of a dataset prepared as data.parquet; the array kinds are prepared.KINDS
TASKS = ("binary", "multiclass", "multilabel")


@dataclass(frozen=True)
class DeclaredMeta:
    """What a preparation of the dataset holds, as its meta.json will say it. Declared with the entry so
    that the dataset contract (ldpbench.data.contract) can check a new or edited entry against the data
    its `build` makes, before the first run trips over a wrong class list or feature shape."""

    kind: str  # TABULAR, or an array kind (prepared.KINDS: image, text, tokens, embedding)
    # One record's features: (d,) tabular or embedding, (L,) tokens, (H, W) or (C, H, W) images, () text.
    shape: tuple[int, ...]
    classes: tuple[str, ...] | None  # class names in label order; None: the user's own file decides
    task: str  # TASKS: "binary" (two classes), "multiclass", "multilabel" (labels [n, classes] of 0/1)


@dataclass(frozen=True)
class DatasetEntry:
    name: str
    description: str
    licence: str
    files: tuple[RemoteFile, ...]
    build: Callable[[dict[str, Path]], PreparedDataset | ArrayDataset]
    meta: DeclaredMeta
    mirror_dir: str = ""  # the dataset's directory in a mirror and under data/raw
    local_inputs: tuple[LocalInput, ...] = ()
    notes: str = ""  # substitutions, CHOICEs, what the papers used

    def _local_path(self, item: LocalInput, raw_dir: str | Path, mirror: str | Path | None) -> Path | None:
        for base in (raw_dir, mirror):
            if base is not None and (Path(base) / self.mirror_dir / item.name).exists():
                return Path(base) / self.mirror_dir / item.name
        return None

    def is_local(self, raw_dir: str | Path, mirror: str | Path | None) -> bool:
        """Whether every file is in raw_dir or the mirror (synthetic sets always are)."""
        return all(locally_available(f, self.mirror_dir, raw_dir, mirror) for f in self.files) and \
            all(self._local_path(item, raw_dir, mirror) is not None for item in self.local_inputs)

    def resolved_files(self, checksums: Mapping[str, str] | None = None) -> tuple[RemoteFile, ...]:
        """The files with user-supplied sha256 (key '<mirror_dir>/<name>') filled in where none is pinned."""
        checksums = dict(checksums or {})
        resolved = []
        for f in self.files:
            key = f"{self.mirror_dir}/{f.name}"
            given = checksums.get(key)
            if given is not None:
                if not _SHA256.match(given):
                    raise ConfigError(f"checksum for '{key}': {given!r} is not a sha256 (64 hex digits)")
                if f.sha256 and f.sha256 != given.lower():
                    raise ConfigError(f"checksum for '{key}': {given} differs from the pinned sha256 "
                                      f"{f.sha256}; remove it from data.checksums")
                f = f.with_sha256(given)
            resolved.append(f)
        return tuple(resolved)

    def prepare(
        self,
        out_dir: str | Path,
        raw_dir: str | Path,
        mirror: str | Path | None = None,
        allow_download: bool = False,
        checksums: Mapping[str, str] | None = None,
    ) -> PreparedDataset | ArrayDataset:
        files = self.resolved_files(checksums)
        paths = {f.name: fetch_file(f, self.mirror_dir, raw_dir, mirror, allow_download) for f in files}
        user_files = []
        for item in self.local_inputs:
            path = self._local_path(item, raw_dir, mirror)
            if path is None:
                raise DatasetUnavailable(
                    f"dataset '{self.name}' needs '{item.name}', which you provide: expected at "
                    f"'{Path(raw_dir) / self.mirror_dir / item.name}' (or in the mirror under "
                    f"'{self.mirror_dir}/{item.name}').\n{item.description}"
                )
            paths[item.name] = path
            if path.is_file():
                user_files.append({"name": item.name, "sha256": sha256_of(path), "provided_by": "user"})
        dataset = self.build(paths)
        info = dict(dataset.info)
        info["licence"] = self.licence
        info["description"] = self.description
        if self.notes:
            info["notes"] = self.notes
        info["raw_files"] = [
            {"name": f.name, "url": f.url, "sha256": f.sha256, "md5": f.md5, "pin": f.pin or None,
             **({"archive": f.member_of.name, "member": f.member} if f.member_of else {})}
            for f in files
        ] + user_files
        dataset = replace(dataset, info=info)
        if isinstance(dataset, ArrayDataset):
            save_arrays(dataset, out_dir, self.name)
        else:
            save_prepared(dataset, out_dir, self.name)
        return dataset


DATASETS: Registry[DatasetEntry] = Registry("dataset")
register = DATASETS.register
get = DATASETS.get
names = DATASETS.names


# --- FedSel synthetic sets: syn-{L,H}-{C1}-{C2}; syn-S is a small size for smoke tests ---------
SYNTHETIC_SIZES = {"S": (20, 5_000), "L": (100, 60_000), "H": (300, 100_000)}


def _generated(_paths: dict[str, Path], spec: synthetic.SyntheticSpec) -> PreparedDataset:
    """A synthetic set's build (no files); a partial over `spec`, so that tests can make it smaller."""
    return synthetic.generate(spec)


for _size, (_dims, _records) in SYNTHETIC_SIZES.items():
    for _c1 in (0.01, 0.1):
        for _c2 in (0.6, 0.9):
            _spec = synthetic.SyntheticSpec(dims=_dims, records=_records, c1=_c1, c2=_c2)
            register(DatasetEntry(
                name=f"syn-{_size}-{_c1:g}-{_c2:g}",
                description=f"FedSel synthetic, d={_dims}, N={_records}, C1={_c1:g}, C2={_c2:g}",
                licence="generated by ldpbench",
                files=(),
                build=functools.partial(_generated, spec=_spec),
                meta=DeclaredMeta(TABULAR, (_dims,), ("0", "1"), "binary"),
            ))

ADULT_URL = "https://archive.ics.uci.edu/ml/machine-learning-databases/adult/"
register(DatasetEntry(
    name="adult",
    description="UCI Adult census income, 48,842 records, 123 one-hot features (a9a encoding)",
    licence="CC BY 4.0",
    files=(
        RemoteFile("adult.data", ADULT_URL + "adult.data",
                   "5b00264637dbfec36bdeaab5676b0b309ff9eb788d63554ca0a249491c86603d"),
        RemoteFile("adult.test", ADULT_URL + "adult.test",
                   "a2a9044bc167a35b2361efbabec64e89d69ce82d9790d2980119aac5fd7e9c05"),
    ),
    build=adult.prepare,
    meta=DeclaredMeta(TABULAR, (123,), ("<=50K", ">50K"), "binary"),
    mirror_dir="adult",
))

register(DatasetEntry(
    name="bank",
    description="UCI Bank Marketing (bank-full.csv), 45,211 records, 32 features (FedSel BANK)",
    licence="CC BY 4.0",
    files=(RemoteFile("bank.zip", "https://archive.ics.uci.edu/ml/machine-learning-databases/00222/bank.zip",
                      "99d7e8eb12401ed278b793984423915411ea8df099e1795f9fefe254f513fe5e"),),
    build=tabular.prepare_bank,
    meta=DeclaredMeta(TABULAR, (32,), ("no", "yes"), "binary"),
    mirror_dir="bank_marketing",
))

register(DatasetEntry(
    name="kdd99",
    description="KDD Cup 1999 10% file, 70,000 records sampled with seed 0, 113 features (FedSel: 114)",
    licence="CC BY 4.0",
    files=(RemoteFile("kddcup.data_10_percent.gz",
                      "http://kdd.ics.uci.edu/databases/kddcup99/kddcup.data_10_percent.gz",
                      "8045aca0d84e70e622d1148d7df782496f6333bf6eb979a1b0837c42a9fd9561"),),
    build=tabular.prepare_kdd,
    meta=DeclaredMeta(TABULAR, (113,), ("normal", "attack"), "binary"),
    mirror_dir="kddcup99",
))


# --- image datasets ------------------------------------------------------------------------------
MNIST_URL = "https://ossci-datasets.s3.amazonaws.com/mnist/"
_TFDS = "as pinned by TensorFlow Datasets (url_checksums)"
MNIST_FILES = {
    "train-images-idx3-ubyte.gz": "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
    "train-labels-idx1-ubyte.gz": "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
    # computed from the byte-identical official copies in ../shared/datasets (TFDS pins the same)
    "t10k-images-idx3-ubyte.gz": "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
    "t10k-labels-idx1-ubyte.gz": "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
}
_MNIST = {name: RemoteFile(name, MNIST_URL + name, sha, pin=_TFDS) for name, sha in MNIST_FILES.items()}
_MNIST_SPLITS = {"train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", 60_000),
                 "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz", 10_000)}
_MNIST_LICENCE = "CC BY-SA 3.0 (Yann LeCun and Corinna Cortes)"
_DIGITS = DeclaredMeta("image", (28, 28), images.MNIST_CLASSES, "multiclass")

register(DatasetEntry(
    name="mnist",
    description="MNIST, 70,000 28x28 digits (60,000 train + 10,000 official test), 10 classes",
    licence=_MNIST_LICENCE,
    files=tuple(_MNIST.values()),
    build=functools.partial(images.build_idx, splits=_MNIST_SPLITS, classes=images.MNIST_CLASSES,
                            official_split=True),
    meta=_DIGITS,
    mirror_dir="mnist",
))

register(DatasetEntry(
    name="mnist-t10k",
    description="SUBSTITUTION: MNIST's 10,000 official test images only, split into train/test by the runs",
    licence=_MNIST_LICENCE,
    files=(_MNIST["t10k-images-idx3-ubyte.gz"], _MNIST["t10k-labels-idx1-ubyte.gz"]),
    build=functools.partial(images.build_idx, splits={"test": _MNIST_SPLITS["test"]},
                            classes=images.MNIST_CLASSES, official_split=False),
    meta=_DIGITS,
    mirror_dir="mnist",
    notes="Only MNIST's t10k files are at hand here; the 10,000 images carry no official split "
          "(official_test is absent), so the runs split them at random into train and test.",
))

FASHION_URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
_FASHION = (  # sha256 as pinned by TFDS; md5 as published in the Fashion-MNIST README
    ("train-images-idx3-ubyte.gz", "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84",
     "8d4fb7e6c68d591d4c3dfef9ec88bf0d"),
    ("train-labels-idx1-ubyte.gz", "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845",
     "25c81989df183df01b3e8a0aad5dffbe"),
    ("t10k-images-idx3-ubyte.gz", "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073",
     "bef4ecab320f06d8554ea6380940ec79"),
    ("t10k-labels-idx1-ubyte.gz", "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5",
     "bb300cfdad3c16e7a12a480ee83cd310"),
)
register(DatasetEntry(
    name="fashion-mnist",
    description="Fashion-MNIST, 70,000 28x28 grey images (60,000 train + 10,000 test), 10 classes",
    licence="MIT (Zalando Research)",
    files=tuple(RemoteFile(n, FASHION_URL + n, sha, md5=md5, pin=_TFDS) for n, sha, md5 in _FASHION),
    build=functools.partial(images.build_idx, splits=_MNIST_SPLITS, classes=images.FASHION_CLASSES,
                            official_split=True),
    meta=DeclaredMeta("image", (28, 28), images.FASHION_CLASSES, "multiclass"),
    mirror_dir="fashion_mnist",
))

register(DatasetEntry(
    name="emnist-mnist",
    description="EMNIST 'mnist' split (sqSGD's EMNIST: 60,000 train + 10,000 test digits, 10 classes)",
    licence="CC0 1.0 (NIST; Cohen et al. 2017)",
    files=(RemoteFile("gzip.zip", "https://biometrics.nist.gov/cs_links/EMNIST/gzip.zip",
                      "fb9bb67e33772a9cc0b895e4ecf36d2cf35be8b709693c3564cea2a019fcda8e",
                      pin="as pinned by TFDS for the same file at "
                          "itl.nist.gov/iaui/vip/cs_links/EMNIST/gzip.zip, 561,753,746 bytes"),),
    build=functools.partial(images.build_emnist, archive="gzip.zip", split="mnist",
                            classes=images.MNIST_CLASSES, expected={"train": 60_000, "test": 10_000}),
    meta=_DIGITS,
    mirror_dir="emnist",
    notes="sqSGD says its three sets have equal training sizes and trains the same LeNet-5 "
          "(119,850 parameters) on MNIST and EMNIST: of EMNIST's splits only 'mnist' has 60,000 "
          "training images and 10 classes. Images are transposed back to MNIST's orientation.",
))

register(DatasetEntry(
    name="femnist",
    description="FEMNIST (LEAF): EMNIST by writer, 28x28, 62 classes, clients = writers (LEAF json)",
    licence="CC0 1.0 (NIST SD19 / EMNIST); LEAF scripts BSD-2-Clause",
    files=(),
    local_inputs=(LocalInput("leaf", leaf.LAYOUT.format(root="data/raw/femnist_leaf/leaf") +
                             "\nLEAF builds it from NIST SD19 (https://s3.amazonaws.com/nist-srd/"
                             "SD19/by_class.zip and by_write.zip) with data/femnist/preprocess.sh "
                             "(BitRand: the full set, e.g. -s niid --sf 1.0 -k 0 -t sample)."),),
    build=functools.partial(leaf.build_femnist, input_name="leaf"),
    meta=DeclaredMeta("image", (28, 28), leaf.FEMNIST_CLASSES, "multiclass"),
    mirror_dir="femnist_leaf",
    notes="LEAF publishes scripts, not files: the json is generated locally, so no checksum can "
          "be pinned; the sha256 of every json file read is stored in the metadata.",
))

_CELEBA_DRIVE = "https://drive.google.com/uc?export=download&id="
_CELEBA = (
    RemoteFile("img_align_celeba.zip", _CELEBA_DRIVE + "0B7EVK8r0v71pZjFTYXZWM3FlRnM",
               "46fb89443c578308acf364d7d379fe1b9efb793042c0af734b6112e4fd3a8c74",
               md5="00d2c5bc6d35e252742224ab0c1e8fcb", pin=_TFDS + "; md5 as pinned by torchvision"),
    RemoteFile("list_attr_celeba.txt", _CELEBA_DRIVE + "0B7EVK8r0v71pblRyaVFSWGxPY0U",
               "f0e5da289d5ccf75ffe8811132694922b60f2af59256ed362afa03fefba324d0",
               md5="75e246fa4810816ffd6ee81facbd244c", pin=_TFDS + "; md5 as pinned by torchvision"),
    RemoteFile("list_eval_partition.txt", _CELEBA_DRIVE + "0B7EVK8r0v71pY0NSMzRuSXJEVkk",
               "fc955bcb3ef8fbdf7d5640d9a8693a8431b5f2ee291a5c1449a1549e7e073fe7",
               md5="d32c9cbf5e040fd4025c592c306e6668", pin=_TFDS + "; md5 as pinned by torchvision"),
    RemoteFile("identity_CelebA.txt", _CELEBA_DRIVE + "1_ee_0u7vcNLOfNLegJRHmolfH5ICW-XS", None,
               md5="32bd1bd63d3c78cd57e08160ec5ed1e2",
               pin="sha256 unknown here; md5 as pinned by torchvision"),
)
_CELEBA_NOTES = ("Official files are on Google Drive (mmlab.ie.cuhk.edu.hk/projects/CelebA.html); "
                 "a scripted download of the 1.4 GB zip usually gets Drive's confirmation page "
                 "instead, which the checksum refuses: put the files in data/raw/celeba/ by hand. "
                 "Images are read straight from the zip and resized to 84x84 (LEAF's size). "
                 "Clients are celebrity identities; official_test is partition 2.")
_CELEBA_LICENCE = "non-commercial research use only (CelebA agreement, MMLAB CUHK)"
_CELEBA_SHAPE = (3, images.CELEBA_IMAGE_SIZE, images.CELEBA_IMAGE_SIZE)
register(DatasetEntry(
    name="celeba",
    description="CelebA aligned, 202,599 images (84x84), the 40 binary attributes as multi-label "
                "targets (BitRand: 40 binary classes, AUC), clients = identities",
    licence=_CELEBA_LICENCE,
    files=_CELEBA,
    build=images.build_celeba,
    meta=DeclaredMeta("image", _CELEBA_SHAPE, images.CELEBA_ATTRIBUTES, "multilabel"),
    mirror_dir="celeba",
    notes=_CELEBA_NOTES + " BitRand uses all 40 attributes as binary classes (labels [n, 40]).",
))
register(DatasetEntry(
    name="celeba-smiling",
    description="CelebA aligned with the single binary attribute 'Smiling' (LEAF's CelebA task)",
    licence=_CELEBA_LICENCE,
    files=_CELEBA,
    build=functools.partial(images.build_celeba, label="Smiling"),
    meta=DeclaredMeta("image", _CELEBA_SHAPE, ("not Smiling", "Smiling"), "multiclass"),
    mirror_dir="celeba",
    notes=_CELEBA_NOTES,
))

# --- text datasets -------------------------------------------------------------------------------
AG_NEWS_URL = "https://raw.githubusercontent.com/mhjabreel/CharCnn_Keras/master/data/ag_news_csv/"
_AG_TEST = RemoteFile("test.csv", AG_NEWS_URL + "test.csv",
                      "521465c2428ed7f02f8d6db6ffdd4b5447c1c701962353eb2c40d548c3c85699",
                      md5="d52ea96a97a2d943681189a97654912d",
                      pin="sha256 computed from the official copy in ../shared/datasets; md5 as pinned by torchtext")
_AG_TRAIN = RemoteFile("train.csv", AG_NEWS_URL + "train.csv", None,
                       md5="b1a00f826fdfbd249f79597b59e1dc12",
                       pin="sha256 unknown here; md5 as pinned by torchtext")
_AG_LICENCE = "non-commercial research and educational use (AG's corpus, A. Gulli)"
_AG_META = DeclaredMeta("text", (), text.AG_NEWS_CLASSES, "multiclass")
register(DatasetEntry(
    name="ag-news",
    description="AG News (ag_news_csv): 120,000 train + 7,600 test articles, 4 classes, raw text",
    licence=_AG_LICENCE,
    files=(_AG_TRAIN, _AG_TEST),
    build=functools.partial(text.build_ag_news, splits={"train.csv": 120_000, "test.csv": 7_600},
                            official_split=True),
    meta=_AG_META,
    mirror_dir="ag_news",
))
register(DatasetEntry(
    name="ag-news-test",
    description="SUBSTITUTION: AG News' 7,600 official test articles only, split into train/test by the runs",
    licence=_AG_LICENCE,
    files=(_AG_TEST,),
    build=functools.partial(text.build_ag_news, splits={"test.csv": 7_600}, official_split=False),
    meta=_AG_META,
    mirror_dir="ag_news",
    notes="Only AG News' test.csv is at hand here; its 7,600 articles carry no official split "
          "(official_test is absent), so the runs split them at random into train and test.",
))

register(DatasetEntry(
    name="sec",
    description="SEC contract clauses (BitRand's own set, not public): user-provided CSV",
    licence="as the provider of the file states (not public)",
    files=(),
    local_inputs=(LocalInput(text.SEC_FILE, text.SEC_FORMAT),),
    build=text.build_sec,
    meta=DeclaredMeta("text", (), None, "multiclass"),  # classes 0..C-1 from the user's labels
    mirror_dir="sec",
))

# 80 characters (ids in LEAF's vocabulary) -> the next character, one of the vocabulary's 80 symbols.
_NEXT_CHARACTER = DeclaredMeta("tokens", (text.SEQUENCE_LENGTH,), tuple(text.LEAF_VOCABULARY), "multiclass")
_TFF_ARCHIVE = RemoteFile("shakespeare.tar.bz2",
                          "https://storage.googleapis.com/tff-datasets-public/shakespeare.tar.bz2",
                          "0285be9906cb5f268092eee4edeeacfc2af4574f2941f7cc2f08a321d7f5c707",
                          pin="as given in ../shared/datasets/README.md")
register(DatasetEntry(
    name="shakespeare-tff",
    description="Shakespeare (TensorFlow Federated h5): 715 roles as clients, 80-character windows "
                "-> next character, LEAF's 80-symbol vocabulary",
    licence="public-domain text (TFF's derived files: Apache-2.0 / CC BY 4.0)",
    files=tuple(
        RemoteFile(f"shakespeare_{split}.h5", _TFF_ARCHIVE.url, sha, member_of=_TFF_ARCHIVE,
                   member=f"shakespeare_{split}.h5",
                   pin="computed from the official copy in ../shared/datasets")
        for split, sha in (("train", "67100f52adfb6d5ece73c1a942b6863731a477bf09421a3c79c9937612895344"),
                           ("test", "55d3a635bffe5c4f71610a8d0cf86c1b369bfd7793e0635b5a83cde1f195689e"))
    ),
    build=text.build_shakespeare_tff,
    meta=_NEXT_CHARACTER,
    mirror_dir="shakespeare_tff",
    notes="CHOICE: per role and split the snippets are joined and cleaned as LEAF cleans a role's "
          "text, then cut into non-overlapping 80-character windows (stride 80; LEAF slides by 1, "
          "~35x more, mostly overlapping records). Counts asserted: 715 clients, 16,068 train and "
          "2,356 test snippets.",
))

register(DatasetEntry(
    name="shakespeare",
    description="Shakespeare (LEAF json): roles as clients, 80-character strings -> next character",
    licence="public-domain text (Project Gutenberg); LEAF scripts BSD-2-Clause",
    files=(),
    local_inputs=(LocalInput("leaf", leaf.LAYOUT.format(root="data/raw/shakespeare_leaf/leaf") +
                             "\nLEAF builds it from Project Gutenberg's complete works "
                             "(http://www.gutenberg.org/files/100/100-0.txt, a file that changes "
                             "over time) with data/shakespeare/preprocess.sh."),),
    build=functools.partial(leaf.build_shakespeare_leaf, input_name="leaf"),
    meta=_NEXT_CHARACTER,
    mirror_dir="shakespeare_leaf",
    notes="LEAF publishes scripts, not files: no checksum can be pinned; the sha256 of every json "
          "file read is stored in the metadata.",
))

# Datasets of installed plugin packages (entry points "ldpbench.datasets"), after the built-in ones.
from ldpbench import plugins as _plugins  # noqa: E402

_plugins.load_when_needed(DATASETS)
