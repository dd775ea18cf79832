"""The per-client state of a stateful mechanism, kept between the rounds a client reports in."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ldpbench.errors import ConfigError


def spill_path(checkpoint_path: Path) -> Path:
    """Where a run with this checkpoint keeps a client state too large for memory."""
    return checkpoint_path.with_suffix(".state.npy")


class ClientStateStore:
    """The mechanism's per-client vectors (N × d): in memory, or memory-mapped on disk when large."""

    def __init__(self, clients: int, dims: int, dtype: torch.dtype, memory_limit_bytes: int,
                 spill_path: Path | None) -> None:
        self.dtype = dtype
        numpy_dtype = np.float64 if dtype == torch.float64 else np.float32
        size = clients * dims * np.dtype(numpy_dtype).itemsize
        if size > memory_limit_bytes:
            if spill_path is None:
                raise ConfigError(f"the client state needs {size / 2**20:.0f} MiB, above the memory limit; "
                                  "give the run a checkpoint directory to spill it to disk")
            spill_path.parent.mkdir(parents=True, exist_ok=True)
            self.array = np.lib.format.open_memmap(spill_path, mode="w+", dtype=numpy_dtype,
                                                   shape=(clients, dims))
            self.memory = None
        else:
            self.array, self.memory = None, torch.zeros(clients, dims, dtype=dtype)

    def read(self, ids: torch.Tensor) -> torch.Tensor:
        if self.memory is not None:
            return self.memory.index_select(0, ids)  # a third of indexing's time on a round's rows
        return torch.from_numpy(np.ascontiguousarray(self.array[ids.numpy()]))

    def write(self, ids: torch.Tensor, values: torch.Tensor) -> None:
        if self.memory is not None:
            self.memory.index_copy_(0, ids, values)
        else:
            self.array[ids.numpy()] = values.cpu().numpy()

    def snapshot(self) -> torch.Tensor:
        return self.memory.clone() if self.memory is not None else torch.from_numpy(np.array(self.array))

    def restore(self, values: torch.Tensor) -> None:
        if self.memory is not None:
            self.memory.copy_(values)
        else:
            self.array[:] = values.numpy()
