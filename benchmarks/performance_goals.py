"""ldpbench's performance goals, each beside its reference, in one table; the targets are set here.

    python benchmarks/performance_goals.py [--campaign] [--profile CAMPAIGN ...] [--quick]
        [--out benchmarks/results/performance_goals.json]

Runs, each in its own process, the benchmarks that measure the goals and reads their JSON records:
engine_throughput (goal 1: every network's round against the plain per-client loop the benchmark
contains; goal 7: every deep network's round 1.5 times faster than that loop and than pfl-research,
which the benchmark runs where it is installed; goal 6 with --device cuda where a GPU is present),
linear_round --scaling (goal 2: Adult's FedSGD flat-PM round against the hand-written floor; goal 5:
the round from d = 10³ to 10⁵ against the floor), mechanism_throughput --references-only (goal 3: the
keyed uniform draw, and PM, HM and Duchi on every coordinate against the numpy implementation of the
same law); with --campaign, campaign_throughput --default (goal 4: the default campaign from scratch
within 20 s on 2 cores, with syn-L alone and with Adult from the mirror, beside syn-L's campaign in
fresh processes); with --profile, run_profile for each campaign file given (goal 8: a paper
campaign's cells at most 15 % of their time outside the rounds). Each row gives the figure, its
reference measured in the same run, their ratio, the target and whether it is met; the rows and the
machine go to --out as JSON. Not a test: nothing here asserts a speed. --quick: tiny sizes, to check
that the script runs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling result_file.py, however this file is loaded
from campaign_throughput import DEFAULT_SYN_L  # noqa: E402
from result_file import write_result_file  # noqa: E402

HERE = Path(__file__).resolve().parent
PER_COORDINATE = ("pm", "hm", "duchi")
DRAW_TARGET = 300e6  # uniform float32 values per second on one core, at 10⁷ values
# The deep networks' scenarios of engine_throughput, and how much faster than each reference their rounds
# are to be.
DEEP_SCENARIOS = ("lenet5-", "bitrand-mlp-")
DEEP_SPEEDUP = 1.5
PROFILE_TARGET = 0.15  # share of a run's time outside its rounds
DEFAULT_CAMPAIGN_TARGET = 20.0  # seconds of wall, from scratch on 2 cores


def _row(goal: str, what: str, figure: float, unit: str, reference: float | None, reference_name: str,
         ratio: float | None, target: str, met: bool | None) -> dict[str, Any]:
    return {"goal": goal, "what": what, "figure": figure, "unit": unit, "reference": reference,
            "reference_name": reference_name, "ratio": ratio, "target": target, "met": met}


def engine_goals(record: dict, goal: str = "1") -> list[dict]:
    """Goal 1 (goal 6 on CUDA): the engine's round over the plain per-client loop, at most 1.0; goal 7 (on
    the CPU): every deep network's round at least DEEP_SPEEDUP times faster than the loop and than
    pfl-research doing the same work, where it is installed (ratio = reference time / ours)."""
    rows = []
    for result in record["results"]:
        ratio = result["engine_round_seconds"] / result["loop_seconds_per_round"]
        what = f"{result['scenario']} round ({result['device']})"
        rows.append(_row(goal, what, result["engine_round_seconds"], "s",
                         result["loop_seconds_per_round"], "per-client loop", ratio, "ratio ≤ 1.0", ratio <= 1.0))
        if goal != "1" or not result["scenario"].startswith(DEEP_SCENARIOS):
            continue
        target = f"ratio ≥ {DEEP_SPEEDUP:g}"
        speedup = result["loop_seconds_per_round"] / result["engine_round_seconds"]
        rows.append(_row("7", what, result["engine_round_seconds"], "s", result["loop_seconds_per_round"],
                         "per-client loop", speedup, target, speedup >= DEEP_SPEEDUP))
        peer = result.get("pfl_seconds_per_round")
        rows.append(_row("7", what, result["engine_round_seconds"], "s", peer,
                         "pfl-research" if peer is not None else "pfl-research (not installed: not measured)",
                         None if peer is None else peer / result["engine_round_seconds"], target,
                         None if peer is None else peer / result["engine_round_seconds"] >= DEEP_SPEEDUP))
    return rows


def linear_goals(record: dict) -> list[dict]:
    """Goal 2 (Adult's round, at most 2× the floor) and goal 5 (every d, at most 1.5× the floor)."""
    rows = []
    for result in record["results"]:
        adult = result["data"].startswith("official Adult") or result["dims"] == 123
        goal, limit = ("2", 2.0) if adult else ("5", 1.5)
        rows.append(_row(goal, f"FedSGD flat-PM round, cohort {result['cohort']}, d = {result['dims']} "
                               f"({result['draws']})", result["seconds_per_round"], "s",
                         result["floor_seconds_per_round"], "hand-written floor", result["ratio"],
                         f"ratio ≤ {limit:g}", result["ratio"] <= limit))
    return rows


def mechanism_goals(record: dict) -> list[dict]:
    """Goal 3: the keyed draw at ≥ 300 M values/s (at its largest shape) and the per-coordinate
    perturbers at ≥ 5× their numpy reference at every shape (ratio = reference time / ours)."""
    rows = []
    results = record["results"]
    draws = [r for r in results if r["mechanism"] == "streams.rand"]
    largest = max((r["clients"] * r["dims"] for r in draws), default=0)
    for result in draws:
        shape = f"{result['clients']} × {result['dims']}"
        at_target = result["clients"] * result["dims"] == largest
        rows.append(_row("3", f"keyed uniform draw, {shape}", result["values_per_second"], "values/s",
                         result["reference_values_per_second"], result["reference"], result["ratio"],
                         "≥ 300 M/s at the largest shape" if at_target else "(for scale)",
                         result["values_per_second"] >= DRAW_TARGET if at_target else None))
    for result in results:
        if result["mechanism"] in PER_COORDINATE and "reference" in result:
            rows.append(_row("3", f"{result['mechanism']} on every coordinate, {result['clients']} × {result['dims']}",
                             result["values_per_second"], "values/s", result["reference_values_per_second"],
                             result["reference"], result["ratio"], "ratio ≥ 5", result["ratio"] >= 5))
    return rows


def campaign_goals(record: dict) -> list[dict]:
    """Goal 4: the default campaign from scratch within DEFAULT_CAMPAIGN_TARGET s of wall with syn-L alone
    and with Adult, beside syn-L's campaign with every job a fresh process."""
    walls = {(r["workload"], r["worker"]): r["wall_seconds"] for r in record["results"]
             if r["workload"].startswith("default campaign")}
    reference = walls.get((DEFAULT_SYN_L, False))
    return [_row("4", f"{workload} from scratch, {record.get('cores')} cores", wall, "s wall", reference,
                 "syn-L, fresh processes", None if reference is None else wall / reference,
                 f"≤ {DEFAULT_CAMPAIGN_TARGET:g} s", wall <= DEFAULT_CAMPAIGN_TARGET)
            for (workload, worker), wall in walls.items() if worker]


def profile_goals(record: dict) -> list[dict]:
    """Goal 8: a paper campaign's cells spend at most PROFILE_TARGET of their time outside the rounds (at
    their planned rounds, measured or, with --profile-rounds, scaled; the reference is the whole cell's
    wall time)."""
    campaign = Path(record["campaign"]).stem
    return [_row("8", f"{campaign}: {row['label']} ({row['dataset']}), share outside the rounds",
                 row["share_outside_rounds_at_planned_rounds"], "of wall", row["wall_seconds"], "cell's wall s", None,
                 f"≤ {PROFILE_TARGET:.0%}", row["share_outside_rounds_at_planned_rounds"] <= PROFILE_TARGET)
            for row in record["results"]]


def _run(script: str, arguments: list[str], out: Path) -> dict:
    command = [sys.executable, str(HERE / script), *arguments, "--out", str(out)]
    print("$", " ".join(command[1:]), flush=True)
    subprocess.run(command, check=True)
    return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--campaign", action="store_true", help="also goal 4 (three default campaigns: minutes)")
    parser.add_argument("--profile", nargs="*", default=[], metavar="CAMPAIGN",
                        help="also goal 8 for these campaign files (run_profile.py: their data prepared first)")
    parser.add_argument("--profile-rounds", type=int, default=None,
                        help="cap each profiled run's rounds (default: as planned; the share is then measured, "
                             "not scaled)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks that everything runs")
    parser.add_argument("--out", default="benchmarks/results/performance_goals.json")
    args = parser.parse_args(argv)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        quick = ["--quick"] if args.quick else []
        rows += engine_goals(_run("engine_throughput.py", quick, scratch / "engine.json"))
        if torch.cuda.is_available():
            rows += engine_goals(_run("engine_throughput.py", [*quick, "--device", "cuda"], scratch / "cuda.json"),
                                 goal="6")
        linear = ["--repetitions", "10", "--dims", "1000", "--cohorts", "100"] if args.quick else []
        rows += linear_goals(_run("linear_round.py", ["--scaling", *linear], scratch / "linear.json"))
        sizes = ["--clients", "100", "--dims", "100", "--repetitions", "2"] if args.quick else \
            ["--clients", "1000", "--dims", "100", "10000"]
        rows += mechanism_goals(_run("mechanism_throughput.py", ["--references-only", *sizes], scratch / "mech.json"))
        if args.campaign:
            rows += campaign_goals(_run("campaign_throughput.py", ["--default", "--grids", "--reference-grids"],
                                        scratch / "campaign.json"))
        for campaign in args.profile:
            capped = [] if args.profile_rounds is None else ["--rounds", str(args.profile_rounds)]
            rows += profile_goals(_run("run_profile.py", [campaign, *capped],
                                       scratch / f"profile-{Path(campaign).stem}.json"))
    if not torch.cuda.is_available():
        rows.append(_row("6", "GPU rounds", float("nan"), "", None, "", None, "measured where a GPU is present", None))
    print(f"\n{'goal':4s} {'what':66s} {'figure':>10s} {'reference':>10s} {'(of)':24s} {'ratio':>6s}  "
          f"{'target':31s} met")
    for row in rows:
        reference = "" if row["reference"] is None else f"{row['reference']:.4g}"
        ratio = "" if row["ratio"] is None else f"{row['ratio']:.2f}"
        met = {True: "yes", False: "NO", None: "-"}[row["met"]]
        print(f"{row['goal']:4s} {row['what'][:66]:66s} {row['figure']:10.4g} {reference:>10s} "
              f"{row['reference_name'][:24]:24s} {ratio:>6s}  {row['target'][:31]:31s} {met}")
    write_result_file("performance_goals", rows, args.out, quick=args.quick,
                      cuda=torch.cuda.get_device_name() if torch.cuda.is_available() else None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
