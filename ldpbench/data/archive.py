"""Safe reading and extraction of the archives official dataset files come in (zip, tar.*, gz).

Every member name is checked before anything is written: absolute paths, drive letters, `..`
components and backslash tricks are refused, and so are links of every kind (symbolic and hard),
devices and FIFOs, because a link is the usual way to make a later member escape the target.
Extraction goes to a temporary directory next to the target and is renamed onto it only when the
whole archive extracted cleanly. A truncated or corrupted archive raises DatasetCorrupt naming it.

Decompression bombs: every archive member and every gzip/bz2/xz file is read as a stream with a
running count of the bytes it unpacks to (header sizes are checked first, but not trusted). One
archive or compressed file may unpack to at most min(4 GiB, max(64 MiB, 200 x its packed size));
more raises ArchiveTooLarge naming the file. Where the limits come from: the real datasets unpack
to at most about 1.4 GB (CelebA's image zip, JPEG members read one at a time; EMNIST's largest idx
member is 0.55 GB), and at most 35 times their packed size (kddcup.data_10_percent.gz: 2.1 MB ->
75 MB; bank.zip 8.8x, MNIST 4.8x), while a deflate bomb reaches about 1000x. A genuine file that
needs more can raise them with the environment variables LDPBENCH_UNPACK_MAX_BYTES (bytes) and
LDPBENCH_UNPACK_MAX_RATIO.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import shutil
import stat
import tarfile
import tempfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from ldpbench.errors import ArchiveTooLarge, ConfigError, DatasetCorrupt, UnsafeArchive

_CORRUPTION = (zipfile.BadZipFile, tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile,
               lzma.LZMAError, OSError)
_CHUNK = 1 << 20
MAX_BYTES_VARIABLE = "LDPBENCH_UNPACK_MAX_BYTES"
MAX_RATIO_VARIABLE = "LDPBENCH_UNPACK_MAX_RATIO"


@dataclass(frozen=True)
class UnpackLimits:
    """How much one archive or compressed file may unpack to (see the module docstring)."""

    max_bytes: int = 4 << 30
    max_ratio: float = 200.0
    ratio_free_bytes: int = 64 << 20  # below this, any ratio: small files compress unpredictably

    def allowance(self, packed_bytes: int) -> int:
        return min(self.max_bytes, max(self.ratio_free_bytes, int(self.max_ratio * packed_bytes)))


def unpack_limits() -> UnpackLimits:
    """The default limits, or those the environment variables set."""
    limits = UnpackLimits()
    overrides = {}
    for variable, field, kind in ((MAX_BYTES_VARIABLE, "max_bytes", int),
                                  (MAX_RATIO_VARIABLE, "max_ratio", float)):
        text = os.environ.get(variable)
        if text is None:
            continue
        try:
            value = kind(text)
        except ValueError:
            value = 0
        if not value > 0:
            raise ConfigError(f"environment variable {variable}={text!r}: expected a positive "
                              f"{'integer' if kind is int else 'number'}")
        overrides[field] = value
    return UnpackLimits(**{**limits.__dict__, **overrides})


class _Allowance:
    """A running count of the bytes `source` unpacks to; ArchiveTooLarge once past the limits."""

    def __init__(self, source: str | Path, packed_bytes: int, limits: UnpackLimits | None) -> None:
        self.source, self.packed = source, packed_bytes
        self.limits = unpack_limits() if limits is None else limits
        self.allowed, self.used = self.limits.allowance(packed_bytes), 0

    def take(self, count: int, what: str = "unpacks to") -> None:
        self.used += count
        if self.used > self.allowed:
            limits = self.limits
            raise ArchiveTooLarge(
                f"'{self.source}' {what} more than {self.allowed:,} bytes from {self.packed:,} packed "
                f"bytes: refused as a likely decompression bomb (limits: {limits.max_bytes:,} bytes, and "
                f"{limits.max_ratio:g} times the packed size beyond {limits.ratio_free_bytes:,} bytes). "
                f"If it is a genuine dataset file, raise them with the environment variables "
                f"{MAX_BYTES_VARIABLE} / {MAX_RATIO_VARIABLE}."
            )


def _copy(source: BinaryIO, target: BinaryIO, allowance: _Allowance) -> None:
    while chunk := source.read(_CHUNK):
        allowance.take(len(chunk))
        target.write(chunk)


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


def _check_zip(handle: zipfile.ZipFile, archive: Path, declared: _Allowance) -> list[zipfile.ZipInfo]:
    members = handle.infolist()
    for info in members:
        check_member_name(info.filename, archive)
        if _zip_is_link(info):
            raise UnsafeArchive(f"archive '{archive}': member '{info.filename}' is a symbolic link")
        declared.take(info.file_size, "declares")
    return members


def _check_tar(handle: tarfile.TarFile, archive: Path, declared: _Allowance) -> list[tarfile.TarInfo]:
    members = []
    for info in handle:  # lazily, so that a bomb is refused before it is all decompressed
        members.append(info)
        check_member_name(info.name, archive)
        if info.issym() or info.islnk():
            raise UnsafeArchive(
                f"archive '{archive}': member '{info.name}' is a link (to '{info.linkname}'); "
                "links are refused"
            )
        if not (info.isfile() or info.isdir()):
            raise UnsafeArchive(f"archive '{archive}': member '{info.name}' is not a regular file")
        declared.take(info.size, "declares")
    return members


def _write_member(source: BinaryIO, target: Path, allowance: _Allowance) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with source, open(target, "wb") as out:
        _copy(source, out, allowance)


def safe_extract(archive: str | Path, target: str | Path, limits: UnpackLimits | None = None) -> Path:
    """Extract a zip or tar(.gz/.bz2/.xz) archive into `target` (replaced if present); return it.

    Every name is checked before anything is written; members are streamed with a running count
    of the bytes written (ArchiveTooLarge past the limits, see the module docstring).
    """
    archive, target = Path(archive), Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    packed = archive.stat().st_size
    declared, written = _Allowance(archive, packed, limits), _Allowance(archive, packed, limits)
    try:
        try:
            if zipfile.is_zipfile(archive):
                with zipfile.ZipFile(archive) as handle:
                    for info in _check_zip(handle, archive, declared):
                        path = scratch / check_member_name(info.filename, archive)
                        if info.is_dir():
                            path.mkdir(parents=True, exist_ok=True)
                        else:
                            _write_member(handle.open(info), path, written)
            elif tarfile.is_tarfile(archive):
                with tarfile.open(archive) as handle:
                    for info in _check_tar(handle, archive, declared):
                        path = scratch / check_member_name(info.name, archive)
                        if info.isdir():
                            path.mkdir(parents=True, exist_ok=True)
                        else:
                            _write_member(handle.extractfile(info), path, written)
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


def read_member(handle: zipfile.ZipFile, member: str, archive: str | Path,
                limits: UnpackLimits | None = None) -> bytes:
    """The bytes of one member of an open zip archive, streamed within the unpack limits."""
    check_member_name(member, archive)
    try:
        info = handle.getinfo(member)
    except KeyError:
        raise DatasetCorrupt(f"archive '{archive}' has no member '{member}'") from None
    if _zip_is_link(info):
        raise UnsafeArchive(f"archive '{archive}': member '{member}' is a symbolic link")
    # The member's own packed size (at most the archive's): a large archive of small members
    # must not lend one member its whole size.
    packed = min(info.compress_size, Path(archive).stat().st_size)
    source = f"{archive}:{member}"
    _Allowance(source, packed, limits).take(info.file_size, "declares")
    out = io.BytesIO()
    with handle.open(info) as stream:
        _copy(stream, out, _Allowance(source, packed, limits))
    return out.getvalue()


def read_zip_member(archive: str | Path, member: str, limits: UnpackLimits | None = None) -> bytes:
    """The bytes of one member of a zip archive (nothing is written to disk)."""
    archive = Path(archive)
    check_member_name(member, archive)
    try:
        with zipfile.ZipFile(archive) as handle:
            return read_member(handle, member, archive, limits)
    except (UnsafeArchive, DatasetCorrupt):
        raise
    except _CORRUPTION as error:
        raise DatasetCorrupt(f"archive '{archive}' (member '{member}') is corrupted or truncated: "
                             f"{error}") from error


class _BoundedReader(io.RawIOBase):
    """A decompressing stream that counts what it yields (ArchiveTooLarge past the allowance) and
    reports corruption as DatasetCorrupt naming the source; closing it closes `raw` too."""

    def __init__(self, stream: BinaryIO, raw: BinaryIO, allowance: _Allowance) -> None:
        self._stream, self._raw, self._allowance = stream, raw, allowance

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        try:
            count = self._stream.readinto(buffer)
        except _CORRUPTION as error:
            raise DatasetCorrupt(f"'{self._allowance.source}' is corrupted or truncated: {error}") from error
        self._allowance.take(count)
        return count

    def readall(self) -> bytes:  # in large chunks (io.RawIOBase's default reads 8 KiB at a time)
        chunks = []
        while chunk := self.read(_CHUNK):
            chunks.append(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        self._stream.close()
        self._raw.close()
        super().close()


def _decompressing(raw: BinaryIO, packed_bytes: int, source: str | Path,
                   limits: UnpackLimits | None) -> BinaryIO:
    """`raw` decompressed by its magic number (gzip/bz2/xz; plain bytes pass through), bounded."""
    magic = raw.read(6)
    raw.seek(0)
    if magic[:2] == b"\x1f\x8b":
        stream = gzip.GzipFile(fileobj=raw, mode="rb")
    elif magic[:3] == b"BZh":
        stream = bz2.BZ2File(raw, mode="rb")
    elif magic == b"\xfd7zXZ\x00":
        stream = lzma.LZMAFile(raw, mode="rb")
    else:
        return raw
    return io.BufferedReader(_BoundedReader(stream, raw, _Allowance(source, packed_bytes, limits)), _CHUNK)


def open_decompressed(path: str | Path, limits: UnpackLimits | None = None) -> BinaryIO:
    """A binary stream of the decompressed content of a (possibly compressed) file."""
    path = Path(path)
    raw = open(path, "rb")
    try:
        return _decompressing(raw, path.stat().st_size, path, limits)
    except BaseException:
        raw.close()
        raise


def decompress(data: bytes, source: str, limits: UnpackLimits | None = None) -> bytes:
    """Decompress gzip/bz2/xz bytes by their magic number; plain bytes pass through."""
    with _decompressing(io.BytesIO(data), len(data), source, limits) as stream:
        return stream.read()


def read_compressed(path: str | Path, limits: UnpackLimits | None = None) -> bytes:
    """The decompressed content of a (possibly gzip-compressed) file, DatasetCorrupt naming it."""
    with open_decompressed(path, limits) as stream:
        return stream.read()
