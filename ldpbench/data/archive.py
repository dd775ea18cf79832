"""Safe reading and extraction of the archives official dataset files come in (zip, tar.*, gz).

Every member name is checked before anything is written: absolute paths, drive letters, `..`
components and backslash tricks are refused, and so are links of every kind (symbolic and hard),
devices and FIFOs, because a link is the usual way to make a later member escape the target.
Extraction goes to a temporary directory next to the target and is renamed onto it only when the
whole archive extracted cleanly. A truncated or corrupted archive raises DatasetCorrupt naming it.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
import shutil
import stat
import tarfile
import tempfile
import zipfile
import zlib
from pathlib import Path, PurePosixPath

from ldpbench.errors import DatasetCorrupt, UnsafeArchive

_CORRUPTION = (zipfile.BadZipFile, tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile,
               lzma.LZMAError, OSError)


def check_member_name(name: str, archive: str | Path) -> PurePosixPath:
    """The member's relative path, or UnsafeArchive if it could land outside the target."""
    if not name or "\x00" in name:
        raise UnsafeArchive(f"archive '{archive}' has a member with an empty or NUL name")
    if "\\" in name:
        raise UnsafeArchive(f"archive '{archive}': member '{name}' contains a backslash")
    path = PurePosixPath(name)
    if path.is_absolute() or (len(name) > 1 and name[1] == ":"):
        raise UnsafeArchive(f"archive '{archive}': member '{name}' has an absolute path")
    if ".." in path.parts:
        raise UnsafeArchive(f"archive '{archive}': member '{name}' contains '..'")
    return path


def _zip_is_link(info: zipfile.ZipInfo) -> bool:
    mode = info.external_attr >> 16
    return stat.S_ISLNK(mode)


def _check_zip(handle: zipfile.ZipFile, archive: Path) -> list[zipfile.ZipInfo]:
    members = handle.infolist()
    for info in members:
        check_member_name(info.filename, archive)
        if _zip_is_link(info):
            raise UnsafeArchive(f"archive '{archive}': member '{info.filename}' is a symbolic link")
    return members


def _check_tar(handle: tarfile.TarFile, archive: Path) -> list[tarfile.TarInfo]:
    members = handle.getmembers()
    for info in members:
        check_member_name(info.name, archive)
        if info.issym() or info.islnk():
            raise UnsafeArchive(
                f"archive '{archive}': member '{info.name}' is a link (to '{info.linkname}'); "
                "links are refused"
            )
        if not (info.isfile() or info.isdir()):
            raise UnsafeArchive(f"archive '{archive}': member '{info.name}' is not a regular file")
    return members


def safe_extract(archive: str | Path, target: str | Path) -> Path:
    """Extract a zip or tar(.gz/.bz2/.xz) archive into `target` (replaced if present); return it."""
    archive, target = Path(archive), Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        try:
            if zipfile.is_zipfile(archive):
                with zipfile.ZipFile(archive) as handle:
                    members = _check_zip(handle, archive)
                    for info in members:
                        handle.extract(info, scratch)
            elif tarfile.is_tarfile(archive):
                with tarfile.open(archive) as handle:
                    members = _check_tar(handle, archive)
                    for info in members:
                        # Our checks above already refuse what the 'data' filter refuses.
                        handle.extract(info, scratch, set_attrs=False, filter="data")
            else:
                raise DatasetCorrupt(f"'{archive}' is neither a zip nor a tar archive (or it is truncated)")
        except (UnsafeArchive, DatasetCorrupt):
            raise
        except _CORRUPTION as error:
            raise DatasetCorrupt(f"archive '{archive}' is corrupted or truncated: {error}") from error
        # Defence in depth: nothing may have landed outside the scratch directory.
        root = scratch.resolve()
        for path in scratch.rglob("*"):
            if path.is_symlink() or not path.resolve().is_relative_to(root):
                raise UnsafeArchive(f"archive '{archive}': '{path.name}' escaped the target")
        if target.exists():
            shutil.rmtree(target)
        os.replace(scratch, target)
        return target
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise


def read_zip_member(archive: str | Path, member: str) -> bytes:
    """The bytes of one member of a zip archive (nothing is written to disk)."""
    archive = Path(archive)
    check_member_name(member, archive)
    try:
        with zipfile.ZipFile(archive) as handle:
            try:
                info = handle.getinfo(member)
            except KeyError:
                raise DatasetCorrupt(f"archive '{archive}' has no member '{member}'") from None
            if _zip_is_link(info):
                raise UnsafeArchive(f"archive '{archive}': member '{member}' is a symbolic link")
            return handle.read(info)
    except (UnsafeArchive, DatasetCorrupt):
        raise
    except _CORRUPTION as error:
        raise DatasetCorrupt(f"archive '{archive}' (member '{member}') is corrupted or truncated: "
                             f"{error}") from error


def decompress(data: bytes, source: str) -> bytes:
    """Decompress gzip/bz2/xz bytes by their magic number; plain bytes pass through."""
    try:
        if data[:2] == b"\x1f\x8b":
            return gzip.decompress(data)
        if data[:3] == b"BZh":
            return bz2.decompress(data)
        if data[:6] == b"\xfd7zXZ\x00":
            return lzma.decompress(data)
    except _CORRUPTION as error:
        raise DatasetCorrupt(f"'{source}' is corrupted or truncated: {error}") from error
    return data


def read_compressed(path: str | Path) -> bytes:
    """The decompressed content of a (possibly gzip-compressed) file, DatasetCorrupt naming it."""
    path = Path(path)
    return decompress(path.read_bytes(), str(path))
