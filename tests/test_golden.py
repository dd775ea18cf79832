"""Refactors must not move numbers: a small campaign's metrics equal those recorded before them.

The campaign covers FedSGD and FedAvg, a linear network (zero start) and an MLP (seeded start), an
update mechanism, a stateful one (PS-PM keeps residuals), a data release (flat-release) and the
non-private baseline. Runs are matched by what they are (dataset, model, label, ε, seed, fold), not
by run id, so a change of the plan's serialisation alone does not fail this test. The expected
values were recorded with `python tests/golden/metrics.py <campaign dir>` (their history is
tests/golden/'s git log), and again when the linear models' gradients became closed-form: with
`training.gradients: autograd` the campaign still gave the first recorded numbers bit for bit; by
formula 7 of its 20 runs moved by at most 2.3e-7 relative (float32 rounding) and no accuracy changed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from golden.metrics import campaign_metrics

from workflow_cli import run_snakemake

GOLDEN = Path(__file__).parent / "golden"


@pytest.mark.slow
def test_small_campaign_metrics_are_unchanged(tmp_path):
    config = yaml.safe_load((GOLDEN / "small_campaign.yaml").read_text())
    process = run_snakemake(tmp_path, config, "--cores", "2", f"results/{config['campaign']}/tables/summary.parquet")
    assert process.returncode == 0, process.stdout[-4000:]
    expected = json.loads((GOLDEN / "small_campaign.json").read_text())
    measured = json.loads(json.dumps(campaign_metrics(tmp_path / "results" / config["campaign"])))
    assert sorted(measured) == sorted(expected)
    changed = {key: {metric: (expected[key][metric], value) for metric, value in row.items()
                     if value != expected[key][metric]}
               for key, row in measured.items() if row != expected[key]}
    assert not changed, f"metrics moved in {len(changed)} runs: {changed}"
