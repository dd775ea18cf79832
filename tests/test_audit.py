"""The black-box privacy audit (ldpbench.audit): bounds that hold, power against mis-calibration.

Every audit here runs at alpha = 1e-6: a correct mechanism is flagged (its bound above its true ε)
with probability at most 1e-6 per test. Power: an over-claiming mechanism is flagged.
"""

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from ldpbench import audit as audit_module
from ldpbench import mechanisms
from ldpbench.audit import (
    AUDIT_COHORT,
    CLAIM_EXCEEDED,
    CONSISTENT,
    DEFECT,
    MEMORY_BYTES_PER_SAMPLE,
    AuditResult,
    AuditSettings,
    audit,
    audited_configurations,
    cached_audits,
    lower_bound,
    memory_mib,
    read_table,
    verdict,
    write_table,
)
from ldpbench.cli import main
from ldpbench.errors import LdpbenchError
from ldpbench.mechanisms.base import Accounting

ALPHA = 1e-6


def randomized_response(epsilon: float, truth: int, n: int, seed: int) -> np.ndarray:
    keep = math.exp(epsilon) / (1 + math.exp(epsilon))
    flips = np.random.default_rng(seed).random(n) >= keep
    return np.where(flips, 1 - truth, truth).astype(float).reshape(n, 1)


def test_the_bound_of_randomized_response_is_tight_and_never_above_its_epsilon():
    epsilon, n = 1.0, 400_000
    bound = lower_bound(randomized_response(epsilon, 1, n, 0), randomized_response(epsilon, 0, n, 1), ALPHA)
    assert 0.9 < bound.epsilon <= epsilon  # power: within 0.1 of the exact ε; false alarm ≤ 1e-6


def test_identical_laws_give_no_positive_bound():
    n = 200_000
    same = lower_bound(randomized_response(2.0, 1, n, 2), randomized_response(2.0, 1, n, 3), ALPHA)
    assert same.epsilon <= 0


def test_the_event_is_chosen_on_one_half_and_measured_on_the_other():
    # The first half of x's sample is far from x', the second half is x' itself: a bound that used
    # the first half for measuring would be large; measured on the second half it cannot be positive.
    n = 100_000
    law = randomized_response(1.0, 0, n, 4)
    far = np.concatenate([np.ones((n // 2, 1)), law[n // 2:]])
    assert lower_bound(far, randomized_response(1.0, 0, n, 5), ALPHA).epsilon <= 0


@pytest.mark.parametrize("name,params", [
    ("pm", {}), ("duchi", {}), ("hm", {}), ("laplace-raw", {}), ("ps-pm", {}), ("exp-pm", {}),
    ("sketch-laplace", {"clip": 1.0, "rows": 3, "columns": 4}),
])
def test_correct_mechanisms_are_not_flagged(name, params):
    result = audit(mechanisms.create(name, 1.0, 4, params), params, samples=100_000, alpha=ALPHA)
    assert result.verdict == CONSISTENT, result
    assert result.audited_lower_bound > 0.3 * result.claimed  # the audit sees most of the budget


def recast(mechanism, cls):
    """The same mechanism (every field) as an instance of `cls`, a subclass of its class."""
    return cls(**{field: getattr(mechanism, field) for field in mechanism.__dataclass_fields__})


def over_claiming(name: str, true_epsilon: float, claimed: float):
    """The mechanism at `true_epsilon` whose accounting says `claimed` (a mis-calibration)."""
    honest = mechanisms.create(name, true_epsilon, 4)

    class OverClaiming(type(honest)):
        def accounting(self):
            real = super().accounting()
            return Accounting(claimed, claimed, real.bits)

    return recast(honest, OverClaiming)


@pytest.mark.parametrize("name", ["pm", "duchi"])
def test_a_mechanism_that_perturbs_at_one_and_a_half_epsilon_and_claims_epsilon_is_a_defect(name):
    result = audit(over_claiming(name, 1.5, 1.0), {}, samples=200_000, alpha=ALPHA)
    assert result.verdict == DEFECT and result.audited_lower_bound > 1.0, result


def test_the_verdict_reads_the_bound_against_the_claim_and_the_worst_case():
    assert verdict(1.0, 2.0, 0.9) == CONSISTENT
    assert verdict(1.0, 2.0, 1.5) == CLAIM_EXCEEDED
    assert verdict(1.0, 2.0, 2.1) == DEFECT
    assert verdict(1.0, math.inf, 50.0) == CLAIM_EXCEEDED


def test_a_data_release_is_audited_on_its_records_and_labels():
    # Label RR at ε_Y on top of the released features: with the features of both records equal,
    # only the label separates them, so the bound is at most ε_Y and sees most of it.
    release = mechanisms.create("flat-release", 1.0, 2, {"perturber": "pm", "eps_y": 1.0}, classes=2)

    class LabelsOnly(type(release)):
        def audit_pairs(self):
            pair = super().audit_pairs()[0]
            return [type(pair)("labels 0 / 1", pair.x, pair.x.clone(), 0, 1)]

    labels_only = recast(release, LabelsOnly)
    result = audit(labels_only, {}, samples=100_000, alpha=ALPHA)
    assert 0.8 < result.audited_lower_bound <= 1.0


def test_cli_audits_and_fails_naming_a_defect(tmp_path, capsys, monkeypatch):
    import pandas as pd

    out = tmp_path / "audit.parquet"
    assert main(["audit", "--mechanism", "duchi", "--epsilon", "1", "--samples", "20000", "--out", str(out)]) == 0
    table = pd.read_parquet(out)
    assert list(table["mechanism"]) == ["duchi"] and table["audited_lower_bound"].iloc[0] <= 1.0
    assert {"mechanism", "params", "epsilon", "dims", "claimed", "worst_case", "audited_lower_bound", "samples",
            "event", "verdict"} <= set(table.columns)

    # A registry whose duchi over-claims: the command exits 1 and names it (0 with --warn).
    wrong = over_claiming("duchi", 2.0, 0.5)
    monkeypatch.setattr(mechanisms, "create", lambda *args, **kwargs: wrong)
    assert main(["audit", "--mechanism", "duchi", "--samples", "50000"]) == 1
    assert main(["audit", "--mechanism", "duchi", "--samples", "50000", "--warn"]) == 0
    assert "duchi" in capsys.readouterr().out


def test_pairs_of_every_registered_mechanism_fit_its_input():
    for name in mechanisms.names():
        cls = mechanisms.get(name)
        epsilon = cls.example_epsilon if cls.private else math.inf
        mechanism = mechanisms.create(name, epsilon, 6, cohort_size=100, classes=2)
        for pair in mechanism.audit_pairs():
            assert pair.x.shape == pair.x_prime.shape == torch.Size([6]), name


def write_summaries(directory, runs: list[dict]) -> list:
    """Run summaries recording these mechanisms and budgets; their paths."""
    import pandas as pd

    paths = []
    for index, run in enumerate(runs):
        path = directory / f"run_id={index:016x}" / "summary.parquet"
        path.parent.mkdir(parents=True)
        pd.DataFrame([{"classes": 2, **run}]).to_parquet(path)
        paths.append(path)
    return paths


PM_RUN = {"mechanism": "pm", "mechanism_params": '{"anonymizer": false}', "epsilon": 4.0,
          "epsilon_per_report": 2.0}
PM_AUDITED = {"mechanism": "pm", "params": {"anonymizer": False}, "epsilon": 2.0, "classes": 2}


def test_runs_are_audited_at_the_budget_of_one_report_they_recorded(tmp_path):
    # Two epochs: ε = 4 is spent as 2 per report, which is what the audit must check; the
    # non-private run and the repeat of the same configuration add no row.
    summaries = write_summaries(tmp_path, [PM_RUN, {**PM_RUN}, {"mechanism": "np", "mechanism_params": "{}",
                                                               "epsilon": math.inf, "epsilon_per_report": math.inf}])
    assert audited_configurations(summaries) == [PM_AUDITED]
    [result] = cached_audits(audited_configurations(summaries), tmp_path / "audit",
                             AuditSettings(samples=50_000, alpha=ALPHA))
    assert (result.mechanism, result.epsilon, result.params) == ("pm", 2.0, '{"anonymizer": false}')
    assert result.verdict == CONSISTENT and 1.0 < result.audited_lower_bound <= 2.0


def test_an_audit_is_computed_once_for_its_settings_and_left_to_the_job_computing_it(tmp_path, monkeypatch):
    import fcntl

    computed = []
    real = audit_module.audit_configuration
    monkeypatch.setattr(audit_module, "audit_configuration",
                        lambda configuration, settings: computed.append(settings) or real(configuration, settings))
    small = AuditSettings(samples=5_000, random_pairs=0)
    first = cached_audits([PM_AUDITED], tmp_path, small)
    assert cached_audits([PM_AUDITED], tmp_path, small) == first and computed == [small]
    # Other settings are another audit.
    other = AuditSettings(samples=5_000, random_pairs=0, seed=1)
    cached_audits([PM_AUDITED], tmp_path, other)
    assert computed == [small, other]
    # An audit another process is computing (it holds the audit's lock) is left to it when not waiting.
    third = AuditSettings(samples=5_000, random_pairs=0, seed=2)
    lock_path = tmp_path / f".{audit_module.audit_key(PM_AUDITED, third)}.lock"
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        assert cached_audits([PM_AUDITED], tmp_path, third, wait=False) == []
    assert computed == [small, other]


def write_marker(path, audited: list[dict]):
    import json

    path.write_text(json.dumps({"cell_id": "c", "phase": "final", "runs": [], "audited": audited}))
    return str(path)


def test_the_audit_table_gathers_the_cells_audits_once_each_and_fails_on_a_defect(tmp_path, caplog, monkeypatch):
    import pandas as pd

    cells = [write_marker(tmp_path / "a.json", [PM_AUDITED]), write_marker(tmp_path / "b.json", [PM_AUDITED])]
    out = tmp_path / "audit.parquet"
    arguments = ["audit-table", "--cells", *cells, "--audits", str(tmp_path / "audit"), "--out", str(out),
                 "--samples", "5000", "--dims", "4", "--alpha", "0.01", "--random-pairs", "0", "--seed", "0"]
    assert main(arguments) == 0
    assert len(pd.read_parquet(out)) == 1 and pd.read_parquet(out)["verdict"].item() == CONSISTENT
    # A defect (perturbs at ε = 3, says 2) fails the table unless --warn, which writes it.
    wrong = over_claiming("pm", 3.0, 2.0)
    monkeypatch.setattr(mechanisms, "create", lambda *args, **kwargs: wrong)
    defect = [*arguments[:-2], "--seed", "1"]  # other settings: a new audit
    out.unlink()
    assert main(defect) == 1 and not out.exists()
    assert "a defect" in caplog.text
    assert main([*defect, "--warn"]) == 0
    assert list(pd.read_parquet(out)["verdict"]) == [DEFECT]


def test_an_audit_table_without_rows_keeps_the_types_of_its_columns(tmp_path):
    # A campaign of non-private mechanisms alone has no audit part: its table, merged from none, has
    # the columns and types of an audited one (the report joins its float ε with the runs'), and one
    # an earlier version wrote with untyped columns is read with them.
    import pandas as pd

    cached_audits([PM_AUDITED], tmp_path / "audit", AuditSettings(samples=5_000, random_pairs=0))
    [part] = (tmp_path / "audit").glob("*.parquet")
    audited = pd.read_parquet(part).dtypes
    assert audited["epsilon"] == "float64" and audited["samples"] == "int64"
    write_table(tmp_path / "no results.parquet", [])
    assert pd.read_parquet(tmp_path / "no results.parquet").dtypes.to_dict() == audited.to_dict()
    # The audit-table job of a campaign whose final cells audited nothing writes such a table.
    marker = write_marker(tmp_path / "np.json", [])
    assert main(["audit-table", "--cells", marker, "--audits", str(tmp_path / "none"), "--out",
                 str(tmp_path / "none.parquet"), "--samples", "5000", "--dims", "4", "--alpha", "0.01",
                 "--random-pairs", "0", "--seed", "0"]) == 0
    assert pd.read_parquet(tmp_path / "none.parquet").dtypes.to_dict() == audited.to_dict()
    pd.DataFrame(columns=list(AuditResult.__annotations__)).to_parquet(tmp_path / "untyped.parquet")
    assert read_table(tmp_path / "untyped.parquet").dtypes.to_dict() == audited.to_dict()
    pd.DataFrame({"mechanism": ["pm"]}).to_parquet(tmp_path / "other.parquet")
    with pytest.raises(LdpbenchError, match="'.*other.parquet' lacks columns"):
        read_table(tmp_path / "other.parquet")


def test_a_leak_in_one_coordinate_is_found_beside_many_noisy_ones():
    # A label sent by randomized response at ε = 1 beside 50 coordinates of loud noise that carry
    # nothing: the mean difference w is mostly the noise's sampling error, so the projection on w
    # drowns the label; on the label's own coordinate the bound sees most of its ε.
    n, epsilon = 100_000, 1.0
    rng = np.random.default_rng(7)

    def reports(label: int) -> np.ndarray:
        noise = rng.normal(0.0, 10.0, (n, 50))
        return np.concatenate([noise, randomized_response(epsilon, label, n, int(rng.integers(1 << 30)))], axis=1)

    bound = lower_bound(reports(1), reports(0), ALPHA)
    assert 0.7 < bound.epsilon <= epsilon and bound.event.startswith("y[50]"), bound


# Audits as the implementation that held every report in memory computed them (recorded from it):
# the audit must keep drawing the same reports, choosing the same event and counting the same hits.
# Widths 1 to 154, continuous and discrete reports (ties), a data release, an event on one coordinate.
HELD_AUDITS = [
    # mechanism, ε, dims, params, samples, random pairs, bound, pair, event (seed 3)
    ("pm", 1.0, 4, {}, 300_001, 2, 0.9778634274475083, "all coordinates +1 / -1",
     "<y, w> > 8.44921 (more likely under x)"),
    ("duchi", 1.0, 4, {}, 300_001, 2, 0.9748731253434622, "all coordinates +1 / -1",
     "<y, w> < 17.2688 (more likely under x')"),
    ("pm", 2.0, 1, {}, 100_001, 1, 1.947053569005527, "all coordinates +1 / -1",
     "<y, w> < -2.23256 (more likely under x')"),
    ("flat-release", 1.0, 4, {"perturber": "pm", "eps_y": 1.0}, 200_001, 0, 1.6887779362164785,
     "features +1 / -1, labels 0 / 1", "<y, w> < -32.541 (more likely under x')"),
    ("flat-release", 1.0, 12, {"perturber": "pm", "eps_y": 1.0}, 100_001, 0, 0.7427694743038904,
     "features +1 / -1, labels 0 / 1", "y[4] > 37.4334 (more likely under x)"),
    ("bitrand", 1.0, 4, {}, 20_001, 0, 2.5187481485626653, "features +1 / -1, labels 0 / 1",
     "<y, w> > 532.931 (more likely under x)"),
    ("ldp-fl", 1.0, 8, {}, 200_001, 1, 0.6650322960667205, "all coordinates +1 / -1",
     "<y, w> > 132.558 (more likely under x)"),
    ("three-outputs", 1.0, 8, {}, 200_001, 1, 0.9652561868224402, "all coordinates +1 / -1",
     "<y, w> < -38.19 (more likely under x')"),
    ("sketch-laplace", 1.0, 4, {"clip": 1.0, "rows": 3, "columns": 4}, 150_001, 1, 0.5724706864808349,
     "first coordinate +1 / -1", "<y, w> < -55.4205 (more likely under x')"),
    ("diffsketch", 1.0, 4, {}, 20_001, 1, 2.421059352594472, "random 0", "<y, w> > 175.175 (more likely under x)"),
]


@pytest.mark.parametrize("name,epsilon,dims,params,samples,random,bound,pair,event", HELD_AUDITS)
def test_the_audit_gives_the_bounds_of_the_audit_that_held_every_report(name, epsilon, dims, params, samples,
                                                                        random, bound, pair, event):
    mechanism = mechanisms.create(name, epsilon, dims, params, cohort_size=AUDIT_COHORT, classes=2)
    result = audit(mechanism, params, samples=samples, random=random, seed=3)
    assert (result.audited_lower_bound, result.pair, result.event) == (bound, pair, event)



@pytest.mark.parametrize("width", [1, 2, 4, 5])
def test_the_first_halves_moments_are_numpys_bit_for_bit(monkeypatch, width):
    """The compiled column means and variances (ldpbench.numba_moments) of reports of two columns or
    more, numpy's own for one: numpy's mean(axis=0) and var(axis=0) bit for bit, on rows far from
    zero and of large spread, where another order of the additions would round otherwise."""
    from ldpbench import numba_moments

    compiled = []

    def counted(rows):
        compiled.append(rows.shape)
        return kernel(rows)

    kernel = numba_moments.column_moments
    monkeypatch.setattr(numba_moments, "column_moments", counted)
    generator = np.random.default_rng(width)
    for count in (1, 7, 65_536, 500_001):
        rows = generator.standard_normal((count, width)) * 1e8 + generator.integers(-3, 3, (count, width))
        means, variances = audit_module._moments(rows)
        assert np.array_equal(means.view(np.int64), rows.mean(axis=0).view(np.int64))
        assert np.array_equal(variances.view(np.int64), rows.var(axis=0).view(np.int64))
    assert len(compiled) == (4 if width > 1 else 0)


def signs(n: int, width: int, leak: float, seed: int) -> np.ndarray:
    """±1 reports [n, width]: coordinate 0 is +1 with probability 1/2 + leak, the others fair coins."""
    rng = np.random.default_rng(seed)
    p = np.full(width, 0.5)
    p[0] += leak
    return np.where(rng.random((n, width)) < p, 1.0, -1.0)


def noisy_label(label: int, n: int, seed: int) -> np.ndarray:
    """A label by randomized response at ε = 1 beside 50 coordinates of loud noise."""
    rng = np.random.default_rng(seed)
    kept = np.where(rng.random(n) >= math.e / (1 + math.e), 1 - label, label).astype(float)
    return np.concatenate([rng.normal(0.0, 10.0, (n, 50)), kept[:, None]], axis=1)


def test_the_bound_of_reports_in_memory_is_the_one_recorded():
    # lower_bound on arrays, as recorded from the implementation that held them whole.
    coins = [np.where(np.random.default_rng(seed).random((100_001, 1)) < p, 1.0, 0.0)
             for seed, p in ((4, 0.7), (5, 0.3))]
    for (x, x_prime), bound, event in [
        (coins, 0.804183085776137, "<y, w> < 0.39798 (more likely under x')"),
        ((signs(200_001, 10, 0.2, 0), signs(200_001, 10, 0.0, 1)), 0.46474217570758286,
         "y[0] < 1 (more likely under x')"),
        ((noisy_label(1, 150_001, 2), noisy_label(0, 150_001, 3)), 0.9507768990186308,
         "y[50] > 0 (more likely under x)"),
    ]:
        assert (lower_bound(x, x_prime, ALPHA).epsilon, lower_bound(x, x_prime, ALPHA).event) == (bound, event)


# The peak resident memory of this process's own address space (VmHWM, which starts afresh at exec;
# getrusage's ru_maxrss also counts the parent's resident memory at the fork: a large test process's).
PEAK_SCRIPT = """
import re, sys, torch
from ldpbench import mechanisms
from ldpbench.audit import audit
torch.set_num_threads(1)
mechanism = mechanisms.create("flat-release", 1.0, int(sys.argv[1]), {}, classes=2)
for samples in map(int, sys.argv[2:]):
    audit(mechanism, {}, samples=samples)
    status = open("/proc/self/status").read()
    print(int(re.search(r"VmHWM:\\s+(\\d+) kB", status).group(1)) / 1024)
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the peak memory from /proc")
@pytest.mark.parametrize("dims", [4, 16])
def test_the_audit_holds_a_few_values_a_sample_within_the_memory_it_declares(dims):
    # Reports 5 wide (features and label: their first halves held) and 17 wide (drawn again for
    # each pass; 8 coordinates' projections held): the peak resident memory of a fresh process grows
    # by at most MEMORY_BYTES_PER_SAMPLE a sample from an audit of 2·10⁵ reports per input (calls
    # of as many clients as the larger one's) to one of 2·10⁶, whatever the width, and stays within
    # what memory_mib declares. Holding every report, it grew by 280 and 810 MiB.
    small, large = 200_000, 2_000_000
    peaks = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, str(dims), str(small), str(large)],
                           check=True, capture_output=True, text=True).stdout.split()
    small_peak, large_peak = map(float, peaks)
    assert large_peak - small_peak <= (large - small) * MEMORY_BYTES_PER_SAMPLE / 2**20, peaks
    assert large_peak <= memory_mib(large), peaks
