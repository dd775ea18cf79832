"""The report's verdict sections: the verdict table it opens with, the pairwise comparisons and
rankings, the Pareto fronts, the tuning and its privacy cost, and the convergence marks.

Each section is built from the campaign's tables alone (ldpbench.results.compare, ldpbench.tuning,
ldpbench.results.convergence) and is left out when its tables are absent (a campaign without a
`tuning:` section has no tuning tables). Its words and markup are its template's (templates/verdicts.html.j2,
comparisons, tuning, convergence; ldpbench.results.report_html).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from ldpbench.layout import table_file  # noqa: E402
from ldpbench.results.convergence import THRESHOLD, WINDOW  # noqa: E402
from ldpbench.results.figure_axes import labelled_log_axis, percent_axis  # noqa: E402
from ldpbench.results.report_html import render, table  # noqa: E402
from ldpbench.results.schema import headed, heading  # noqa: E402

ACCURACY = "test_accuracy"


def read_table(tables_dir: Path, name: str) -> pd.DataFrame | None:
    path = table_file(tables_dir, name)
    return pd.read_parquet(path) if path.exists() else None


def percent(value: float) -> str:
    return "–" if value is None or not np.isfinite(value) else f"{100 * value:.2f}"


def interval(low: float, high: float) -> str:
    return "–" if not (np.isfinite(low) and np.isfinite(high)) else f"[{100 * low:.2f}, {100 * high:.2f}]"


def unconverged_mark(summary_row) -> str:
    """"⚠ k/n unconverged" for a configuration with unconverged ok runs, else ""."""
    count = summary_row.get("runs_unconverged", 0)
    if count is None or (isinstance(count, float) and math.isnan(count)) or int(count) == 0:
        return ""
    return f"⚠ {int(count)}/{int(summary_row['runs_ok'])} unconverged"


def verdict_section(tables_dir: Path) -> str:
    verdicts, comparisons = read_table(tables_dir, "verdicts"), read_table(tables_dir, "comparisons")
    if verdicts is None or verdicts.empty:
        return ""
    shown = verdicts[verdicts["metric"] == ACCURACY].sort_values(["dataset", "model", "epsilon"])
    frame = pd.DataFrame({
        "dataset": shown["dataset"], "model": shown["model"], heading("verdicts", "epsilon"): shown["epsilon"],
        "verdict": shown["verdict"],
        "best accuracy (%)": [percent(v) for v in shown["best_mean"]],
        "95% CI (%)": [interval(lo, hi) for lo, hi in zip(shown["best_ci95_low"], shown["best_ci95_high"])],
        **headed("verdicts", shown, ["epsilon_worst_case_client_total", "bits_per_report", "n_pairs"]),
        "converged": ["⚠ not all runs" if flag else "yes" for flag in shown["unconverged"]],
    })
    test = "paired t-test"
    alpha = 0.05
    if comparisons is not None and not comparisons.empty:
        test, alpha = str(comparisons["test"].iloc[0]), float(comparisons["alpha"].iloc[0])
    return render("verdicts.html.j2", verdicts=table(frame), test=test, alpha=alpha)


def comparisons_section(tables_dir: Path) -> str:
    comparisons, rankings = read_table(tables_dir, "comparisons"), read_table(tables_dir, "rankings")
    if comparisons is None or rankings is None or rankings.empty:
        return ""
    separated = comparisons[(comparisons["metric"] == ACCURACY) & (comparisons["better"] != "tie")]
    pairs = pd.DataFrame({
        "dataset": separated["dataset"], "model": separated["model"], "ε": separated["epsilon"],
        "better": np.where(separated["better"] == "a", separated["mechanism_a"], separated["mechanism_b"]),
        "than": np.where(separated["better"] == "a", separated["mechanism_b"], separated["mechanism_a"]),
        "difference a − b (points)": [f"{100 * d:+.2f} [{100 * lo:+.2f}, {100 * hi:+.2f}]" for d, lo, hi in
                                      zip(separated["mean_diff"], separated["ci95_low"], separated["ci95_high"])],
        "pair (a, b)": separated["mechanism_a"] + ", " + separated["mechanism_b"],
        "adjusted p": separated["p_value_adjusted"], "effect size d_z": separated["effect_size"],
        "pairs": separated["n_pairs"],
    })
    ranked = rankings[rankings["metric"] == ACCURACY].sort_values(["dataset", "model", "epsilon", "rank"])
    ranking = pd.DataFrame({
        "dataset": ranked["dataset"], "model": ranked["model"], "ε": ranked["epsilon"], "rank": ranked["rank"],
        "mechanism": ranked["label"], "group": ranked["group"], "accuracy (%)": [percent(v) for v in ranked["mean"]],
        "Pareto (ε)": np.where(ranked["pareto_epsilon"], "yes", ""),
        "Pareto (bits)": np.where(ranked["pareto_bits"], "yes", ""),
    })
    return render("comparisons.html.j2", pairs=table(pairs), ranking=table(ranking))


def pareto_figure(tables_dir: Path, target: Path, palette: dict, cost: str, save: Callable) -> bool:
    """Mean accuracy against a cost (worst-case ε per client with tuning, or uplink bits) per panel,
    every private configuration a point, the Pareto front a step line."""
    rankings = read_table(tables_dir, "rankings")
    if rankings is None or rankings.empty:
        return False
    column, flag, label = {
        "epsilon": ("epsilon_worst_case_client_total", "pareto_epsilon", "worst-case ε per client (with tuning)"),
        "bits": ("uplink_bits_total_mean", "pareto_bits", "uplink bits sent by all clients")}[cost]
    shown = rankings[(rankings["metric"] == ACCURACY) & np.isfinite(rankings[column].astype(float))]
    if shown.empty:
        return False
    panels = sorted(shown.groupby(["dataset", "model"]).groups)
    figure, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    for ax, (dataset, model) in zip(axes[0], panels):
        panel = shown[(shown["dataset"] == dataset) & (shown["model"] == model)]
        for mechanism, points in panel.groupby("label"):
            ax.scatter(points[column], points["mean"], color=palette.get(mechanism), label=mechanism, s=22)
        front = panel[panel[flag]].sort_values(column)
        ax.step(front[column], front["mean"], where="post", color="black", linewidth=1, label="Pareto front")
        ax.set_xscale("log")
        labelled_log_axis(ax)
        ax.set_title(f"{dataset} · {model}")
        ax.set_xlabel(label)
        percent_axis(ax, "mean test accuracy")
    handles, names = [], []
    for ax in axes[0]:
        for handle, name in zip(*ax.get_legend_handles_labels()):
            if name not in names:
                handles.append(handle)
                names.append(name)
    figure.tight_layout()
    figure.legend(handles, names, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    save(figure, target)
    return True


def tuning_section(tables_dir: Path, summary: pd.DataFrame) -> str:
    selected = read_table(tables_dir, "selected")
    if selected is None or selected.empty:
        return ""
    merged = selected.merge(summary[["dataset", "model", "label", "epsilon", "epsilon_claimed_client_max",
                                     "epsilon_worst_case_client_max"]], on=["dataset", "model", "label", "epsilon"],
                            how="left").sort_values(["dataset", "model", "label", "epsilon"])
    frame = pd.DataFrame({
        "dataset": merged["dataset"], "model": merged["model"], "mechanism": merged["label"],
        heading("selected", "epsilon"): merged["epsilon"], "selected": merged["setting"],
        f"validation score ({merged['metric'].iloc[0]})": merged["score"],
        **headed("selected", merged, ["trials", "trial_runs"]),
        "claimed ε / client (final run)": merged["epsilon_claimed_client_max"],
        heading("summary", "epsilon_claimed_client_total"):
            merged["epsilon_claimed_client_max"] + merged["tuning_epsilon_claimed_client_max"],
        "worst-case ε / client (final run)": merged["epsilon_worst_case_client_max"],
        heading("summary", "epsilon_worst_case_client_total"):
            merged["epsilon_worst_case_client_max"] + merged["tuning_epsilon_worst_case_client_max"],
    })
    # Tuned on a split declared public, the trials are charged nothing; otherwise they spent the clients' budget.
    return render("tuning.html.j2", settings=table(frame), public=set(merged["tuning_data"]) == {"public"})


def convergence_note(runs: pd.DataFrame) -> str:
    if "converged" not in runs:
        return ""
    ok = runs[runs["status"] == "ok"]
    unconverged = int((~ok["converged"].astype(bool)).sum())
    stopped = int(ok["stopped_early"].fillna(False).astype(bool).sum()) if "stopped_early" in ok else 0
    return render("convergence.html.j2", unconverged=unconverged, finished=len(ok), threshold_percent=100 * THRESHOLD,
                  window_percent=100 * WINDOW, stopped=stopped)
