"""Exceptions that carry a message meant for the person running the campaign."""


class LdpbenchError(Exception):
    """Base class: the message names the field or file at fault and what was expected."""


class ConfigError(LdpbenchError):
    """A campaign file or a mechanism/model parameter is invalid."""


class DatasetUnavailable(LdpbenchError):
    """A dataset file is missing and cannot be fetched with the current settings."""


class ChecksumMismatch(LdpbenchError):
    """A file's sha256 differs from the pinned one."""


class DatasetCorrupt(LdpbenchError):
    """A dataset file is truncated, malformed or holds other record counts than expected."""


class UnsafeArchive(LdpbenchError):
    """An archive member would escape the extraction directory or is a link/device."""


class ArchiveTooLarge(UnsafeArchive):
    """An archive or compressed file unpacks to more bytes than the limits allow (a likely bomb)."""


class TrackingStoreError(LdpbenchError):
    """The MLflow tracking store cannot be used (locked too long, read-only, full, not a database)."""


class UnsupportedSnakemake(LdpbenchError):
    """The installed Snakemake lacks an attribute the workflow uses (ldpbench/snakemake_compat.py)."""
