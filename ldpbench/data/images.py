"""Image datasets: the MNIST family (idx-ubyte files), EMNIST (official gzip.zip) and CelebA."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np

from ldpbench.data.archive import decompress, read_compressed, read_member, read_zip_member
from ldpbench.data.prepared import ArrayDataset
from ldpbench.errors import DatasetCorrupt, UnsafeArchive

MNIST_CLASSES = tuple(str(digit) for digit in range(10))
FASHION_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                   "Sneaker", "Bag", "Ankle boot")


def parse_idx(data: bytes, source: str) -> np.ndarray:
    """An idx-ubyte file (the MNIST format: magic 0x0000 08 <ndim>, big-endian int32 sizes)."""
    if len(data) < 4 or data[0:2] != b"\x00\x00" or data[2] != 0x08 or not 1 <= data[3] <= 4:
        raise DatasetCorrupt(f"'{source}' is not an unsigned-byte idx file (bad magic number)")
    ndim = data[3]
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DatasetCorrupt(f"'{source}' is truncated (incomplete idx header)")
    dims = tuple(int(v) for v in np.frombuffer(data[4:header], dtype=">i4"))
    expected = header + int(np.prod(dims))
    if len(data) != expected:
        raise DatasetCorrupt(f"'{source}' holds {len(data)} bytes, its idx header {dims} needs "
                             f"{expected}: the file is truncated or corrupted")
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(dims)


def _check_count(array: np.ndarray, expected: int | None, source: str) -> None:
    if expected is not None and len(array) != expected:
        raise DatasetCorrupt(f"'{source}' holds {len(array)} records, expected {expected}")


def idx_split(images: bytes, labels: bytes, images_source: str, labels_source: str,
              expected: int | None) -> tuple[np.ndarray, np.ndarray]:
    x = parse_idx(images, images_source)
    y = parse_idx(labels, labels_source)
    if x.ndim != 3 or y.ndim != 1:
        raise DatasetCorrupt(f"'{images_source}' / '{labels_source}' have shapes {x.shape} / "
                             f"{y.shape}, expected [n, H, W] / [n]")
    _check_count(x, expected, images_source)
    _check_count(y, expected, labels_source)
    if len(x) != len(y):
        raise DatasetCorrupt(f"'{images_source}' has {len(x)} images but '{labels_source}' "
                             f"{len(y)} labels")
    return x, y.astype(np.int64)


def build_idx(paths: dict[str, Path], splits: dict[str, tuple[str, str, int]],
              classes: tuple[str, ...], official_split: bool) -> ArrayDataset:
    """`splits`: split -> (images file, labels file, expected records), from gz idx files."""
    xs, ys, test = [], [], []
    for split, (images, labels, expected) in splits.items():
        x, y = idx_split(read_compressed(paths[images]), read_compressed(paths[labels]),
                         str(paths[images]), str(paths[labels]), expected)
        if y.max(initial=0) >= len(classes):
            raise DatasetCorrupt(f"'{paths[labels]}' has label {y.max()}, expected < {len(classes)}")
        xs.append(x), ys.append(y), test.append(np.full(len(y), split == "test"))
    counts = {split: int(len(y)) for split, y in zip(splits, ys)}
    return ArrayDataset(
        features=np.concatenate(xs), labels=np.concatenate(ys), classes=classes, kind="image",
        official_test=np.concatenate(test) if official_split else None,
        info={"counts": counts},
    )


def build_emnist(paths: dict[str, Path], archive: str, split: str, classes: tuple[str, ...],
                 expected: dict[str, int]) -> ArrayDataset:
    """One EMNIST split read straight from the official gzip.zip (members gzip/emnist-<split>-*).

    EMNIST stores images transposed relative to MNIST; they are transposed back (upright).
    """
    xs, ys, test = [], [], []
    for part in ("train", "test"):
        members = [f"gzip/emnist-{split}-{part}-{kind}-idx{d}-ubyte.gz" for kind, d in (("images", 3), ("labels", 1))]
        sources = [f"{paths[archive]}:{member}" for member in members]
        raw = [decompress(read_zip_member(paths[archive], member), source)
               for member, source in zip(members, sources)]
        x, y = idx_split(raw[0], raw[1], sources[0], sources[1], expected[part])
        xs.append(x.transpose(0, 2, 1)), ys.append(y), test.append(np.full(len(y), part == "test"))
    return ArrayDataset(np.concatenate(xs), np.concatenate(ys), classes, "image",
                        official_test=np.concatenate(test),
                        info={"counts": {p: int(len(y)) for p, y in zip(("train", "test"), ys)},
                              "emnist_split": split})


# ----------------------------------------------------------------------------------- CelebA
CELEBA_IMAGES = 202_599
CELEBA_PARTITION = {"train": 162_770, "valid": 19_867, "test": 19_962}
CELEBA_IMAGE_SIZE = 84  # LEAF's CelebA size (plain resize, aspect not kept)
# The 40 attributes in the column order of list_attr_celeba.txt: the classes of the multi-label set.
CELEBA_ATTRIBUTES = (
    "5_o_Clock_Shadow", "Arched_Eyebrows", "Attractive", "Bags_Under_Eyes", "Bald", "Bangs", "Big_Lips",
    "Big_Nose", "Black_Hair", "Blond_Hair", "Blurry", "Brown_Hair", "Bushy_Eyebrows", "Chubby", "Double_Chin",
    "Eyeglasses", "Goatee", "Gray_Hair", "Heavy_Makeup", "High_Cheekbones", "Male", "Mouth_Slightly_Open",
    "Mustache", "Narrow_Eyes", "No_Beard", "Oval_Face", "Pale_Skin", "Pointy_Nose", "Receding_Hairline",
    "Rosy_Cheeks", "Sideburns", "Smiling", "Straight_Hair", "Wavy_Hair", "Wearing_Earrings", "Wearing_Hat",
    "Wearing_Lipstick", "Wearing_Necklace", "Wearing_Necktie", "Young",
)


def _lines(path: Path) -> list[str]:
    try:
        return read_compressed(path).decode("utf-8-sig").splitlines()
    except UnicodeDecodeError as error:
        raise DatasetCorrupt(f"'{path}' is not UTF-8 text: {error}") from None


def _image_table(path: Path, columns: int, what: str) -> dict[str, list[str]]:
    table = {}
    for number, line in enumerate(_lines(path), start=1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != columns:
            raise DatasetCorrupt(f"'{path}' line {number}: {len(fields)} fields, expected {columns} "
                                 f"(image name and {what})")
        table[fields[0]] = fields[1:]
    return table


def parse_celeba_attributes(path: Path, expected: int | None) -> tuple[list[str], dict[str, np.ndarray]]:
    lines = _lines(path)
    try:
        declared = int(lines[0])
        names = lines[1].split()
    except (IndexError, ValueError):
        raise DatasetCorrupt(f"'{path}' lacks the header (image count, then the attribute names)") from None
    rows = {}
    for number, line in enumerate(lines[2:], start=3):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != len(names) + 1 or any(v not in ("1", "-1") for v in fields[1:]):
            raise DatasetCorrupt(f"'{path}' line {number}: expected an image name and {len(names)} "
                                 "values in {-1, 1}")
        rows[fields[0]] = (np.array(fields[1:], dtype=np.int64) > 0).astype(np.int64)
    if len(rows) != declared:
        raise DatasetCorrupt(f"'{path}' declares {declared} images but lists {len(rows)}")
    if expected is not None and len(rows) != expected:
        raise DatasetCorrupt(f"'{path}' lists {len(rows)} images, expected {expected}")
    return names, rows


def build_celeba(paths: dict[str, Path], expected_images: int | None = CELEBA_IMAGES,
                 expected_partition: dict[str, int] | None = None, label: str | None = None,
                 image_size: int = CELEBA_IMAGE_SIZE) -> ArrayDataset:
    """Aligned CelebA: images [n, 3, S, S] uint8 read straight from img_align_celeba.zip, the 40
    attributes as 0/1 labels [n, 40] (or one attribute as a binary label), clients = identities,
    official_test = partition 2 of list_eval_partition.txt (partition 1, validation, is not test).
    """
    from PIL import Image, UnidentifiedImageError

    expected_partition = CELEBA_PARTITION if expected_partition is None else expected_partition
    names, attributes = parse_celeba_attributes(paths["list_attr_celeba.txt"], expected_images)
    partition = _image_table(paths["list_eval_partition.txt"], 2, "partition 0/1/2")
    identity = _image_table(paths["identity_CelebA.txt"], 2, "identity")
    images = sorted(attributes)
    for table, file_name in ((partition, "list_eval_partition.txt"), (identity, "identity_CelebA.txt")):
        missing = [image for image in images if image not in table]
        if missing or len(table) != len(images):
            raise DatasetCorrupt(f"'{paths[file_name]}' lists {len(table)} images; "
                                 f"{len(missing)} of the {len(images)} attribute rows are missing "
                                 f"(first: {missing[:1]})")
    parts = np.array([int(partition[image][0]) for image in images])
    counts = {name: int((parts == i).sum()) for i, name in enumerate(("train", "valid", "test"))}
    if expected_partition and counts != expected_partition:
        raise DatasetCorrupt(f"'{paths['list_eval_partition.txt']}' gives partition sizes {counts}, "
                             f"expected {expected_partition}")
    archive = paths["img_align_celeba.zip"]
    features = np.empty((len(images), 3, image_size, image_size), dtype=np.uint8)
    try:
        with zipfile.ZipFile(archive) as handle:
            for i, image in enumerate(images):
                data = read_member(handle, f"img_align_celeba/{image}", archive)
                with Image.open(io.BytesIO(data)) as picture:
                    picture = picture.convert("RGB").resize((image_size, image_size), Image.BILINEAR)
                    features[i] = np.asarray(picture).transpose(2, 0, 1)
    except (DatasetCorrupt, UnsafeArchive):
        raise
    except (zipfile.BadZipFile, OSError, EOFError, UnidentifiedImageError) as error:
        raise DatasetCorrupt(f"archive '{archive}' is corrupted or truncated: {error}") from error
    labels = np.stack([attributes[image] for image in images])
    classes = tuple(names)
    if label is not None:
        labels, classes = labels[:, names.index(label)], (f"not {label}", label)
    identities = np.array([int(identity[image][0]) for image in images], dtype=np.int64)
    return ArrayDataset(features, labels, classes, "image", clients=identities,
                        official_test=parts == 2,
                        info={"counts": {"images": len(images), **counts},
                              "image_size": image_size, "attributes": names,
                              "label_attribute": label})
