"""The contract every registered dataset meets (ldpbench.data.contract), parametrised over the whole
registry: built-in entries and those of installed plugin packages alike.

Every entry's declaration is checked; the data itself is prepared where that is cheap: the synthetic
sets (no download; syn-L and syn-H with 1,000 records, their dimensions and classes unchanged) and,
when the mirror (LDPBENCH_SHARED_DATASETS) is present, every set whose files it holds. The other sets
(their official files are not at hand) are prepared from small fixture files in test_datasets.py,
which checks them against their declaration too (all but CelebA, whose fixture is smaller).
Each check is also run on a deliberately wrong copy of an entry, which it must refuse.
"""

import functools
from dataclasses import replace

import numpy as np
import pytest

from ldpbench.data import contract, registry
from ldpbench.data.download import RemoteFile
from ldpbench.data.prepared import ArrayDataset
from ldpbench.data.registry import DeclaredMeta, LocalInput

ALL = registry.names()
SELF_CONTAINED = [name for name in ALL if not registry.get(name).files and not registry.get(name).local_inputs]
FROM_FILES = [name for name in ALL if name not in SELF_CONTAINED]
# A synthetic set larger than this is prepared with this many records (its generation takes seconds).
SMALL_RECORDS = 1_000


@pytest.mark.parametrize("check", contract.ENTRY_CHECKS, ids=lambda check: check.__name__)
@pytest.mark.parametrize("name", ALL)
def test_entry(name, check):
    check(registry.get(name))


def small(entry: registry.DatasetEntry) -> registry.DatasetEntry:
    """The synthetic entry with at most SMALL_RECORDS records, everything else as registered."""
    spec = entry.build.keywords["spec"]
    if spec.records <= SMALL_RECORDS:
        return entry
    return replace(entry, build=functools.partial(entry.build.func, spec=replace(spec, records=SMALL_RECORDS)))


@pytest.mark.parametrize("name", SELF_CONTAINED)
def test_a_set_that_needs_no_download_prepares_what_it_declares(name, tmp_path):
    entry = registry.get(name)
    if not isinstance(entry.build, functools.partial) or "spec" not in entry.build.keywords:
        pytest.skip(f"'{name}' is not a synthetic set of ldpbench's (its size cannot be lowered here)")
    small(entry).prepare(tmp_path / "prep", tmp_path / "raw")
    contract.prepared_matches_declared(entry, tmp_path / "prep")


@pytest.mark.parametrize("name", FROM_FILES)
def test_a_set_in_the_mirror_prepares_what_it_declares(name, shared_datasets, prepared_from_mirror, tmp_path):
    entry = registry.get(name)
    if not entry.is_local(tmp_path / "raw", shared_datasets):
        missing = [f.name for f in entry.files if not (shared_datasets / entry.mirror_dir / f.name).exists()]
        pytest.skip(f"'{name}': the mirror lacks {missing or [i.name for i in entry.local_inputs]}; "
                    "only its declaration is checked (test_entry)")
    contract.prepared_matches_declared(entry, prepared_from_mirror(name))


def test_every_kind_of_set_has_an_entry_checked_against_its_data():
    """The declarations are tied to data: tabular, image, text and token sets all have one that the
    tests above (or the fixture tests of test_datasets.py) prepare."""
    kinds = {registry.get(name).meta.kind for name in ALL}
    assert {"tabular", "image", "text", "tokens"} <= kinds


# ------------------------------------------------------------------ power: wrong entries are refused
SYN = registry.get("syn-S-0.1-0.6")
MNIST = registry.get("mnist")
SHAKESPEARE_TFF = registry.get("shakespeare-tff")
GOOD_FILE = MNIST.files[0]


@pytest.mark.parametrize("broken, message", [
    (replace(SYN, name="syn S"), "is not a path part"),
    (replace(SYN, name="../syn"), "is not a path part"),
    (replace(SYN, description=" "), "has no description"),
    (replace(SYN, build=None), "is not callable"),
    (replace(MNIST, mirror_dir=""), "mirror_dir '' is not one directory name"),
    (replace(MNIST, mirror_dir="a/b"), "mirror_dir 'a/b' is not one directory name"),
])
def test_names_and_describes_itself_refuses_a_wrong_entry(broken, message):
    with pytest.raises(contract.ContractViolation, match=message):
        contract.names_and_describes_itself(broken)


@pytest.mark.parametrize("licence", ["", "CC-BY", "CC BY 4", "unknown (someone)", "MIT-ish"])
def test_licence_is_known_refuses_a_missing_or_unknown_licence(licence):
    with pytest.raises(contract.ContractViolation, match="does not start with known terms"):
        contract.licence_is_known(replace(SYN, licence=licence))


@pytest.mark.parametrize("wrong, message", [
    (replace(GOOD_FILE, sha256=GOOD_FILE.sha256.upper()), "is not 64 lower-case hex digits"),
    (replace(GOOD_FILE, sha256=GOOD_FILE.sha256[:-1]), "is not 64 lower-case hex digits"),
    (replace(GOOD_FILE, sha256=None, pin=""), "has no sha256 and no `pin`"),
    (replace(GOOD_FILE, md5="abc"), "md5 'abc' is not 32"),
    (replace(GOOD_FILE, url=""), "is not an http\\(s\\) URL"),
    (replace(GOOD_FILE, url="ftp://example.org/train.gz"), "is not an http\\(s\\) URL"),
    (replace(GOOD_FILE, name="sub/train.gz"), "is not a plain file name"),
    (replace(SHAKESPEARE_TFF.files[0], member=""), "names no `member` path"),
    (replace(SHAKESPEARE_TFF.files[0], url="https://example.org/other.tar.bz2"), "differs from its archive's"),
    (replace(SHAKESPEARE_TFF.files[0], member_of=replace(SHAKESPEARE_TFF.files[0].member_of, sha256="0" * 63)),
     "archive 'shakespeare.tar.bz2': sha256"),
])
def test_files_are_pinned_refuses_a_wrong_file(wrong, message):
    with pytest.raises(contract.ContractViolation, match=message):
        contract.files_are_pinned(replace(MNIST, files=(wrong, *MNIST.files[1:])))


def test_files_are_pinned_refuses_two_files_of_one_name():
    with pytest.raises(contract.ContractViolation, match=r"\['t10k-images-idx3-ubyte.gz'\] are listed twice"):
        contract.files_are_pinned(replace(MNIST, files=(*MNIST.files, MNIST.files[2])))
    with pytest.raises(contract.ContractViolation, match="needs a name and a description"):
        contract.files_are_pinned(replace(SYN, local_inputs=(LocalInput("leaf", ""),)))


def test_files_are_pinned_accepts_an_md5_only_file_that_says_why():
    contract.files_are_pinned(registry.get("celeba"))  # identity_CelebA.txt: md5 and a pin note
    assert any(f.sha256 is None for f in registry.get("celeba").files)


@pytest.mark.parametrize("meta, message", [
    (DeclaredMeta("audio", (20,), ("0", "1"), "binary"), "kind 'audio' is not one of"),
    (DeclaredMeta("tabular", (20, 1), ("0", "1"), "binary"), "has rank 2; a record of kind tabular has rank 1"),
    (DeclaredMeta("image", (784,), ("0", "1"), "multiclass"), "has rank 1; a record of kind image has rank 2 or 3"),
    (DeclaredMeta("text", (80,), ("0", "1"), "multiclass"), "has rank 1; a record of kind text has rank 0"),
    (DeclaredMeta("tabular", (0,), ("0", "1"), "binary"), "is not a tuple of positive ints"),
    (DeclaredMeta("tabular", [20], ("0", "1"), "binary"), "is not a tuple of positive ints"),
    (DeclaredMeta("tabular", (20,), ("0", "1"), "regression"), "task 'regression' is not one of"),
    (DeclaredMeta("tabular", (20,), ("0", "1", "2"), "binary"), "a binary task with 3 classes"),
    (DeclaredMeta("tabular", (20,), ("0",), "multiclass"), "1 class\\(es\\) for a multiclass task"),
    (DeclaredMeta("tabular", (20,), ("0", "0"), "multiclass"), "repeat a name"),
    (DeclaredMeta("tabular", (20,), ("0", ""), "binary"), "not a tuple of non-empty names"),
    (DeclaredMeta("tabular", (20,), ["0", "1"], "binary"), "not a tuple of non-empty names"),
    (DeclaredMeta("tabular", (20,), ("0", "1"), "multilabel"), "a multi-label set cannot be tabular"),
    (DeclaredMeta("tabular", (20,), None, "binary"), "declares no classes"),
])
def test_declares_what_it_holds_refuses_an_inconsistent_declaration(meta, message):
    with pytest.raises(contract.ContractViolation, match=message):
        contract.declares_what_it_holds(replace(SYN, meta=meta))


def prepared(entry, tmp_path):
    entry.prepare(tmp_path / "prep", tmp_path / "raw")
    return tmp_path / "prep"


@pytest.mark.parametrize("meta, message", [
    (DeclaredMeta("tabular", (21,), ("0", "1"), "binary"), r"have shape \(20,\), declared \(21,\)"),
    (DeclaredMeta("tabular", (20,), ("no", "yes"), "binary"), r"lists classes \['0', '1'\], declared"),
    (DeclaredMeta("tabular", (20,), ("0", "1"), "multiclass"), "says task 'binary', declared 'multiclass'"),
    (DeclaredMeta("image", (20,), ("0", "1"), "binary"), "prepared as 'tabular', declared 'image'"),
])
def test_prepared_matches_declared_refuses_a_declaration_the_data_contradicts(meta, message, tmp_path):
    directory = prepared(SYN, tmp_path)
    contract.prepared_matches_declared(SYN, directory)
    with pytest.raises(contract.ContractViolation, match=message):
        contract.prepared_matches_declared(replace(SYN, meta=meta), directory)


def array_entry(features, labels, classes=("a", "b"), task="multiclass", kind="image"):
    def build(_paths):
        return ArrayDataset(features, labels, classes, kind)
    return replace(SYN, name="arrays", build=build, meta=DeclaredMeta(kind, features.shape[1:], classes, task))


@pytest.mark.parametrize("entry, message", [
    (array_entry(np.zeros((4, 2, 2), np.float64), np.array([0, 1, 0, 1])), "features of dtype float64, expected uint8"),
    (array_entry(np.zeros((4, 2, 2), np.uint8), np.array([1, 2, 1, 2])), "does not load.*labels in \\[1, 2\\]"),
    (array_entry(np.zeros((4, 2, 2), np.uint8), np.array([[0, 2], [1, 0], [0, 1], [1, 1]]), task="multilabel"),
     "values other than 0 and 1"),
    (array_entry(np.zeros((4, 2), np.int64), np.array([0, 1, 0, 1]), kind="text"), "text features of dtype int64"),
])
def test_prepared_matches_declared_refuses_data_of_the_wrong_form(entry, message, tmp_path):
    with pytest.raises(contract.ContractViolation, match=message):
        contract.prepared_matches_declared(entry, prepared(entry, tmp_path))


def test_prepared_matches_declared_refuses_a_preparation_of_another_entry(tmp_path):
    directory = prepared(SYN, tmp_path)
    with pytest.raises(contract.ContractViolation, match="meta.json names 'syn-S-0.1-0.6'"):
        contract.prepared_matches_declared(replace(SYN, name="syn-S-other"), directory)
    with pytest.raises(contract.ContractViolation, match="meta.json gives licence 'generated by ldpbench'"):
        contract.prepared_matches_declared(replace(SYN, licence="CC BY 4.0"), directory)
    extra = RemoteFile("x.csv", "https://example.org/x.csv", "0" * 64)
    with pytest.raises(contract.ContractViolation, match=r"records official files \[\], the entry lists \['x.csv'\]"):
        contract.prepared_matches_declared(replace(SYN, files=(extra,)), directory)
