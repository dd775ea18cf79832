"""Fetching official dataset files: local copy, mirror directory or download, checksum-verified.

Resolution order for each file of a dataset:
1. `raw_dir/<dataset dir>/<official name>` if it is already there and its sha256 matches;
2. `mirror/<dataset dir>/<official name>` (a directory laid out like ../shared/datasets), copied;
3. the official URL, only when downloads are allowed.
Every copy or download is written to a temporary file and renamed only after its checksum matched.

Checksums: a file's sha256 is pinned in the registry when it is known with certainty (computed from a
byte-identical official copy, or published by the official source or a well-known loader). Where
the official source publishes only an md5, that md5 is checked instead (integrity against
corruption, not against tampering). A file with neither is "checksum unknown here": it is refused
until the user supplies its sha256 (`data.checksums` in the campaign config, `--sha256` on the CLI).
A file may also be a member of an official archive (`member_of`): it is then taken from a local or
mirrored copy when there is one, or extracted safely from the verified archive.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, replace
from pathlib import Path

from ldpbench.atomic import atomic_path
from ldpbench.errors import ChecksumMismatch, ConfigError, DatasetUnavailable

log = logging.getLogger("ldpbench")

_CHUNK = 1 << 20


@dataclass(frozen=True)
class RemoteFile:
    """One official file of a dataset."""

    name: str  # the official file name, also its name in the mirror and in raw_dir
    url: str
    sha256: str | None  # None: checksum unknown here (the user must supply it)
    md5: str | None = None  # checked only when no sha256 is pinned
    pin: str = ""  # where the pinned checksum comes from
    member_of: RemoteFile | None = None  # the official archive this file is a member of
    member: str = ""  # its path inside that archive

    def with_sha256(self, sha256: str) -> RemoteFile:
        return replace(self, sha256=sha256.lower())

    @property
    def checksum(self) -> str:
        """The pinned checksum as '<algorithm>:<hex>' (for metadata)."""
        if self.sha256:
            return f"sha256:{self.sha256}"
        return f"md5:{self.md5}" if self.md5 else "unknown"


def sha256_of(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def md5_of(path: str | Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _algorithm(remote: RemoteFile) -> tuple[str, str]:
    if remote.sha256:
        return "sha256", remote.sha256
    if remote.md5:
        return "md5", remote.md5
    raise ChecksumUnknown(remote)


def _matches(path: Path, remote: RemoteFile) -> bool:
    algorithm, expected = _algorithm(remote)
    return (sha256_of(path) if algorithm == "sha256" else md5_of(path)) == expected


def _verify(path: Path, remote: RemoteFile, origin: str) -> None:
    algorithm, expected = _algorithm(remote)
    actual = sha256_of(path) if algorithm == "sha256" else md5_of(path)
    if actual != expected:
        raise ChecksumMismatch(
            f"checksum mismatch for {origin}: expected {algorithm} {expected}, got {actual}"
        )


class ChecksumUnknown(ConfigError):
    """No checksum is pinned for a file and the user supplied none: it is refused."""

    def __init__(self, remote: RemoteFile, key: str | None = None) -> None:
        key = key or remote.name
        super().__init__(
            f"no checksum is pinned for '{key}' (checksum unknown here{': ' + remote.pin if remote.pin else ''}); "
            f"ldpbench refuses to use an unverified file. Compute the sha256 of a copy you trust "
            f"(from {remote.url}) and give it in the campaign config as data.checksums: "
            f"{{'{key}': '<sha256>'}}, or to `ldpbench prepare` as --sha256 {key}=<sha256>."
        )


def _copy_verified(source: Path, target: Path, remote: RemoteFile) -> None:
    with atomic_path(target) as tmp:
        shutil.copyfile(source, tmp)
        _verify(tmp, remote, f"'{source}'")


def _download_verified(remote: RemoteFile, target: Path, timeout: float) -> None:
    """Download into a temporary file beside `target`, verify it, rename it: no unverified file is used.

    Its progress (MB, time left, when the server says the size) goes to the console and to the job's
    record (ldpbench.progress); the job's log gets the one line at the end."""
    from ldpbench import progress

    started = time.perf_counter()
    with atomic_path(target) as tmp:
        with urllib.request.urlopen(remote.url, timeout=timeout) as response, open(tmp, "wb") as out:
            total = int(response.headers.get("Content-Length") or 0)
            unit, scale = ("MB", 2**20) if total >= 10 * 2**20 else ("kB", 2**10)
            done = 0
            while chunk := response.read(_CHUNK):
                out.write(chunk)
                done += len(chunk)
                if total:
                    progress.report(done / scale, total / scale, f"{unit} of {remote.name}")
        size = tmp.stat().st_size
        _verify(tmp, remote, f"'{target.name}' downloaded from {remote.url}")
    log.info("downloaded %s (%.1f MB in %.1f s) from %s, checksum verified", remote.name, size / 2**20,
             time.perf_counter() - started, remote.url)


def _extract_member(remote: RemoteFile, archive: Path, target: Path) -> None:
    """Extract `remote.member` of `archive` safely (temporary directory), verify it, move it."""
    from ldpbench.data.archive import safe_extract

    with tempfile.TemporaryDirectory(prefix=".extract-", dir=target.parent) as scratch:
        root = safe_extract(archive, Path(scratch) / "x")
        extracted = root / remote.member
        if not extracted.is_file():
            raise DatasetUnavailable(
                f"archive '{archive}' has no member '{remote.member}' (needed for '{remote.name}')"
            )
        _copy_verified(extracted, target, remote)


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
    if not (remote.sha256 or remote.md5):  # refused before anything is read or written
        raise ChecksumUnknown(remote, f"{dataset_dir}/{remote.name}")
    target = Path(raw_dir) / dataset_dir / remote.name
    if target.exists():
        if _matches(target, remote):
            return target
        # A stale or corrupted local copy is replaced, never used.
        target.unlink()
    if mirror is not None:
        mirrored = Path(mirror) / dataset_dir / remote.name
        if mirrored.exists():
            _copy_verified(mirrored, target, remote)
            return target
    if remote.member_of is not None:
        archive = fetch_file(remote.member_of, dataset_dir, raw_dir, mirror, allow_download,
                             retries, timeout)
        _extract_member(remote, archive, target)
        return target
    if not allow_download:
        mirror_hint = (
            f"the mirror '{mirror}' has no '{dataset_dir}/{remote.name}'"
            if mirror is not None
            else "no mirror is configured (config key data.mirror)"
        )
        raise DatasetUnavailable(
            f"dataset file '{remote.name}' is missing: expected at '{target}' "
            f"({remote.checksum}); {mirror_hint} and downloads are disabled "
            f"(data.allow_download: false). Provide it by copying the official file from "
            f"{remote.url} to '{target}', by setting data.mirror to a directory holding "
            f"'{dataset_dir}/{remote.name}', or by setting data.allow_download: true on a "
            f"machine with network access."
        )
    last_error: Exception | None = None
    for attempt in range(retries + 1):
        try:
            _download_verified(remote, target, timeout)
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
    if mirror is not None and (Path(mirror) / dataset_dir / remote.name).exists():
        return True
    return remote.member_of is not None and locally_available(remote.member_of, dataset_dir,
                                                              raw_dir, mirror)
