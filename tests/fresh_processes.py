"""Fresh processes for the tests that start several (concurrent MLflow writers): forked from
multiprocessing's fork server rather than from pytest's process, which runs threads, and rather than
spawned, where each would import MLflow again (seconds of a core each): the server imports it once."""

from __future__ import annotations

import multiprocessing

# One list for every test: the server is started once per process, with the preload of its first user.
PRELOAD = ["mlflow.tracking", "ldpbench.results.tracking"]


def context() -> multiprocessing.context.BaseContext:
    forkserver = multiprocessing.get_context("forkserver")
    forkserver.set_forkserver_preload(PRELOAD)
    return forkserver
