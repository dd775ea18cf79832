"""Refactors must not move numbers: a small campaign's metrics equal those recorded before them.

The campaign covers FedSGD and FedAvg, a linear network (zero start) and an MLP (seeded start), an
update mechanism, a stateful one (PS-PM keeps residuals), a data release (flat-release) and the
non-private baseline. Runs are matched by what they are (dataset, model, label, ε, seed, fold), not
by run id, so a change of the plan's serialisation alone does not fail this test. The expected
values were recorded with `python tests/golden/metrics.py <campaign dir>` (their history is
tests/golden/'s git log), and again when the linear models' gradients became closed-form: with
`training.gradients: autograd` the campaign still gave the first recorded numbers bit for bit; by
formula 7 of its 20 runs moved by at most 2.3e-7 relative (float32 rounding) and no accuracy changed.

The last bits depend on the machine (its BLAS and vector kernels), so there is one recording per
platform (tests/golden/small_campaign.<vendor>-<instruction set>.json, golden.metrics.platform_signature),
and the numbers must equal this platform's bit for bit. On a platform without a recording they must be
those of a recorded platform to float32 rounding, accuracies exactly (when the AMD AVX2 recording was
first run on an Intel AVX-512 machine, all 20 runs moved: losses by at most 3e-7 relative, AUCs by the
order of a few score pairs, no accuracy), and the test warns that this platform has none.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import pytest
import yaml
from golden.metrics import CURVE_METRICS, campaign_metrics, platform_signature

from workflow_cli import run_snakemake

GOLDEN = Path(__file__).parent / "golden"
ACCURACY = CURVE_METRICS.index("test_accuracy")


@pytest.mark.slow
def test_small_campaign_metrics_are_unchanged(tmp_path):
    config = yaml.safe_load((GOLDEN / "small_campaign.yaml").read_text())
    process = run_snakemake(tmp_path, config, "--cores", "2", f"results/{config['campaign']}/tables/summary.parquet")
    assert process.returncode == 0, process.stdout[-4000:]
    measured = json.loads(json.dumps(campaign_metrics(tmp_path / "results" / config["campaign"])))
    recordings = recorded()
    here = platform_signature()
    if here in recordings:
        changed = moved(measured, recordings[here], equal=lambda value, expected: value == expected)
        assert not changed, f"metrics moved in {len(changed)} runs on {here}: {changed}"
        return
    nearest = min(recordings, key=lambda name: len(moved(measured, recordings[name], equal=within_rounding)))
    changed = moved(measured, recordings[nearest], equal=within_rounding)
    assert not changed, f"metrics moved beyond float32 rounding in {len(changed)} runs against {nearest}: {changed}"
    warnings.warn(f"no golden recording for {here}: the numbers are {nearest}'s to float32 rounding; record them "
                  f"with tests/golden/metrics.py (see its docstring)", stacklevel=1)


def recorded() -> dict[str, dict]:
    """{platform signature: its recorded metrics}."""
    return {path.name.removeprefix("small_campaign.").removesuffix(".json"): json.loads(path.read_text())
            for path in sorted(GOLDEN.glob("small_campaign.*.json"))}


def within_rounding(value, expected) -> bool:
    """Equal, or both floats within float32 rounding (a few ulps; an AUC a few of its pairs apart). Not
    for accuracies, which `moved` compares exactly."""
    if isinstance(value, list) and isinstance(expected, list):
        return len(value) == len(expected) and all(map(within_rounding, value, expected))
    if isinstance(value, float) and isinstance(expected, float):
        return math.isclose(value, expected, rel_tol=1e-6, abs_tol=1e-5)
    return value == expected


def moved(measured: dict, expected: dict, equal) -> dict:
    """{run: {metric: (expected, measured)}} where `equal` says they differ; accuracies (test_accuracy and
    the curves' accuracy column) always compared exactly."""
    assert sorted(measured) == sorted(expected)
    changed = {}
    for key, row in measured.items():
        for metric, value in row.items():
            same = value == expected[key][metric]
            if not same and metric != "test_accuracy":
                same = equal(value, expected[key][metric]) and (
                    metric != "curve" or [point[ACCURACY] for point in value] == [point[ACCURACY] for point in
                                              expected[key][metric]])
            if not same:
                changed.setdefault(key, {})[metric] = (expected[key][metric], value)
    return changed


def test_the_recorded_platforms_agree_to_float32_rounding_and_their_accuracies_exactly():
    recordings = recorded()
    assert {"AuthenticAMD-AVX2", "GenuineIntel-AVX512"} <= set(recordings)
    amd, intel = recordings["AuthenticAMD-AVX2"], recordings["GenuineIntel-AVX512"]
    assert len(moved(intel, amd, equal=lambda value, expected: value == expected)) == 20  # every run's last bits
    assert not moved(intel, amd, equal=within_rounding)


def test_a_move_beyond_rounding_or_of_an_accuracy_is_caught_on_an_unrecorded_platform():
    reference = recorded()["GenuineIntel-AVX512"]
    key = sorted(reference)[0]

    def with_change(change):
        changed = json.loads(json.dumps(reference))
        change(changed[key])
        return changed

    def loss(row):
        row["test_loss"] *= 1 + 1e-4

    def final_accuracy(row):
        row["test_accuracy"] += 1e-3

    def curve_accuracy(row):
        row["curve"][-1][ACCURACY] += 1e-3

    def one_ulp(row):
        row["test_loss"] = math.nextafter(row["test_loss"], math.inf)

    for change in (loss, final_accuracy, curve_accuracy):
        assert set(moved(with_change(change), reference, equal=within_rounding)) == {key}, change.__name__
    assert not moved(with_change(one_ulp), reference, equal=within_rounding)
    assert set(moved(with_change(one_ulp), reference, equal=lambda value, expected: value == expected)) == {key}
