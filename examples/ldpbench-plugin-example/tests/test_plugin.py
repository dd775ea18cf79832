"""The example plugin, as its own package would test it: ldpbench finds it, and it passes ldpbench's
contract and privacy audit (`ldpbench check`)."""

import math
import subprocess
import sys

import torch

from ldpbench import mechanisms
from ldpbench.mechanisms.contract import streams


def test_ldpbench_registers_the_plugins_mechanism():
    assert "one-coordinate-rr" in mechanisms.names()
    assert "one-coordinate-rr" in mechanisms.registry.MECHANISMS.added_later()


def test_its_reports_are_unbiased():
    clients, dims, epsilon = 200_000, 4, 2.0
    mechanism = mechanisms.create("one-coordinate-rr", epsilon, dims)
    updates = torch.tensor([[0.5, -0.25, 0.0, 1.0]], dtype=torch.float64).expand(clients, dims)
    estimate = mechanism.privatize(updates, streams(0, updates)).reports.mean(0)
    # A coordinate's report is ±B with probability 1/d, else 0: variance ≤ B²/d per client. Six
    # standard deviations of the mean: a false alarm below 1e-8 per coordinate (normal approximation).
    scale = dims * (math.exp(epsilon) + 1) / (math.exp(epsilon) - 1)
    assert torch.allclose(estimate, updates[0], rtol=0, atol=6 * scale / math.sqrt(dims * clients))


def test_ldpbench_check_passes_it():
    result = subprocess.run([sys.executable, "-m", "ldpbench", "check", "one-coordinate-rr", "--samples", "100000"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FAILED" not in result.stdout and "audit: consistent" in result.stdout
