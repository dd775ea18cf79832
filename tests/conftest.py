import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

REPO = Path(__file__).resolve().parents[1]
# The mirror next to the checkout; LDPBENCH_SHARED_DATASETS points elsewhere (e.g. from a worktree).
SHARED_DATASETS = Path(os.environ.get("LDPBENCH_SHARED_DATASETS",
                                      REPO.parent / "shared" / "datasets")).resolve()


SEEDS_BEFORE = pytest.StashKey[set]()


def pytest_sessionstart(session):
    from ldpbench.launch import fork_server

    session.config.stash[SEEDS_BEFORE] = set(fork_server.living_seeds())


def pytest_ignore_collect(collection_path, config):
    """`pytest -m slow` imports only the test modules that mark a test slow (`pytest.mark.slow`, on a test
    or as the module's `pytestmark`): each xdist worker would import the others, most of the suite, only to
    deselect every test in them."""
    if (config.getoption("markexpr") == "slow" and collection_path.suffix == ".py"
            and collection_path.name.startswith("test_")
            and "mark.slow" not in collection_path.read_text(encoding="utf-8")):
        return True
    return None


# The slow modules that take longest, longest first. `.ci/run` hands whole modules to the xdist workers in
# collection order (--dist loadscope --no-loadscope-reorder): these go first, so that the modules left
# for last, when one worker may run alone, are short ones. Out of date, it costs time, not correctness.
LONGEST_SLOW_MODULES = ("workflow/test_edits.py", "workflow/test_edits_default.py", "results/test_tracking.py",
                        "workflow/test_cluster.py", "workflow/test_faults.py", "results/test_tracking_scale.py",
                        "workflow/test_status_workflow.py")


def pytest_collection_modifyitems(config, items):
    if config.getoption("markexpr") != "slow":
        return
    first = {REPO / "tests" / module: rank for rank, module in enumerate(LONGEST_SLOW_MODULES)}
    items.sort(key=lambda item: first.get(item.path, len(first)))  # stable: file order otherwise


def pytest_sessionfinish(session):
    """The warm seeds the session's campaigns left (worker.linger_seconds) end with it, not minutes later;
    by the xdist controller, once every worker is done (a worker of its own would stop the others')."""
    from ldpbench.launch import fork_server

    if not hasattr(session.config, "workerinput"):
        fork_server.stop_seeds(keep=session.config.stash.get(SEEDS_BEFORE, set()))


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def shared_datasets() -> Path:
    if not (SHARED_DATASETS / "adult" / "adult.data").exists():
        pytest.skip(f"real-data test: the dataset mirror {SHARED_DATASETS} is not present")
    return SHARED_DATASETS


@pytest.fixture(scope="session")
def syn_s(tmp_path_factory) -> Path:
    """The small FedSel synthetic set (d = 20, 5,000 records), prepared once per session."""
    from ldpbench.data import registry

    directory = tmp_path_factory.mktemp("syn-S")
    registry.get("syn-S-0.1-0.9").prepare(directory, directory / "raw")
    return directory
