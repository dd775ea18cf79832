"""Keyed random streams.

Every random draw in ldpbench comes from a generator derived from a key such as
(run seed, round, purpose). Nothing reads global random state, so a run gives the same numbers
whatever else ran before it in the process, and however a campaign is scheduled or sharded.
"""

from __future__ import annotations

import hashlib

import torch

_SEED_MASK = (1 << 63) - 1


def derive_seed(*key: object) -> int:
    """A 63-bit seed from an ordered key; distinct keys give independent-looking seeds."""
    text = "\x1f".join(repr(part) for part in key)
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "little") & _SEED_MASK


def generator(*key: object, device: str | torch.device = "cpu") -> torch.Generator:
    """A fresh torch generator for `key`, e.g. generator(seed, round_index, "mechanism")."""
    gen = torch.Generator(device=device)
    gen.manual_seed(derive_seed(*key))
    return gen
