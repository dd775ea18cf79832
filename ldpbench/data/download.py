"""Fetching official dataset files: local copy, mirror directory or download, checksum-verified.

Resolution order for each file of a dataset:
1. `raw_dir/<dataset dir>/<official name>` if it is already there and its sha256 matches;
2. `mirror/<dataset dir>/<official name>` (a directory laid out like ../shared/datasets), copied;
3. the official URL, only when downloads are allowed.
Every copy or download is written to a temporary file and renamed only after its sha256 matched.
"""

from __future__ import annotations

import hashlib
import shutil
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ldpbench.atomic import atomic_path
from ldpbench.errors import ChecksumMismatch, DatasetUnavailable

_CHUNK = 1 << 20


@dataclass(frozen=True)
class RemoteFile:
    """One official file of a dataset."""

    name: str  # the official file name, also its name in the mirror and in raw_dir
    url: str
    sha256: str


def sha256_of(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _verify(path: Path, expected: str, origin: str) -> None:
    actual = sha256_of(path)
    if actual != expected:
        raise ChecksumMismatch(
            f"checksum mismatch for {origin}: expected sha256 {expected}, got {actual}"
        )


def _copy_verified(source: Path, target: Path, expected: str) -> None:
    with atomic_path(target) as tmp:
        shutil.copyfile(source, tmp)
        _verify(tmp, expected, f"'{source}'")


def _download_verified(url: str, target: Path, expected: str, timeout: float) -> None:
    with atomic_path(target) as tmp:
        digest = hashlib.sha256()
        with urllib.request.urlopen(url, timeout=timeout) as response, open(tmp, "wb") as out:
            while chunk := response.read(_CHUNK):
                digest.update(chunk)
                out.write(chunk)
        actual = digest.hexdigest()
        if actual != expected:
            raise ChecksumMismatch(
                f"checksum mismatch for '{target.name}' downloaded from {url}: "
                f"expected sha256 {expected}, got {actual}"
            )


def fetch_file(
    remote: RemoteFile,
    dataset_dir: str,
    raw_dir: str | Path,
    mirror: str | Path | None = None,
    allow_download: bool = False,
    retries: int = 2,
    timeout: float = 60.0,
) -> Path:
    """Return a verified local path of `remote`, fetching it if needed (see module docstring)."""
    target = Path(raw_dir) / dataset_dir / remote.name
    if target.exists():
        if sha256_of(target) == remote.sha256:
            return target
        # A stale or corrupted local copy is replaced, never used.
        target.unlink()
    if mirror is not None:
        mirrored = Path(mirror) / dataset_dir / remote.name
        if mirrored.exists():
            _copy_verified(mirrored, target, remote.sha256)
            return target
    if not allow_download:
        mirror_hint = (
            f"the mirror '{mirror}' has no '{dataset_dir}/{remote.name}'"
            if mirror is not None
            else "no mirror is configured (config key data.mirror)"
        )
        raise DatasetUnavailable(
            f"dataset file '{remote.name}' is missing: expected at '{target}' "
            f"(sha256 {remote.sha256}); {mirror_hint} and downloads are disabled "
            f"(data.allow_download: false). Provide it by copying the official file from "
            f"{remote.url} to '{target}', by setting data.mirror to a directory holding "
            f"'{dataset_dir}/{remote.name}', or by setting data.allow_download: true on a "
            f"machine with network access."
        )
    last_error: Exception | None = None
    for attempt in range(retries + 1):
        try:
            _download_verified(remote.url, target, remote.sha256, timeout)
            return target
        except (urllib.error.URLError, OSError, ChecksumMismatch) as error:
            last_error = error
            if attempt < retries:
                time.sleep(min(2.0**attempt, 10.0))
    if isinstance(last_error, ChecksumMismatch):
        raise last_error
    raise DatasetUnavailable(
        f"could not download dataset file '{remote.name}' from {remote.url} after "
        f"{retries + 1} attempts: {last_error}"
    ) from last_error


def locally_available(
    remote: RemoteFile, dataset_dir: str, raw_dir: str | Path, mirror: str | Path | None
) -> bool:
    """Cheap existence check (no hashing) used to decide whether an optional dataset can run."""
    if (Path(raw_dir) / dataset_dir / remote.name).exists():
        return True
    return mirror is not None and (Path(mirror) / dataset_dir / remote.name).exists()
