"""Data registry: download, checksums, mirror, preparation of the tabular and synthetic sets."""

import hashlib
import json

import numpy as np
import pytest

from ldpbench.data import adult, registry
from ldpbench.data.download import RemoteFile, fetch_file
from ldpbench.data.prepared import load_prepared
from ldpbench.data.registry import DatasetEntry
from ldpbench.data.split import train_test_indices
from ldpbench.data.synthetic import SyntheticSpec, generate
from ldpbench.errors import ChecksumMismatch, ConfigError, DatasetUnavailable

from http_fixture import serve_directory

PAYLOAD = b"official bytes\n" * 100
DIGEST = hashlib.sha256(PAYLOAD).hexdigest()


@pytest.fixture
def served(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "file.csv").write_bytes(PAYLOAD)
    (site / "corrupt.csv").write_bytes(PAYLOAD[:-5])
    with serve_directory(site) as url:
        yield url


def leftovers(directory):
    return [p.name for p in directory.rglob("*") if p.name.endswith(".tmp")]


def test_download_verifies_checksum_and_writes_atomically(served, tmp_path):
    raw = tmp_path / "raw"
    path = fetch_file(RemoteFile("file.csv", f"{served}/file.csv", DIGEST), "ds", raw,
                      allow_download=True)
    assert path == raw / "ds" / "file.csv" and path.read_bytes() == PAYLOAD
    assert leftovers(raw) == []


def test_a_download_shows_its_progress_on_the_console_and_in_its_record_and_one_line_in_a_log(
        served, tmp_path, monkeypatch, capsys, caplog):
    import json

    from ldpbench import progress

    # The prepare job of a workflow: its record in the campaign's progress directory, its console line.
    monkeypatch.setenv(progress.PROGRESS_ENV, str(tmp_path / "progress"))
    job = progress.job_starts("prepare", "ds")
    with caplog.at_level("INFO", logger="ldpbench"):
        fetch_file(RemoteFile("file.csv", f"{served}/file.csv", DIGEST), "ds", tmp_path / "raw", allow_download=True)
    out = capsys.readouterr().out
    assert "ldpbench prepare ds: 100 % (1 of 1 kB of file.csv)" in out  # the size from Content-Length
    assert json.loads(job.path.read_text())["progress"]["unit"] == "kB of file.csv"
    assert "downloaded file.csv (0.0 MB in" in caplog.text and "checksum verified" in caplog.text


def test_corrupted_download_names_file_and_both_digests(served, tmp_path):
    raw = tmp_path / "raw"
    remote = RemoteFile("corrupt.csv", f"{served}/corrupt.csv", DIGEST)
    with pytest.raises(ChecksumMismatch) as info:
        fetch_file(remote, "ds", raw, allow_download=True, retries=1)
    message = str(info.value)
    assert "corrupt.csv" in message and DIGEST in message
    assert hashlib.sha256(PAYLOAD[:-5]).hexdigest() in message
    assert not (raw / "ds" / "corrupt.csv").exists() and leftovers(raw) == []


def test_unreachable_url_gives_a_clear_error(tmp_path):
    remote = RemoteFile("file.csv", "http://127.0.0.1:9/none/file.csv", DIGEST)
    with pytest.raises(DatasetUnavailable, match="could not download dataset file 'file.csv'"):
        fetch_file(remote, "ds", tmp_path, allow_download=True, retries=0, timeout=2)


def test_missing_file_without_mirror_or_network_says_how_to_provide_it(tmp_path):
    remote = RemoteFile("adult.data", "https://example.invalid/adult.data", DIGEST)
    with pytest.raises(DatasetUnavailable) as info:
        fetch_file(remote, "adult", tmp_path / "raw")
    message = str(info.value)
    assert "'adult.data' is missing" in message
    assert "data.mirror" in message and "data.allow_download" in message
    assert "https://example.invalid/adult.data" in message


def test_mirror_copy_is_verified(tmp_path):
    mirror = tmp_path / "mirror"
    (mirror / "ds").mkdir(parents=True)
    (mirror / "ds" / "file.csv").write_bytes(PAYLOAD)
    remote = RemoteFile("file.csv", "https://example.invalid/file.csv", DIGEST)
    path = fetch_file(remote, "ds", tmp_path / "raw", mirror=mirror)
    assert path.read_bytes() == PAYLOAD

    (mirror / "ds" / "file.csv").write_bytes(b"tampered")
    path.unlink()
    with pytest.raises(ChecksumMismatch, match="expected sha256"):
        fetch_file(remote, "ds", tmp_path / "raw", mirror=mirror)
    assert not path.exists() and leftovers(tmp_path / "raw") == []


def test_corrupted_local_copy_is_replaced(tmp_path):
    mirror = tmp_path / "mirror"
    (mirror / "ds").mkdir(parents=True)
    (mirror / "ds" / "file.csv").write_bytes(PAYLOAD)
    target = tmp_path / "raw" / "ds" / "file.csv"
    target.parent.mkdir(parents=True)
    target.write_bytes(b"truncated")
    fetch_file(RemoteFile("file.csv", "https://example.invalid/f", DIGEST), "ds", tmp_path / "raw", mirror)
    assert target.read_bytes() == PAYLOAD


def test_unknown_dataset_lists_registered_names():
    with pytest.raises(ConfigError, match="unknown dataset 'mnistt'.*syn-L-0.01-0.9"):
        registry.get("mnistt")


# --------------------------------------------------------------------------------- synthetic
def test_synthetic_generator_is_deterministic_and_skewed():
    spec = SyntheticSpec(dims=50, records=20_000, c1=0.01, c2=0.9, seed=3)
    first, second = generate(spec), generate(spec)
    assert np.array_equal(first.features, second.features)
    assert np.array_equal(first.labels, second.labels)
    assert first.features.shape == (20_000, 50) and first.features.dtype == np.float32
    skewed = first.info["generator"]["skewed_dims"]
    assert len(skewed) == 45
    stds = first.features.std(axis=0)
    plain = np.setdiff1d(np.arange(50), skewed)
    assert np.allclose(stds[skewed], 0.01, rtol=0.05) and np.allclose(stds[plain], 1.0, rtol=0.05)
    assert 0.2 < first.labels.mean() < 0.8
    assert not np.array_equal(generate(SyntheticSpec(50, 20_000, 0.01, 0.9, seed=4)).features, first.features)


def test_synthetic_registry_entries_have_the_paper_sizes(tmp_path):
    for name, (d, n) in {"syn-L-0.01-0.9": (100, 60_000), "syn-H-0.1-0.6": (300, 100_000)}.items():
        entry = registry.get(name)
        assert f"d={d}" in entry.description and f"N={n}" in entry.description
    registry.get("syn-S-0.1-0.6").prepare(tmp_path / "syn", tmp_path / "raw")
    features, labels, meta = load_prepared(tmp_path / "syn")
    assert features.shape == (5_000, 20) and meta["n"] == 5_000 and meta["d"] == 20
    assert meta["classes"] == ["0", "1"] and len(meta["feature_names"]) == 20
    assert meta["generator"]["c1"] == 0.1


def test_splits_partition_the_records():
    train, test = train_test_indices(1000, seed=1, test_fraction=0.2)
    assert len(test) == 200 and np.intersect1d(train, test).size == 0
    folds = [train_test_indices(1000, seed=1, folds=5, fold=f)[1] for f in range(5)]
    assert np.array_equal(np.sort(np.concatenate(folds)), np.arange(1000))
    assert not np.array_equal(train_test_indices(1000, seed=2)[1], test)


def test_a_split_digest_names_its_records_of_its_data_whatever_their_order():
    import hashlib

    from ldpbench.data.split import split_digest

    data = {"data.parquet": "ab" * 32}
    expected = hashlib.sha256(b'{"data.parquet": "' + b"ab" * 32 + b'"}' + np.array([1, 5, 9], "<i8").tobytes())
    assert split_digest(data, np.array([9, 1, 5])) == expected.hexdigest()[:16]
    assert split_digest(data, np.array([1, 5, 9], dtype=np.int32)) == expected.hexdigest()[:16]
    assert split_digest(data, np.array([1, 5, 8])) != expected.hexdigest()[:16]  # one record differs
    assert split_digest({"data.parquet": "cd" * 32}, np.array([1, 5, 9])) != expected.hexdigest()[:16]  # other data
    assert split_digest(data, np.array([], dtype=np.int64)) is None


# --------------------------------------------------------------------------------- adult
ADULT_ROWS = [
    "39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical, Not-in-family, White, Male, 2174, 0, 40, United-States, <=50K",  # noqa: E501 (a data row as the file has it)
    "50, Self-emp-not-inc, 83311, Bachelors, 13, Married-civ-spouse, Exec-managerial, Husband, White, Male, 0, 0, 13, United-States, >50K",  # noqa: E501 (a data row as the file has it)
    "38, ?, 215646, HS-grad, 9, Divorced, ?, Not-in-family, White, Female, 0, 0, 40, ?, <=50K",
]


def test_adult_encoding_from_fixture_files(tmp_path, served):
    """Real download + preparation code, against fixture files served on 127.0.0.1."""
    site = tmp_path / "adult_site"
    site.mkdir()
    (site / "adult.data").write_text("\n".join(ADULT_ROWS * 4) + "\n")
    (site / "adult.test").write_text("|1x3 Cross validator\n" + "\n".join(r + "." for r in ADULT_ROWS) + "\n\n")
    with serve_directory(site) as url:
        entry = DatasetEntry(
            name="adult-fixture", description="fixture", licence="test", mirror_dir="adult",
            files=tuple(RemoteFile(n, f"{url}/{n}", hashlib.sha256((site / n).read_bytes()).hexdigest())
                        for n in ("adult.data", "adult.test")),
            build=lambda paths: adult.prepare(paths, check_counts=False),
            meta=registry.get("adult").meta,
        )
        entry.prepare(tmp_path / "prepared", tmp_path / "raw", allow_download=True)
    features, labels, meta = load_prepared(tmp_path / "prepared")
    assert features.shape == (15, 123) and meta["d"] == 123
    assert labels.tolist() == [0, 1, 0] * 5
    names = meta["feature_names"]
    row = dict(zip(names, features[0]))
    assert row["workclass=State-gov"] == 1 and row["capital-gain=nonzero"] == 1
    assert row["native-country=United-States"] == 1
    # The missing workclass/occupation/country of row 3 set no bit of those attributes.
    third = dict(zip(names, features[2]))
    assert sum(v for k, v in third.items() if k.startswith(("workclass=", "occupation=", "native-country="))) == 0
    assert json.loads((tmp_path / "prepared" / "meta.json").read_text())["raw_files"][0]["name"] == "adult.data"


def test_adult_from_the_real_mirror(prepared_from_mirror):
    features, labels, meta = load_prepared(prepared_from_mirror("adult"))
    assert features.shape == (48_842, 123)
    assert meta["class_counts"] == [37_155, 11_687]
    # Every record has exactly one bit per attribute, less one for each missing value.
    assert features.sum(axis=1).max() == 14 and features.sum(axis=1).min() >= 11
    assert set(np.unique(features)) == {0.0, 1.0}


# --------------------------------------------------------------------------------- bank, kdd99
def test_bank_and_kdd_from_the_real_mirror(prepared_from_mirror):
    features, labels, meta = load_prepared(prepared_from_mirror("bank"))
    assert features.shape == (45_211, 32) and meta["class_counts"] == [39_922, 5_289]
    assert features.min() >= 0 and features.max() <= 1
    features, labels, meta = load_prepared(prepared_from_mirror("kdd99"))
    assert features.shape == (70_000, 113) and meta["sample"] == {"records": 70_000, "seed": 0, "of": 494_021}
    assert "num_outbound_cmds" not in meta["feature_names"]
    assert features.min() >= 0 and features.max() <= 1


def test_bank_zip_is_read_without_extraction(tmp_path, served):
    import io
    import zipfile

    from ldpbench.data import tabular

    header = '"age";"job";"marital";"education";"default";"balance";"housing";"loan";"contact";"day";"month";"duration";"campaign";"pdays";"previous";"poutcome";"y"'  # noqa: E501 (a data row as the file has it)
    rows = ['58;"management";"married";"tertiary";"no";2143;"yes";"no";"unknown";5;"may";261;1;-1;0;"unknown";"no"',
            '30;"student";"single";"unknown";"no";-20;"no";"yes";"cellular";9;"jun";100;2;5;1;"success";"yes"']
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("bank-full.csv", "\n".join([header, *rows]) + "\n")
        archive.writestr("../escape.txt", "never extracted")
    (tmp_path / "bank.zip").write_bytes(buffer.getvalue())
    dataset = tabular.prepare_bank({"bank.zip": tmp_path / "bank.zip"}, check_counts=False)
    assert dataset.features.shape == (2, 32) and dataset.labels.tolist() == [0, 1]
    assert not (tmp_path.parent / "escape.txt").exists()
    row = dict(zip(dataset.feature_names, dataset.features[1]))
    assert row["job=student"] == 1 and row["education=unknown"] == 1 and row["balance"] == 0.0
