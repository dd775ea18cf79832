"""Feature extraction: prepared dataset (array format) -> embedding dataset, cached and atomic.

The output directory (by convention `data/features/<dataset>/<encoder>/`) is built in a temporary
sibling directory and renamed into place only when complete, `meta.json` last; it holds
features.npy (float32 [n, dim]), labels.npy, and clients.npy / official_test.npy when the source has
them, and the metadata: the source's classes and counts plus `provenance` (encoder, source and
sha256 of the weights or "random-init", pooling, dim, preprocessing, device, the source dataset's
name and metadata sha256).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ldpbench.atomic import write_json
from ldpbench.data.download import sha256_of
from ldpbench.data.prepared import CLIENTS_FILE, FEATURES_FILE, LABELS_FILE, META_FILE, OFFICIAL_TEST_FILE, load_arrays
from ldpbench.errors import ConfigError
from ldpbench.features import encoders

log = logging.getLogger("ldpbench.features")
_KEPT = ("name", "classes", "class_counts", "task", "n_clients", "n_official_test", "licence",
         "counts", "description", "notes")


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    resolved = torch.device(device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device '{device}' was asked for but CUDA is not available")
    return resolved


def _save(path: Path, array: np.ndarray) -> dict[str, Any]:
    with open(path, "wb") as handle:
        np.save(handle, np.ascontiguousarray(array), allow_pickle=False)
    return {"sha256": sha256_of(path), "bytes": path.stat().st_size}


def _swap_into_place(tmp: Path, target: Path) -> None:
    """Rename the finished directory onto `target` (an empty or earlier one is replaced)."""
    if target.exists() and target.is_dir() and not any(target.iterdir()):
        target.rmdir()  # e.g. created by Snakemake for the output
    if target.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
        os.replace(target, old / "x")
        os.replace(tmp, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, target)


def extract_features(prepared_dir: str | Path, out_dir: str | Path, encoder: str | encoders.Encoder,
                     batch_size: int = 64, device: str = "auto", weights: str | None = None,
                     random_init: bool = False, raw_dir: str | Path = "data/raw",
                     mirror: str | Path | None = None, allow_download: bool = False,
                     threads: int | None = None) -> dict[str, Any]:
    """Encode every record of a prepared dataset; write the features directory; return its meta. Its
    progress and time left go to the console and the job's record as it goes (ldpbench.progress)."""
    from ldpbench import progress

    prepared_dir, out_dir = Path(prepared_dir), Path(out_dir)
    source = load_arrays(prepared_dir, mmap=True)
    model = encoders.create(encoder) if isinstance(encoder, str) else encoder
    kind = source.meta.get("kind")
    if kind != model.kind:
        raise ConfigError(f"encoder '{model.name}' reads {model.kind} datasets, but "
                          f"'{prepared_dir}' holds {kind or 'tabular'} data")
    if threads:
        torch.set_num_threads(threads)
    resolved = resolve_device(device)
    model.load(resolved, weights, random_init, raw_dir, mirror, allow_download)
    n = len(source.features)
    order = model.order(source.features)
    order = np.arange(n) if order is None else order
    out = np.empty((n, model.dim), dtype=np.float32)
    started = time.perf_counter()
    for start in range(0, n, batch_size):
        index = np.sort(order[start:start + batch_size])
        out[index] = model.encode(source.features[index]).cpu().numpy()
        progress.report(min(start + batch_size, n), n, "records")
    seconds = time.perf_counter() - started
    if not np.isfinite(out).all():
        raise ConfigError(f"encoder '{model.name}' produced non-finite features for '{prepared_dir}'")

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    try:
        files = {FEATURES_FILE: _save(tmp / FEATURES_FILE, out),
                 LABELS_FILE: _save(tmp / LABELS_FILE, np.asarray(source.labels))}
        if source.clients is not None:
            files[CLIENTS_FILE] = _save(tmp / CLIENTS_FILE, np.asarray(source.clients))
        if source.official_test is not None:
            files[OFFICIAL_TEST_FILE] = _save(tmp / OFFICIAL_TEST_FILE, np.asarray(source.official_test))
        meta = {key: source.meta[key] for key in _KEPT if key in source.meta}
        meta.update({
            "format": "arrays", "kind": "embedding", "n": n, "shape": [model.dim],
            "dtype": np.dtype(np.float32).str, "files": files,
            "provenance": {
                **model.provenance,
                "device": str(resolved), "batch_size": batch_size, "seconds": round(seconds, 2),
                "torch": torch.__version__, "transformers": _version("transformers"),
                "source_dataset": {"name": source.meta.get("name"), "prepared_dir": str(prepared_dir),
                                   "meta_sha256": sha256_of(prepared_dir / META_FILE)},
            },
        })
        write_json(tmp / META_FILE, meta)
        os.chmod(tmp, 0o755)
        _swap_into_place(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("%s: %d records -> %d-dim features in %.1f s on %s", model.name, n, model.dim, seconds, resolved)
    return meta


def _version(package: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(package)
    except Exception:  # noqa: BLE001 - provenance only
        return None
