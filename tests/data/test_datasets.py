"""Image/text datasets: real download + preparation code against tiny fixture files served from
127.0.0.1, the array format and its loader, safe archive extraction, and (when the mirror
../shared/datasets is present) the real files.

The fixture preparations are also checked against their entry's declaration (the dataset contract,
ldpbench.data.contract) where the fixture keeps the declared form: every set but CelebA, whose
fixture has 16-pixel images and 3 attributes."""

import bz2
import functools
import gzip
import hashlib
import io
import json
import lzma
import os
import tarfile
import zipfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from ldpbench.data import contract, images, registry, text
from ldpbench.data.archive import UnpackLimits, decompress, read_compressed, read_zip_member, safe_extract
from ldpbench.data.download import ChecksumUnknown, RemoteFile, fetch_file
from ldpbench.data.prepared import ArrayDataset, decode_texts, load_arrays, load_prepared, save_arrays
from ldpbench.errors import (
    ArchiveTooLarge,
    ChecksumMismatch,
    ConfigError,
    DatasetCorrupt,
    DatasetUnavailable,
    UnsafeArchive,
)

from http_fixture import serve_directory

RNG = np.random.default_rng(0)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def idx_bytes(array: np.ndarray) -> bytes:
    header = bytes([0, 0, 8, array.ndim]) + np.array(array.shape, dtype=">i4").tobytes()
    return header + array.astype(np.uint8).tobytes()


def tiny(entry, site: Path, url: str, **build_overrides):
    """The registered entry with its official file names served from `site` (sha256 of the
    fixture bytes pinned) and only its expected record counts changed for the tiny fixtures."""
    def served(f: RemoteFile) -> RemoteFile:
        archive = served(f.member_of) if f.member_of else None
        data = (site / f.name).read_bytes() if (site / f.name).exists() else None
        if data is None:  # a member of an archive, not served on its own
            return replace(f, url=archive.url, member_of=archive, sha256=f.sha256)
        return replace(f, url=f"{url}/{f.name}", sha256=sha256(data), md5=None, member_of=archive)

    build = entry.build
    if build_overrides:
        build = functools.partial(build.func, *build.args, **{**build.keywords, **build_overrides}) \
            if isinstance(build, functools.partial) else functools.partial(build, **build_overrides)
    return replace(entry, files=tuple(served(f) for f in entry.files), build=build)


# ------------------------------------------------------------------------------ MNIST family
def write_idx_pair(site: Path, prefix: str, n: int, classes: int = 10) -> tuple[np.ndarray, np.ndarray]:
    x = RNG.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    y = RNG.integers(0, classes, size=n).astype(np.uint8)
    (site / f"{prefix}-images-idx3-ubyte.gz").write_bytes(gzip.compress(idx_bytes(x)))
    (site / f"{prefix}-labels-idx1-ubyte.gz").write_bytes(gzip.compress(idx_bytes(y)))
    return x, y


@pytest.mark.parametrize("name", ["mnist", "fashion-mnist"])
def test_mnist_family_download_and_prepare(name, tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    x_train, y_train = write_idx_pair(site, "train", 6)
    x_test, y_test = write_idx_pair(site, "t10k", 4)
    splits = {"train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", 6),
              "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz", 4)}
    with serve_directory(site) as url:
        entry = tiny(registry.get(name), site, url, splits=splits)
        entry.prepare(tmp_path / "prep", tmp_path / "raw", allow_download=True)
    arrays = load_arrays(tmp_path / "prep")
    assert isinstance(arrays.features, np.memmap) and arrays.features.dtype == np.uint8
    assert np.array_equal(arrays.features, np.concatenate([x_train, x_test]))
    assert np.array_equal(arrays.labels, np.concatenate([y_train, y_test]))
    assert arrays.labels.dtype == np.int64 and arrays.clients is None
    assert arrays.official_test.tolist() == [False] * 6 + [True] * 4
    meta = arrays.meta
    assert meta["n"] == 10 and meta["shape"] == [28, 28] and meta["kind"] == "image"
    assert meta["counts"] == {"train": 6, "test": 4} and len(meta["classes"]) == 10
    assert sum(meta["class_counts"]) == 10 and meta["licence"]
    assert {f["name"] for f in meta["raw_files"]} == {p.name for p in site.iterdir()}
    assert all(f["url"].startswith("http://127.0.0.1") for f in meta["raw_files"])
    contract.prepared_matches_declared(entry, tmp_path / "prep")


def test_mnist_t10k_substitution_has_no_official_split_and_asserts_counts(tmp_path):
    mirror = tmp_path / "mirror" / "mnist"
    mirror.mkdir(parents=True)
    write_idx_pair(mirror, "t10k", 5)
    entry = tiny(registry.get("mnist-t10k"), mirror, "http://127.0.0.1:9")
    with pytest.raises(DatasetCorrupt, match=r"t10k-images-idx3-ubyte.gz' holds 5 records, expected 10000"):
        entry.prepare(tmp_path / "prep", tmp_path / "raw", mirror=tmp_path / "mirror")
    assert not (tmp_path / "prep" / "meta.json").exists()
    entry = tiny(registry.get("mnist-t10k"), mirror, "http://127.0.0.1:9",
                 splits={"test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz", 5)})
    entry.prepare(tmp_path / "prep", tmp_path / "raw", mirror=tmp_path / "mirror")
    arrays = load_arrays(tmp_path / "prep")
    assert arrays.official_test is None and arrays.meta["n"] == 5
    assert "SUBSTITUTION" in arrays.meta["description"]


def test_truncated_idx_file_is_named(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    write_idx_pair(site, "t10k", 3)
    images_file = site / "t10k-images-idx3-ubyte.gz"
    raw = gzip.decompress(images_file.read_bytes())
    images_file.write_bytes(gzip.compress(raw[:-100]))  # valid gzip, truncated idx payload
    entry = tiny(registry.get("mnist-t10k"), site, "http://127.0.0.1:9",
                 splits={"test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz", 3)})
    mirror = tmp_path / "m"
    (mirror / "mnist").mkdir(parents=True)
    for f in site.iterdir():
        (mirror / "mnist" / f.name).write_bytes(f.read_bytes())
    with pytest.raises(DatasetCorrupt, match="t10k-images-idx3-ubyte.gz' holds .* truncated"):
        entry.prepare(tmp_path / "prep", tmp_path / "raw", mirror=mirror)
    (mirror / "mnist" / images_file.name).write_bytes(images_file.read_bytes()[:-20])  # cut gzip
    entry = tiny(registry.get("mnist-t10k"), mirror / "mnist", "http://127.0.0.1:9",
                 splits={"test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz", 3)})
    with pytest.raises(DatasetCorrupt, match="t10k-images-idx3-ubyte.gz' is corrupted or truncated"):
        entry.prepare(tmp_path / "prep", tmp_path / "raw", mirror=mirror)


def test_emnist_reads_members_of_the_official_zip_and_transposes(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    x = RNG.integers(0, 256, size=(3, 28, 28), dtype=np.uint8)
    y = np.array([1, 2, 3], dtype=np.uint8)
    with zipfile.ZipFile(site / "gzip.zip", "w") as archive:
        for part in ("train", "test"):
            archive.writestr(f"gzip/emnist-mnist-{part}-images-idx3-ubyte.gz", gzip.compress(idx_bytes(x)))
            archive.writestr(f"gzip/emnist-mnist-{part}-labels-idx1-ubyte.gz", gzip.compress(idx_bytes(y)))
    with serve_directory(site) as url:
        entry = tiny(registry.get("emnist-mnist"), site, url, expected={"train": 3, "test": 3})
        entry.prepare(tmp_path / "prep", tmp_path / "raw", allow_download=True)
    arrays = load_arrays(tmp_path / "prep")
    assert np.array_equal(arrays.features[:3], x.transpose(0, 2, 1))
    assert arrays.official_test.sum() == 3 and arrays.meta["emnist_split"] == "mnist"
    contract.prepared_matches_declared(entry, tmp_path / "prep")


# ---------------------------------------------------------------------------------- AG News
AG_ROWS = [("3", "Wall St. Bears", "Short-sellers, Wall Street's dwindling\\band."),
           ("4", "Space probe", "A \"new\" probe, launched today."),
           ("1", "Talks", "Leaders met.")]


def ag_csv(rows) -> bytes:
    out = io.StringIO()
    import csv
    writer = csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n")
    writer.writerows(rows)
    return out.getvalue().encode()


def test_ag_news_download_prepare_and_text_roundtrip(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "train.csv").write_bytes(ag_csv(AG_ROWS))
    (site / "test.csv").write_bytes(ag_csv(AG_ROWS[:2]))
    with serve_directory(site) as url:
        entry = tiny(registry.get("ag-news"), site, url, splits={"train.csv": 3, "test.csv": 2})
        entry.prepare(tmp_path / "prep", tmp_path / "raw", allow_download=True)
    arrays = load_arrays(tmp_path / "prep")
    assert arrays.meta["kind"] == "text" and arrays.features.dtype.kind == "S"
    texts = decode_texts(arrays.features)
    assert texts[0] == "Wall St. Bears Short-sellers, Wall Street's dwindling band."
    assert texts[1] == 'Space probe A "new" probe, launched today.'
    assert arrays.labels.tolist() == [2, 3, 0, 2, 3]
    assert arrays.official_test.tolist() == [False, False, False, True, True]
    assert arrays.meta["classes"] == ["World", "Sports", "Business", "Sci/Tech"]
    contract.prepared_matches_declared(entry, tmp_path / "prep")


def test_ag_news_bad_rows_are_named(tmp_path):
    path = tmp_path / "test.csv"
    path.write_bytes(ag_csv(AG_ROWS) + b'"7","x","y"\n')
    with pytest.raises(DatasetCorrupt, match=r"test.csv' line 4, column 1: class index '7'"):
        text.read_ag_news(path, None)
    path.write_bytes(ag_csv(AG_ROWS))
    with pytest.raises(DatasetCorrupt, match="test.csv' holds 3 articles, expected 7600"):
        text.read_ag_news(path, 7600)


def test_md5_only_pin_is_checked_and_named(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "train.csv").write_bytes(b"payload")
    good = hashlib.md5(b"payload").hexdigest()
    with serve_directory(site) as url:
        remote = RemoteFile("train.csv", f"{url}/train.csv", None, md5=good)
        assert fetch_file(remote, "ag", tmp_path / "raw", allow_download=True).read_bytes() == b"payload"
        (tmp_path / "raw" / "ag" / "train.csv").unlink()
        with pytest.raises(ChecksumMismatch, match=f"train.csv.*expected md5 {'0' * 32}, got {good}"):
            fetch_file(replace(remote, md5="0" * 32), "ag", tmp_path / "raw", allow_download=True,
                       retries=0)


def test_unknown_checksum_is_refused_unless_the_user_gives_it(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "identity_CelebA.txt").write_bytes(b"000001.jpg 1\n")
    entry = registry.DatasetEntry(
        name="x", description="", licence="", mirror_dir="celeba", build=lambda paths: None,
        meta=registry.get("celeba").meta,
        files=(RemoteFile("identity_CelebA.txt", "http://127.0.0.1:9/identity_CelebA.txt", None),))
    with pytest.raises(ChecksumUnknown) as info:
        entry.prepare(tmp_path / "prep", tmp_path / "raw", mirror=tmp_path / "site")
    message = str(info.value)
    assert "no checksum is pinned for 'celeba/identity_CelebA.txt'" in message
    assert "data.checksums" in message and "--sha256 celeba/identity_CelebA.txt=" in message
    mirror = tmp_path / "mirror"
    (mirror / "celeba").mkdir(parents=True)
    (mirror / "celeba" / "identity_CelebA.txt").write_bytes(b"000001.jpg 1\n")
    digest = sha256(b"000001.jpg 1\n")
    resolved = entry.resolved_files({"celeba/identity_CelebA.txt": digest})
    assert fetch_file(resolved[0], "celeba", tmp_path / "raw", mirror).exists()
    with pytest.raises(ChecksumMismatch):
        fetch_file(entry.resolved_files({"celeba/identity_CelebA.txt": "f" * 64})[0], "celeba",
                   tmp_path / "raw2", mirror)


# ----------------------------------------------------------------------------- Shakespeare
def write_tff_h5(path: Path, clients: dict[str, list[str]]) -> None:
    import h5py

    with h5py.File(path, "w") as handle:
        for client, snippets in clients.items():
            handle.create_dataset(f"examples/{client}/snippets",
                                  data=np.array([s.encode() for s in snippets]))


def test_shakespeare_tff_from_the_official_archive(tmp_path):
    line = "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer "
    build = tmp_path / "build"
    build.mkdir()
    write_tff_h5(build / "shakespeare_train.h5", {"HAMLET": [line * 3], "OPHELIA": [line, "Short."]})
    write_tff_h5(build / "shakespeare_test.h5", {"HAMLET": [line * 2], "OPHELIA": ["Ay, my lord."]})
    site = tmp_path / "site"
    site.mkdir()
    with tarfile.open(site / "shakespeare.tar.bz2", "w:bz2") as archive:
        for name in ("shakespeare_train.h5", "shakespeare_test.h5"):
            archive.add(build / name, arcname=name)
    entry = registry.get("shakespeare-tff")
    archive_file = replace(entry.files[0].member_of, sha256=sha256((site / "shakespeare.tar.bz2").read_bytes()))
    with serve_directory(site) as url:
        archive_file = replace(archive_file, url=f"{url}/shakespeare.tar.bz2")
        files = tuple(replace(f, member_of=archive_file, url=archive_file.url,
                              sha256=sha256((build / f.name).read_bytes())) for f in entry.files)
        entry = replace(entry, files=files, build=functools.partial(
            text.build_shakespeare_tff, expected_clients=2,
            expected_snippets={"train": 3, "test": 2}))
        entry.prepare(tmp_path / "prep", tmp_path / "raw", allow_download=True)
    arrays = load_arrays(tmp_path / "prep")
    assert arrays.features.dtype == np.int64 and arrays.features.shape[1] == 80
    vocab = text.LEAF_VOCABULARY
    first = "".join(vocab[i] for i in arrays.features[0])
    cleaned = text.leaf_text(" ".join([line * 3]))
    assert first == cleaned[:80] and vocab[arrays.labels[0]] == cleaned[80]
    assert len(vocab) == 80 and set(arrays.clients.tolist()) == {0, 1}
    assert arrays.official_test.any() and not arrays.official_test.all()
    assert arrays.meta["counts"]["clients"] == 2 and arrays.meta["characters_outside_vocabulary"] == 0
    # the member was extracted safely and verified; no scratch directory is left
    assert sorted(p.name for p in (tmp_path / "raw" / "shakespeare_tff").iterdir()) == \
        ["shakespeare.tar.bz2", "shakespeare_test.h5", "shakespeare_train.h5"]
    contract.prepared_matches_declared(entry, tmp_path / "prep")


def write_leaf(root: Path, split: str, users: dict[str, tuple[list, list]], name="all_data_0.json"):
    (root / split).mkdir(parents=True, exist_ok=True)
    content = {"users": list(users), "num_samples": [len(x) for x, _ in users.values()],
               "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()}}
    (root / split / name).write_text(json.dumps(content))


def test_femnist_leaf_json(tmp_path):
    root = tmp_path / "raw" / "femnist_leaf" / "leaf"
    pixel = [1.0] * 783 + [0.0]
    write_leaf(root, "train", {"f0001_01": ([pixel, pixel], [0, 61]), "f0002_02": ([pixel], [10])})
    write_leaf(root, "test", {"f0001_01": ([pixel], [5])})
    registry.get("femnist").prepare(tmp_path / "prep", tmp_path / "raw")
    arrays = load_arrays(tmp_path / "prep")
    assert arrays.features.shape == (4, 28, 28) and arrays.features[0, 0, 0] == 255
    assert arrays.features[0, 27, 27] == 0
    assert arrays.labels.tolist() == [0, 61, 10, 5] and arrays.clients.tolist() == [0, 0, 1, 0]
    assert arrays.official_test.tolist() == [False, False, False, True]
    assert len(arrays.meta["classes"]) == 62 and len(arrays.meta["leaf_files"]) == 2
    contract.prepared_matches_declared(registry.get("femnist"), tmp_path / "prep")

    write_leaf(root, "test", {"f0001_01": ([pixel], [5, 6])})
    with pytest.raises(DatasetCorrupt, match=r"test/all_data_0.json', user 'f0001_01': num_samples"):
        registry.get("femnist").prepare(tmp_path / "prep", tmp_path / "raw")
    (root / "test" / "all_data_0.json").write_text('{"users": ["a"], "num_sa')
    with pytest.raises(DatasetCorrupt, match=r"test/all_data_0.json' is not a LEAF json file"):
        registry.get("femnist").prepare(tmp_path / "prep", tmp_path / "raw")


def test_shakespeare_leaf_json_and_missing_input_explains_the_layout(tmp_path):
    with pytest.raises(DatasetUnavailable, match=r"(?s)needs 'leaf', which you provide.*preprocess.sh"):
        registry.get("shakespeare").prepare(tmp_path / "prep", tmp_path / "raw")
    root = tmp_path / "raw" / "shakespeare_leaf" / "leaf"
    window = "x" * 79 + "é"  # one character outside LEAF's vocabulary
    write_leaf(root, "all_data", {"THE_TEMPEST_MIRANDA": ([window, "a" * 80], ["b", "c"])})
    registry.get("shakespeare").prepare(tmp_path / "prep", tmp_path / "raw")
    arrays = load_arrays(tmp_path / "prep")
    assert arrays.features.shape == (2, 80) and arrays.official_test is None
    assert arrays.meta["characters_outside_vocabulary"] == 1
    contract.prepared_matches_declared(registry.get("shakespeare"), tmp_path / "prep")


# ----------------------------------------------------------------------------------- CelebA
def test_celeba_images_attributes_identities(tmp_path):
    from PIL import Image

    site = tmp_path / "site"
    site.mkdir()
    names = [f"{i:06d}.jpg" for i in range(1, 5)]
    attributes = ["5_o_Clock_Shadow", "Smiling", "Young"]
    with zipfile.ZipFile(site / "img_align_celeba.zip", "w") as archive:
        for i, name in enumerate(names):
            buffer = io.BytesIO()
            Image.new("RGB", (178, 218), color=(60 * i, 10, 200)).save(buffer, format="JPEG")
            archive.writestr(f"img_align_celeba/{name}", buffer.getvalue())
    rows = [[1, -1, 1], [-1, 1, 1], [1, 1, -1], [-1, -1, -1]]
    (site / "list_attr_celeba.txt").write_text(
        f"{len(names)}\n{' '.join(attributes)}\n" +
        "".join(f"{n} {' '.join(f'{v:2d}' for v in r)}\n" for n, r in zip(names, rows)))
    (site / "list_eval_partition.txt").write_text("".join(f"{n} {p}\n" for n, p in zip(names, [0, 0, 1, 2])))
    (site / "identity_CelebA.txt").write_text("".join(f"{n} {c}\n" for n, c in zip(names, [7, 7, 9, 9])))
    expected = {"train": 2, "valid": 1, "test": 1}
    with serve_directory(site) as url:
        entry = tiny(registry.get("celeba"), site, url, expected_images=4, expected_partition=expected,
                     image_size=16)
        entry.prepare(tmp_path / "prep", tmp_path / "raw", allow_download=True)
        smiling = tiny(registry.get("celeba-smiling"), site, url, expected_images=4,
                       expected_partition=expected, image_size=16)
        smiling.prepare(tmp_path / "prep-smiling", tmp_path / "raw", allow_download=True)
    arrays = load_arrays(tmp_path / "prep")
    assert arrays.features.shape == (4, 3, 16, 16) and arrays.features.dtype == np.uint8
    assert arrays.labels.tolist() == [[1, 0, 1], [0, 1, 1], [1, 1, 0], [0, 0, 0]]
    assert arrays.meta["task"] == "multilabel" and arrays.meta["class_counts"] == [2, 2, 2]
    assert arrays.clients.tolist() == [7, 7, 9, 9] and arrays.official_test.tolist() == [0, 0, 0, 1]
    assert abs(int(arrays.features[1, 0].mean()) - 60) <= 3  # red channel of image 2
    binary = load_arrays(tmp_path / "prep-smiling")
    assert binary.labels.tolist() == [0, 1, 1, 0] and binary.meta["classes"] == ["not Smiling", "Smiling"]

    (site / "list_eval_partition.txt").write_text(f"{names[0]} 0\n")
    with pytest.raises(DatasetCorrupt, match=r"list_eval_partition.txt' lists 1 images"):
        images.build_celeba({**{f.name: site / f.name for f in entry.files}}, expected_images=4)


# -------------------------------------------------------------------------------------- SEC
def test_sec_csv_is_validated_with_file_row_and_column(tmp_path):
    raw = tmp_path / "raw" / "sec"
    raw.mkdir(parents=True)
    path = raw / "sec_contract_clauses.csv"
    with pytest.raises(DatasetUnavailable, match=r"(?s)label .* required .*integer class index"):
        registry.get("sec").prepare(tmp_path / "prep", tmp_path / "raw")
    path.write_text('text,label,client,split\n"The Borrower shall, at all times.",1,c1,train\n'
                    '"Governing law: New York.",0,c2,test\n')
    registry.get("sec").prepare(tmp_path / "prep", tmp_path / "raw")
    arrays = load_arrays(tmp_path / "prep")
    assert decode_texts(arrays.features) == ["The Borrower shall, at all times.", "Governing law: New York."]
    assert arrays.labels.tolist() == [1, 0] and arrays.clients.tolist() == [0, 1]
    assert arrays.official_test.tolist() == [False, True]
    assert arrays.meta["raw_files"][0]["provided_by"] == "user"
    contract.prepared_matches_declared(registry.get("sec"), tmp_path / "prep")
    cases = [
        ("text,label\nok,1\n,0\n", r"line 3, column 'text': empty clause"),
        ("text,label\nok,yes\n", r"line 2, column 'label': 'yes' is not a non-negative integer"),
        ("text,label,split\nok,0,dev\n", r"line 2, column 'split': 'dev'"),
        ("text,labels\nok,0\n", r"line 1: header \['text', 'labels'\] has unknown columns"),
        ("text,label\nok,0\nfine,2\n", r"column 'label': class indices \[1\] never occur"),
        ("text,label\nok,0,extra\n", r"line 2: 3 fields, the header has 2"),
    ]
    for content, message in cases:
        path.write_text(content)
        with pytest.raises(DatasetCorrupt, match=r"sec_contract_clauses.csv'.*" + message):
            registry.get("sec").prepare(tmp_path / "prep", tmp_path / "raw")


def test_utf8_byte_order_mark_is_accepted_by_every_text_reader(tmp_path):
    """Spreadsheet programs write UTF-8 with a byte-order mark; it is not part of the first field."""
    from ldpbench.data import adult, leaf

    bom = b"\xef\xbb\xbf"
    sec = tmp_path / text.SEC_FILE
    sec.write_bytes(bom + b"text,label\nok,0\nfine,1\n")
    assert text.build_sec({text.SEC_FILE: sec}).labels.tolist() == [0, 1]
    ag = tmp_path / "test.csv"
    ag.write_bytes(bom + ag_csv(AG_ROWS[:2]))
    assert text.read_ag_news(ag, 2)[1].tolist() == [2, 3]
    attributes = tmp_path / "list_attr_celeba.txt"
    attributes.write_bytes(bom + b"1\nSmiling Young\n000001.jpg  1 -1\n")
    assert images.parse_celeba_attributes(attributes, 1)[0] == ["Smiling", "Young"]
    partition = tmp_path / "list_eval_partition.txt"
    partition.write_bytes(bom + b"000001.jpg 0\n")
    assert images._image_table(partition, 2, "partition") == {"000001.jpg": ["0"]}
    write_leaf(tmp_path / "leaf", "all_data", {"u": ([[0.0] * 784], [3])})
    leaf_json = tmp_path / "leaf" / "all_data" / "all_data_0.json"
    leaf_json.write_bytes(bom + leaf_json.read_bytes())
    assert [user for _, user, *_ in leaf.read_leaf(tmp_path / "leaf")] == ["u"]
    census = tmp_path / "adult.data"
    census.write_bytes(bom + b"39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical, "
                             b"Not-in-family, White, Male, 2174, 0, 40, United-States, <=50K\n")
    assert adult._read(census, skip_first_line=False, check_counts=False)["age"].tolist() == [39]


# ---------------------------------------------------------------------------------- archives
def tar_with(path: Path, *members: tarfile.TarInfo, data: bytes = b"x") -> Path:
    with tarfile.open(path, "w:gz") as archive:
        for info in members:
            if info.isfile():
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
            else:
                archive.addfile(info)
    return path


def member(name: str, kind=tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


@pytest.mark.parametrize("members, message", [
    ([member("../evil.txt")], "contains '..'"),
    ([member("a/../../evil.txt")], "contains '..'"),
    ([member("/tmp/evil.txt")], "absolute path"),
    ([member("link", tarfile.SYMTYPE, "/etc/passwd")], "is a link"),
    ([member("ok.txt"), member("hard", tarfile.LNKTYPE, "ok.txt")], "is a link"),
    ([member("dir", tarfile.SYMTYPE, ".."), member("dir/evil.txt")], "is a link"),
    ([member("fifo", tarfile.FIFOTYPE)], "not a regular file"),
])
def test_malicious_tar_members_are_refused(tmp_path, members, message):
    archive = tar_with(tmp_path / "evil.tar.gz", *members)
    target = tmp_path / "out" / "extracted"
    with pytest.raises(UnsafeArchive, match=message) as info:
        safe_extract(archive, target)
    assert "evil.tar.gz" in str(info.value)
    assert not target.exists() and list((tmp_path / "out").iterdir()) == []
    assert not (tmp_path / "evil.txt").exists()


@pytest.mark.parametrize("name, message", [("../evil.txt", "contains '..'"),
                                           ("/abs/evil.txt", "absolute path"),
                                           ("C:/evil.txt", "absolute path"),
                                           ("a\\..\\evil.txt", "backslash")])
def test_malicious_zip_members_are_refused(tmp_path, name, message):
    path = tmp_path / "evil.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("fine.txt", "ok")
        archive.writestr(name, "evil")
    with pytest.raises(UnsafeArchive, match=message):
        safe_extract(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(UnsafeArchive):
        read_zip_member(path, name)


def test_zip_symlink_is_refused(tmp_path):
    path = tmp_path / "link.zip"
    with zipfile.ZipFile(path, "w") as archive:
        info = zipfile.ZipInfo("link")
        info.external_attr = (0o120777 << 16)
        archive.writestr(info, "/etc/passwd")
    with pytest.raises(UnsafeArchive, match="symbolic link"):
        safe_extract(path, tmp_path / "out")


def test_good_archives_extract_atomically_and_truncated_ones_are_named(tmp_path):
    archive = tar_with(tmp_path / "good.tar.gz", member("d/a.txt"), member("b.txt"), data=b"hello")
    target = safe_extract(archive, tmp_path / "out")
    assert (target / "d" / "a.txt").read_bytes() == b"hello" and (target / "b.txt").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    truncated = tmp_path / "cut.tar.gz"
    truncated.write_bytes(archive.read_bytes()[:-30])
    with pytest.raises(DatasetCorrupt, match="cut.tar.gz"):
        safe_extract(truncated, tmp_path / "out2")
    zipped = tmp_path / "good.zip"
    with zipfile.ZipFile(zipped, "w") as handle:
        handle.writestr("x.txt", "x" * 1000)
    (tmp_path / "cut.zip").write_bytes(zipped.read_bytes()[:40])
    with pytest.raises(DatasetCorrupt, match="cut.zip"):
        safe_extract(tmp_path / "cut.zip", tmp_path / "out3")
    assert not (tmp_path / "out2").exists() and not (tmp_path / "out3").exists()


# ----------------------------------------------------------------------- decompression bombs
ZEROS = bytes(1 << 20)
SMALL_LIMITS = UnpackLimits(max_bytes=1 << 40, max_ratio=50, ratio_free_bytes=1 << 20)


def zip_of_zeros(path: Path, mebibytes: int) -> Path:
    """A zip whose one member is `mebibytes` MiB of zeros (about 1000x compression), streamed."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive, archive.open("zeros.bin", "w") as out:
        for _ in range(mebibytes):
            out.write(ZEROS)
    return path


def tar_of_zeros(path: Path, mebibytes: int) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        info = tarfile.TarInfo("zeros.bin")
        info.size = mebibytes << 20
        archive.addfile(info, io.BytesIO(bytes(info.size)))
    return path


def test_zip_bomb_is_refused_with_the_default_limits(tmp_path):
    """The reported case: a few hundred KB of zip that unpacks to 300 MB."""
    bomb = zip_of_zeros(tmp_path / "bomb.zip", 300)
    assert bomb.stat().st_size < 400_000
    with pytest.raises(ArchiveTooLarge, match=r"(?s)'.*bomb.zip' declares more than 67,108,864 bytes.*"
                                              "LDPBENCH_UNPACK_MAX_BYTES"):
        safe_extract(bomb, tmp_path / "out" / "x")
    assert list((tmp_path / "out").iterdir()) == []  # nothing written, no scratch directory left
    with pytest.raises(ArchiveTooLarge, match="bomb.zip:zeros.bin' declares more than"):
        read_zip_member(bomb, "zeros.bin")


@pytest.mark.parametrize("compress", [gzip.compress, bz2.compress, lzma.compress])
def test_compressed_file_bomb_is_refused_while_streaming(tmp_path, compress):
    """gzip, bz2 and xz have no trustworthy size header: the running count refuses them."""
    path = tmp_path / "zeros.gz"
    path.write_bytes(compress(ZEROS * 4))
    with pytest.raises(ArchiveTooLarge, match="zeros.gz' unpacks to more than 1,048,576 bytes"):
        read_compressed(path, SMALL_LIMITS)
    with pytest.raises(ArchiveTooLarge, match="member.gz' unpacks to more than"):
        decompress(path.read_bytes(), "archive.zip:member.gz", SMALL_LIMITS)
    assert read_compressed(path) == ZEROS * 4  # within the default limits


def test_archive_bombs_are_refused_by_ratio_and_by_total_size(tmp_path):
    for archive in (zip_of_zeros(tmp_path / "z.zip", 4), tar_of_zeros(tmp_path / "t.tar.gz", 4)):
        with pytest.raises(ArchiveTooLarge, match=f"'{archive}' declares more than 1,048,576 bytes"):
            safe_extract(archive, tmp_path / f"{archive.name}.d" / "out", SMALL_LIMITS)
        assert list((tmp_path / f"{archive.name}.d").iterdir()) == []
        extracted = safe_extract(archive, tmp_path / f"{archive.name}.d" / "out")  # default limits
        assert (extracted / "zeros.bin").stat().st_size == 4 << 20
    incompressible = tmp_path / "random.zip"
    with zipfile.ZipFile(incompressible, "w", zipfile.ZIP_DEFLATED) as handle:
        handle.writestr("a.bin", RNG.bytes(3 << 20))
    with pytest.raises(ArchiveTooLarge, match="declares more than 2,097,152 bytes"):
        safe_extract(incompressible, tmp_path / "out2", UnpackLimits(max_bytes=2 << 20))
    with pytest.raises(ArchiveTooLarge, match="a.bin' declares more than 2,097,152 bytes"):
        read_zip_member(incompressible, "a.bin", UnpackLimits(max_bytes=2 << 20))


def test_unpack_limits_come_from_the_environment(tmp_path, monkeypatch):
    from ldpbench.data import tabular

    kdd = tmp_path / "kddcup.data_10_percent.gz"
    kdd.write_bytes(gzip.compress(b"0,tcp,http,SF,1\n" * 200_000))  # 3.2 MB of CSV
    monkeypatch.setenv("LDPBENCH_UNPACK_MAX_BYTES", "1000000")
    with pytest.raises(ArchiveTooLarge, match="kddcup.data_10_percent.gz' unpacks to more than 1,000,000"):
        tabular.prepare_kdd({kdd.name: kdd}, check_counts=False)  # through pandas, still bounded
    monkeypatch.setenv("LDPBENCH_UNPACK_MAX_RATIO", "lots")
    with pytest.raises(ConfigError, match="LDPBENCH_UNPACK_MAX_RATIO='lots': expected a positive number"):
        read_compressed(kdd)


# ------------------------------------------------------------------------------ the loader
def test_load_arrays_reads_tabular_datasets_too(tmp_path):
    registry.get("syn-S-0.01-0.9").prepare(tmp_path / "syn", tmp_path / "raw")
    arrays = load_arrays(tmp_path / "syn")
    features, labels, meta = load_prepared(tmp_path / "syn")
    assert np.array_equal(arrays.features, features) and np.array_equal(arrays.labels, labels)
    assert arrays.clients is None and arrays.official_test is None and arrays.meta["d"] == 20


def test_load_arrays_checks_files_against_metadata(tmp_path):
    site = tmp_path / "m" / "mnist"
    site.mkdir(parents=True)
    write_idx_pair(site, "t10k", 3)
    entry = tiny(registry.get("mnist-t10k"), site, "http://127.0.0.1:9",
                 splits={"test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz", 3)})
    entry.prepare(tmp_path / "prep", tmp_path / "raw", mirror=tmp_path / "m")
    in_memory = load_arrays(tmp_path / "prep", mmap=False)
    assert not isinstance(in_memory.features, np.memmap)
    np.save(tmp_path / "prep" / "labels.npy", np.zeros(2, dtype=np.int64))
    with pytest.raises(DatasetCorrupt, match="labels.npy' holds .* bytes"):
        load_arrays(tmp_path / "prep")
    with pytest.raises(DatasetUnavailable, match="meta.json"):
        load_arrays(tmp_path / "prep")


# --------------------------------------------------------------------- prepared-data integrity
def array_fixture(directory: Path) -> Path:
    """A small array-format dataset with every optional file (clients, official_test)."""
    rng = np.random.default_rng(1)
    save_arrays(ArrayDataset(rng.integers(0, 256, size=(40, 6, 6), dtype=np.uint8),
                             rng.integers(0, 3, size=40), ("a", "b", "c"), "image",
                             clients=np.arange(40) % 4, official_test=np.arange(40) >= 30),
                directory, "fixture")
    return directory


def flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-7])


def invert_labels(path: Path) -> None:
    np.save(path, 2 - np.load(path))  # same size and shape, other labels


@pytest.mark.parametrize("file_name, damage", [
    ("features.npy", flip_last_byte), ("features.npy", truncate), ("labels.npy", invert_labels),
    ("labels.npy", flip_last_byte), ("clients.npy", flip_last_byte), ("official_test.npy", truncate),
])
def test_damaged_array_file_is_refused_by_name_and_prepared_again(tmp_path, file_name, damage):
    from ldpbench.runner import load

    directory = array_fixture(tmp_path / "prep")
    load(directory)  # verified once: the per-process digest cache must not hide later damage
    before = (directory / file_name).stat()
    damage(directory / file_name)
    # File systems stamp mtimes coarsely (a few ms): make sure the damage is stamped later.
    os.utime(directory / file_name, ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))
    with pytest.raises(DatasetCorrupt, match=f"'{directory / file_name}'") as info:
        load(directory)
    # meta.json, the file the workflow tracks, is moved aside: the next run prepares it again.
    assert "next `snakemake` run rebuilds" in str(info.value)
    assert not (directory / "meta.json").exists() and (directory / "meta.json.damaged").exists()
    array_fixture(directory)
    assert load(directory).labels.shape == (40,)


@pytest.mark.parametrize("damage", [flip_last_byte, truncate, "invert labels"])
def test_damaged_parquet_is_refused_by_name_and_prepared_again(tmp_path, damage):
    import pandas as pd

    from ldpbench.cli import main

    directory = tmp_path / "syn"
    prepare = ["prepare", "syn-S-0.01-0.9", "--out", str(directory), "--raw-dir", str(tmp_path / "raw")]
    assert main(prepare) == 0
    parquet = directory / "data.parquet"
    if damage == "invert labels":
        frame = pd.read_parquet(parquet)
        frame["label"] = 1 - frame["label"]
        frame.to_parquet(parquet, index=False)
    else:
        damage(parquet)
    with pytest.raises(DatasetCorrupt, match=f"'{parquet}'"):
        load_arrays(directory)
    assert not (directory / "meta.json").exists()
    assert main(prepare) == 0  # what the prepare_dataset rule runs once its meta.json is missing
    assert load_arrays(directory).features.shape[0] == json.loads((directory / "meta.json").read_text())["n"]


def test_meta_json_listing_fewer_classes_than_the_labels_use_is_refused(tmp_path):
    """meta.json holds the digests, so none covers it: its classes are checked against the labels."""
    directory = array_fixture(tmp_path / "prep")
    meta = json.loads((directory / "meta.json").read_text())
    (directory / "meta.json").write_text(json.dumps({**meta, "classes": ["a", "b"]}))
    with pytest.raises(DatasetCorrupt, match=r"labels.npy' has labels in \[0, 2\], '.*' lists 2 classes"):
        load_arrays(directory)
    assert (directory / "meta.json.damaged").exists()


def test_stray_unlisted_file_is_not_read(tmp_path):
    directory = tmp_path / "prep"
    save_arrays(ArrayDataset(np.zeros((4, 2, 2), dtype=np.uint8), np.arange(4) % 2, ("a", "b"), "image"),
                directory, "fixture")
    np.save(directory / "clients.npy", np.arange(4))  # not in meta.json: no digest vouches for it
    assert load_arrays(directory).clients is None


@pytest.mark.parametrize("content, message", [
    ('{"n": 40, "shape": [6, 6], ', "is not valid JSON"),
    ("\xff\xfe", "is not valid JSON"),
    ('["not", "an", "object"]', "is not a JSON object"),
    ('{"format": "arrays", "n": 40, "shape": [6, 6], "classes": ["a"]}', r"lacks the keys \['files'\]"),
])
def test_damaged_meta_json_is_named_and_moved_aside(tmp_path, content, message):
    directory = array_fixture(tmp_path / "prep")
    (directory / "meta.json").write_bytes(content.encode("latin-1"))
    with pytest.raises(DatasetCorrupt, match=message) as info:
        load_arrays(directory)
    assert f"'{directory / 'meta.json'}'" in str(info.value)
    assert not (directory / "meta.json").exists()


# ------------------------------------------------------------------------------- real data
def test_real_mnist_t10k(prepared_from_mirror):
    arrays = load_arrays(prepared_from_mirror("mnist-t10k"))
    assert arrays.features.shape == (10_000, 28, 28) and arrays.meta["counts"] == {"test": 10_000}
    assert arrays.meta["class_counts"] == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


def test_real_ag_news_test(prepared_from_mirror):
    arrays = load_arrays(prepared_from_mirror("ag-news-test"))
    assert arrays.meta["n"] == 7_600 and arrays.meta["class_counts"] == [1900] * 4
    assert decode_texts(arrays.features[:1])[0].startswith("Fears for T N pension after talks")


def test_real_shakespeare_tff(prepared_from_mirror):
    arrays = load_arrays(prepared_from_mirror("shakespeare-tff"))
    assert arrays.meta["counts"] == {"clients": 715, "train_snippets": 16_068, "test_snippets": 2_356,
                                     "train_windows": 28_517, "test_windows": 3_790}
    assert arrays.features.shape == (32_307, 80) and arrays.meta["n_clients"] == 679
