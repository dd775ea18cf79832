"""Freed memory kept for reuse (ldpbench.fl.memory): a step's temporaries reuse the last step's pages.

Counted in minor page faults, not timed: memory that comes back from the kernel faults once per page
written to; memory glibc kept faults not at all.
"""

import platform
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                                reason="the setting is glibc's; elsewhere keep_freed_memory does nothing")

# Steps that each write four 24 MiB temporaries and free them together (as a training step frees its
# activations), in a fresh interpreter after `setup`; prints the page faults of the last three steps.
STEPS = """
import resource
import torch
{setup}
def step():
    temporaries = [torch.empty(6 * 2**20) for _ in range(4)]
    for temporary in temporaries:
        temporary.fill_(1.0)
def faults_of_a_step():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    step()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
faults = [faults_of_a_step() for _ in range(8)]
print(sum(faults[-3:]))
"""
PAGES_OF_A_STEP = 4 * 24 * 2**20 // 4096
# Whether glibc's own thresholds give these temporaries back depends on what the process freed before;
# this makes it give back every one: each is mapped fresh (mmap threshold 1 MiB) and unmapped when freed,
# and any free top of the heap is trimmed, so that each test below starts from a heap that returns its
# pages. (A trim threshold of 0 alone left the temporaries on the heap in some processes, where they were
# trimmed in some steps and not in others.)
TRIMMING = """
import ctypes
libc = ctypes.CDLL("libc.so.6")
assert libc.mallopt(-3, 2**20) and libc.mallopt(-1, 0)
"""


def faults_of_the_last_steps(*setup: str) -> int:
    script = STEPS.format(setup="\n".join(textwrap.dedent(part) for part in setup))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    return int(done.stdout.split()[-1])


def test_a_heap_that_gives_its_free_top_back_faults_again_at_every_step():
    """The power check: the count sees memory that returns from the kernel."""
    assert faults_of_the_last_steps(TRIMMING) >= 3 * PAGES_OF_A_STEP * 9 // 10


def test_with_the_setting_the_steps_reuse_the_pages_of_the_steps_before():
    faults = faults_of_the_last_steps(TRIMMING, """
        from ldpbench.fl.memory import keep_freed_memory
        assert keep_freed_memory()
        assert keep_freed_memory()  # once per process; asking again is harmless
    """)
    assert faults < PAGES_OF_A_STEP // 100


def test_a_training_run_keeps_freed_memory_for_its_steps():
    """The engine makes the setting itself: any process that trains gets it, campaign cell or script."""
    faults = faults_of_the_last_steps(TRIMMING, """
        from ldpbench.fl import clients
        from ldpbench.fl.engine import ClientData, FederatedTrainer
        from ldpbench.fl.model import build_network
        from ldpbench.fl.settings import TrainingSettings
        features, labels = torch.rand(40, 5), torch.randint(0, 2, (40,))
        partition = clients.partition("iid", labels.numpy(), 0, clients=4)
        FederatedTrainer(build_network("lr", (5,), 2, 0), None, ClientData(features, labels, partition),
                         features[:8], labels[:8], TrainingSettings(rounds=1), seed=0).run()
    """)
    assert faults < PAGES_OF_A_STEP // 100
