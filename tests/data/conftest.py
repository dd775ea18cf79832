from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def prepared_from_mirror(shared_datasets, tmp_path_factory) -> Callable[[str], Path]:
    """name -> that dataset prepared from the mirror, once per session: the real-data tests and the
    dataset contract read the same directory (they only read it) instead of preparing it each."""
    from ldpbench.data import registry

    directories: dict[str, Path] = {}

    def prepare(name: str) -> Path:
        if name not in directories:
            base = tmp_path_factory.mktemp(f"mirror-{name}")
            registry.get(name).prepare(base / "prep", base / "raw", mirror=shared_datasets)
            directories[name] = base / "prep"
        return directories[name]

    return prepare
