"""The campaign report: figures and tables from the Parquet tables, as one HTML page.

Figures (in percent, as the tables; every axis labelled: ldpbench/results/figure_axes.py): accuracy and
AUC vs ε per dataset × model, one line per mechanism with its 95 % CI band (non-private baselines and a
constant predictor's level as horizontal lines: the majority class for accuracy, 0.5 for AUC);
convergence curves and accuracy against the uplink bits sent so far, at the ε most mechanisms ran at
(ties: nearest 2), with the majority class's level.
Tables: claimed and worst-case ε beside uplink bits, accuracy and AUC for every configuration;
the provenance of pretrained features.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from ldpbench.atomic import atomic_path, write_text  # noqa: E402
from ldpbench.audit import read_table as read_audit_table  # noqa: E402
from ldpbench.layout import (  # noqa: E402
    ACCURACY_FIGURE,
    AGGREGATE_TABLES,
    AUC_FIGURE,
    COMMUNICATION_FIGURE,
    CURVES_FIGURE,
    FIGURES_DIR,
    PARETO_BITS_FIGURE,
    PARETO_EPSILON_FIGURE,
    PREPARED_META,
    REPORT_INDEX,
    TABLES,
    TABLES_DIR,
    table_file,
)
from ldpbench.results.figure_axes import constant_line, labelled_log_axis, percent_axis  # noqa: E402
from ldpbench.results.palette import mechanism_palette  # noqa: E402
from ldpbench.results.report_claims import audit_section, scorecard_section  # noqa: E402
from ldpbench.results.report_html import cell_text, figure, render, table  # noqa: E402
from ldpbench.results.report_verdicts import (  # noqa: E402
    comparisons_section,
    convergence_note,
    interval,
    pareto_figure,
    percent,
    read_table,
    tuning_section,
    unconverged_mark,
    verdict_section,
)
from ldpbench.results.schema import headed, heading  # noqa: E402
from ldpbench.results.tables import bounded_interval, trivial_metrics  # noqa: E402

PNG_DPI = 150
# The ε of FedSel's Table 3 section (its numbers are claims in config/paper_claims/fedsel-table3.yaml).
TABLE3_EPSILON = 2.0


def _save(figure, target: Path) -> None:
    """`target` (a .png path) as PNG and, beside it, as SVG (vector, for papers and zooming)."""
    for ax in figure.axes:  # facet titles: "dataset · model", without seaborn's "panel = "
        ax.set_title(ax.get_title().removeprefix("panel = "))
    target.parent.mkdir(parents=True, exist_ok=True)
    # The layout and the tight box are found once, at the PNG's resolution as savefig finds them for it,
    # and both files are cut to that box: with bbox_inches="tight", or any layout engine left on the
    # figure (seaborn's tight_layout leaves a placeholder), savefig draws the figure twice per file.
    shown_dpi = figure.dpi
    figure.set_dpi(PNG_DPI)
    renderer = figure.canvas.get_renderer()
    figure.draw_without_rendering()
    tight = figure.get_tightbbox(renderer).padded(plt.rcParams["savefig.pad_inches"])
    figure.set_dpi(shown_dpi)
    figure.set_layout_engine(None)  # laid out by the draw above
    for path, form, options in ((target, "png", {"dpi": PNG_DPI}),
                                (target.with_suffix(".svg"), "svg", {"metadata": {"Date": None}})):
        with atomic_path(path) as tmp:
            figure.savefig(tmp, format=form, bbox_inches=tight, **options)
    plt.close(figure)


def with_panels(frame: pd.DataFrame) -> pd.DataFrame:
    """One figure panel per (dataset, model) that ran: data sets with their own models (DiffSketch:
    softmax on MNIST, char-LSTM on Shakespeare) leave no empty panels, as a dataset × model grid would."""
    return frame.assign(panel=frame["dataset"].astype(str) + " · " + frame["model"].astype(str))


def panel_layout(frame: pd.DataFrame) -> dict:
    panels = sorted(frame["panel"].unique())
    return {"col_order": panels, "col_wrap": min(len(panels), 3)}


# (summary columns of the mean and its CI, axis label)
METRICS = {
    "accuracy": ("mean", "ci95_low", "ci95_high", "test accuracy"),
    "auc": ("auc_mean", "auc_ci95_low", "auc_ci95_high", "test AUC"),
}


def constant_level(summary: pd.DataFrame, metric: str) -> tuple[float, str] | None:
    """The level a constant predictor reaches on a panel's rows, and its legend label: the majority
    class's test accuracy (the mean over the runs' splits), or AUC 0.5; None where unknown."""
    if metric == "auc":
        return 0.5, "constant predictor (AUC 0.5)"
    rates = summary["majority_accuracy"].dropna() if "majority_accuracy" in summary else pd.Series(dtype=float)
    if rates.empty:
        return None
    rate = float(rates.mean())
    return rate, f"majority class ({100 * rate:.1f} %)"


def metric_figure(summary: pd.DataFrame, target: Path, palette: dict, metric: str = "accuracy") -> None:
    """Test accuracy (or AUC) against ε per dataset × model; non-private runs as dashed lines and a
    constant predictor's level (the majority class's accuracy, AUC 0.5) as a dotted line: a
    configuration at that line has learnt nothing."""
    mean, low, high, ylabel = METRICS[metric]
    summary = with_panels(summary)
    private = summary[np.isfinite(summary["epsilon"])]
    baselines = summary[~np.isfinite(summary["epsilon"])]
    grid = sns.FacetGrid(summary, col="panel", height=3.4, aspect=1.3, sharey=False, despine=True,
                         **panel_layout(summary))
    for panel, ax in grid.axes_dict.items():
        here = summary["panel"] == panel
        cell = private[private["panel"] == panel]
        for label, line in cell.groupby("label"):
            line = line.sort_values("epsilon")
            ax.plot(line["epsilon"], line[mean], marker="o", color=palette[label], label=label)
            ax.fill_between(line["epsilon"], line[low], line[high],
                            color=palette[label], alpha=0.2, linewidth=0)
        for _, base in baselines[baselines["panel"] == panel].iterrows():
            ax.axhline(base[mean], color=palette[base["label"]], linestyle="--",
                       label=f"{base['label']} (ε = ∞)")
            if math.isfinite(base[low]):
                ax.axhspan(base[low], base[high], color=palette[base["label"]], alpha=0.1)
        constant_line(ax, constant_level(summary.loc[here], metric))
        if len(cell):
            ax.set_xscale("log", base=2)
            labelled_log_axis(ax, base=2)
        ax.set_xlabel("ε (see the ε columns of the tables)")
        percent_axis(ax, ylabel)
    _figure_legend(grid)
    _save(grid.figure, target)


def accuracy_levels(summary: pd.DataFrame) -> dict[str, tuple[float, str] | None]:
    """Each panel's majority-class level (constant_level), for the figures of test accuracy over time."""
    return {panel: constant_level(rows, "accuracy") for panel, rows in with_panels(summary).groupby("panel")}


def accuracy_panels(grid, levels: dict, log_x: bool = False) -> None:
    """Every panel of a test-accuracy figure: in percent, with its majority-class line (and the x axis of
    costs, on a log scale, labelled)."""
    for panel, ax in grid.axes_dict.items():
        constant_line(ax, levels.get(panel))
        percent_axis(ax, "test accuracy")
        if log_x:
            ax.set_xscale("log")
            labelled_log_axis(ax)


def student_t_band(values) -> tuple[float, float]:
    """The band of the curve figures: the tables' 95 % interval of the mean over seeds (logit-scale
    t, inside [0, 1]; the curves are averaged over folds first, see seed_curves). Seaborn's default
    bootstrap draws unseeded, so its band changed from one report to the next."""
    _, _, low, high = bounded_interval(np.asarray(values, dtype=float))
    return low, high


def seed_curves(frame: pd.DataFrame, x: str) -> pd.DataFrame:
    """One curve per seed: each seed's folds averaged at every x, so that the band is over seeds (the
    replicate), as in the tables."""
    keys = ["panel", "label", "seed", x]
    return frame.groupby(keys, as_index=False, sort=True)["test_accuracy"].mean()


def _figure_legend(grid) -> None:
    handles, names = [], []
    for ax in grid.axes.flat:
        for handle, name in zip(*ax.get_legend_handles_labels()):
            if name not in names:
                handles.append(handle)
                names.append(name)
    # Beside the panels, not above them, where a long list would cover the facet titles.
    grid.figure.legend(handles, names, loc="center left", ncol=1 if len(names) <= 14 else 2,
                       bbox_to_anchor=(1.0, 0.5), frameon=False)


def communication_frame(runs: pd.DataFrame, curves: pd.DataFrame, epsilon: float) -> pd.DataFrame:
    """Test accuracy against the uplink bits sent so far (all clients), per evaluated round.

    Update mechanisms send the same number of reports every round (the cohort), so the bits after
    round r are r·(total bits / rounds). Data releases (BitRand and its baselines) upload once,
    before training, and are left out. Runs at `epsilon` and non-private runs.
    """
    from ldpbench import mechanisms
    from ldpbench.mechanisms.base import UPDATES

    privatises = {name: mechanisms.get(name).privatises for name in runs["mechanism"].unique()}
    chosen = runs[((runs["epsilon"] == epsilon) | ~np.isfinite(runs["epsilon"]))
                  & (runs["mechanism"].map(privatises) == UPDATES) & (runs["rounds"] > 0)]
    per_round = (chosen["uplink_bits_total"] / chosen["rounds"]).rename("bits_per_round")
    frame = curves.merge(pd.concat([chosen["run_id"], per_round], axis=1), on="run_id")
    frame = frame[frame["round"] > 0]
    return frame.assign(uplink_bits=frame["round"] * frame["bits_per_round"])


def communication_figure(runs: pd.DataFrame, curves: pd.DataFrame, target: Path, epsilon: float,
                         palette: dict, levels: dict) -> bool:
    frame = communication_frame(runs, curves, epsilon)
    if frame.empty:
        return False
    frame = seed_curves(with_panels(frame), "uplink_bits")
    grid = sns.relplot(data=frame, x="uplink_bits", y="test_accuracy", hue="label", col="panel",
                       kind="line", errorbar=student_t_band, height=3.2, aspect=1.3,
                       palette=palette, hue_order=sorted(frame["label"].unique()),
                       facet_kws={"sharey": False, "sharex": False}, **panel_layout(frame))
    grid.set_axis_labels("uplink bits sent by all clients so far", "test accuracy")
    accuracy_panels(grid, levels, log_x=True)
    grid.figure.suptitle(f"Accuracy against total communication at ε = {epsilon:g} "
                         "(update mechanisms; non-private runs for reference)", y=1.02)
    _save(grid.figure, target)
    return True


def reference_epsilon(summary: pd.DataFrame) -> float:
    """The ε of the convergence and communication figures: the one most mechanisms ran at
    (sqSGD's grid has most at 400), ties broken by closeness to 2 on a log scale."""
    private = summary[np.isfinite(summary["epsilon"])]
    if private.empty:
        return math.inf
    counts = private.groupby("epsilon")["label"].nunique()
    best = counts[counts == counts.max()].index.to_numpy(dtype=float)
    return float(best[np.argmin(np.abs(np.log(best / 2.0)))])


def curves_figure(curves: pd.DataFrame, target: Path, epsilon: float, palette: dict, levels: dict) -> None:
    shown = curves[(curves["epsilon"] == epsilon) | ~np.isfinite(curves["epsilon"])]
    shown = seed_curves(with_panels(shown), "round")
    grid = sns.relplot(data=shown, x="round", y="test_accuracy", hue="label", col="panel",
                       kind="line", errorbar=student_t_band, height=3.2, aspect=1.3,
                       palette=palette, hue_order=sorted(shown["label"].unique()),
                       facet_kws={"sharey": False, "sharex": False}, **panel_layout(shown))
    grid.set_axis_labels("round", "test accuracy")
    accuracy_panels(grid, levels)
    grid.figure.suptitle(f"Convergence at ε = {epsilon:g} (non-private runs for reference)", y=1.02)
    _save(grid.figure, target)


def with_interval_percent(mean: float, low: float, high: float) -> str:
    """A mean and its 95 % interval in percent: "81.93 [80.10, 83.75]"; the mean alone without one."""
    shown = percent(mean)
    bounds = interval(low, high)
    return shown if bounds == "–" or shown == "–" else f"{shown} {bounds}"


def results_table(summary: pd.DataFrame) -> pd.DataFrame:
    table = summary.sort_values(["dataset", "model", "label", "epsilon"])
    total = table["epsilon_worst_case_client_total"] if "epsilon_worst_case_client_total" in table else \
        table["epsilon_worst_case_client_max"]
    return pd.DataFrame({
        "dataset": table["dataset"], "model": table["model"], "mechanism": table["label"],
        heading("summary", "epsilon"): table["epsilon"],
        "accuracy % [95 % CI]": [with_interval_percent(*v) for v in
                                 zip(table["mean"], table["ci95_low"], table["ci95_high"])],
        "AUC % [95 % CI]": [with_interval_percent(*v) for v in
                            zip(table["auc_mean"], table["auc_ci95_low"], table["auc_ci95_high"])],
        "majority class %": [cell_text(100 * rate, 2) if pd.notna(rate) else "–"
                             for rate in table.get("majority_accuracy", pd.Series(math.nan, index=table.index))],
        "trivial": [trivial_mark(row) for row in table.to_dict("records")],
        "seeds": table["seeds"] if "seeds" in table else "–",
        "runs ok/all": [f"{a}/{b}" for a, b in zip(table["runs_ok"], table["runs"])],
        **headed("summary", table, ["epsilon_claimed_per_report", "epsilon_worst_case_per_report",
                                    "epsilon_claimed_client_max", "epsilon_worst_case_client_max"]),
        heading("summary", "epsilon_worst_case_client_total"): total,
        **headed("summary", table, ["bits_per_report"]),
        "converged": [unconverged_mark(row) or "yes" for row in table.to_dict("records")],
    })


def trivial_mark(row: dict) -> str:
    """'accuracy', 'AUC', both or '' : where the configuration is not shown better than a constant
    predictor (the majority class; AUC 0.5)."""
    return ", ".join({"test_accuracy": "accuracy", "test_auc": "AUC"}[metric] for metric in trivial_metrics(row))


def best_private(summary: pd.DataFrame) -> pd.Series:
    """Per dataset, model and ε, the private configuration(s) of the highest mean accuracy, aligned
    with results_table's rows (whether the lead is real is the verdict table's to say)."""
    table = summary.sort_values(["dataset", "model", "label", "epsilon"])
    private = table[np.isfinite(table["epsilon"])]
    top = private.groupby(["dataset", "model", "epsilon"])["mean"].transform("max")
    return pd.Series(table.index.isin(private.index[private["mean"] == top]), index=table.index)


def accounting_table(summary: pd.DataFrame) -> pd.DataFrame:
    table = summary.drop_duplicates(["label", "epsilon", "dataset"]).sort_values(["label", "dataset", "epsilon"])
    return pd.DataFrame({
        "mechanism": table["label"], "registry name": table["mechanism"],
        "parameters": table["mechanism_params"], "dataset": table["dataset"],
        **headed("summary", table, ["epsilon", "epsilon_claimed_per_report", "epsilon_worst_case_per_report",
                                    "bits_per_report"]),
    })


def provenance_table(runs: pd.DataFrame) -> pd.DataFrame:
    """The pretrained features behind the runs: one row per (dataset, encoder), from the runs."""
    if "features_provenance" not in runs:
        return pd.DataFrame()
    rows = []
    for (dataset, text), _ in runs.dropna(subset=["features_provenance"]).groupby(
            ["dataset", "features_provenance"], sort=True):
        provenance = json.loads(text)
        rows.append({
            "dataset": dataset, "encoder": provenance.get("encoder"), "dim": provenance.get("dim"),
            "weights": provenance.get("source") or provenance.get("weights"),
            "weights sha256": provenance.get("weights_sha256"), "pooling": provenance.get("pooling"),
            "preprocessing": provenance.get("text_preprocessing") or provenance.get("image_preprocessing"),
        })
    return pd.DataFrame(rows)


def provenance_section(runs: pd.DataFrame) -> str:
    features = provenance_table(runs)
    if features.empty:
        return ""
    return render("provenance.html.j2", features=table(features), prepared_meta=PREPARED_META,
                  runs_table=table_file(TABLES_DIR, "runs"))


def _paired_points(comparisons: pd.DataFrame | None, dataset: str, model: str, first: str, second: str) -> dict:
    """first − second in points from the accuracy comparisons at Table 3's ε: the 95 % interval of the
    paired mean difference and its Holm-adjusted p-value (NaN without a comparison of the two)."""
    missing = {"low": math.nan, "high": math.nan, "p": math.nan}
    if comparisons is None:
        return missing
    family = comparisons[(comparisons["dataset"] == dataset) & (comparisons["model"] == model)
                         & (comparisons["epsilon"] == TABLE3_EPSILON) & (comparisons["metric"] == "test_accuracy")]
    for a, b, sign in ((first, second, 1.0), (second, first, -1.0)):
        pair = family[(family["mechanism_a"] == a) & (family["mechanism_b"] == b)]
        if len(pair):
            row = pair.iloc[0]
            low, high = sorted((100 * sign * row["ci95_low"], 100 * sign * row["ci95_high"]))
            return {"low": low, "high": high, "p": row["p_value_adjusted"]}
    return missing


def claimed_differences(scorecard: pd.DataFrame | None) -> dict[tuple[str, str, float, str, str], float]:
    """The papers' differences (first − second, in points) that the campaign's scorecard read, by dataset, model,
    ε and the two mechanisms' labels: the numbers live once, in config/paper_claims/, and the scorecard carries
    the ones the campaign covers."""
    if scorecard is None:
        return {}
    differences = scorecard[scorecard["relation"] == "difference"]
    return {(row.dataset, row.model, float(row.epsilon), *row.mechanisms.split(" vs ", 1)): float(row.paper_value)
            for row in differences.itertuples(index=False)}


def fedsel_gain_loss(summary: pd.DataFrame, comparisons: pd.DataFrame | None = None,
                     scorecard: pd.DataFrame | None = None) -> pd.DataFrame:
    """FedSel Table 3 from our results: at ε = 2, gain = acc(X-PM-C) − acc(PM) and
    loss = acc(X-PM-C) − acc(X-PM) in percentage points, beside the paper's values: the claims of the
    same two labels that the campaign's scorecard read (config/paper_claims/fedsel-table3.yaml), NaN without one.

    With the campaign's comparisons, each also gets the 95 % interval of the paired mean difference
    over the shared seeds (each seed's folds averaged) and its Holm-adjusted p-value (the family: every mechanism of the
    (dataset, model) at ε = 2). Mechanisms are identified by registry name and the `control`
    parameter, not by label. Empty when the campaign lacks PM or the X-PM / X-PM-C pairs at ε = 2.
    """
    at = summary[summary["epsilon"] == TABLE3_EPSILON].copy()
    params = [json.loads(p) for p in at["mechanism_params"]]
    at["control"] = [bool(p.get("control", False)) for p in params]
    # Flat PM is the sampling one (Wang et al. Alg. 4), not the anonymizer accounting; the summary
    # carries every parameter with its default applied ({"anonymizer": false}).
    at["anonymizer"] = [bool(p.get("anonymizer", False)) for p in params]
    claimed = claimed_differences(scorecard)
    rows = []
    for (dataset, model), cell in at.groupby(["dataset", "model"], sort=True):
        flat = cell[(cell["mechanism"] == "pm") & ~cell["anonymizer"]]
        for selector in ("exp", "pe", "ps"):
            two_stage = cell[cell["mechanism"] == f"{selector}-pm"]
            plain, control = two_stage[~two_stage["control"]], two_stage[two_stage["control"]]
            if flat.empty or plain.empty or control.empty:
                continue
            labels = control["label"].iloc[0], flat["label"].iloc[0], plain["label"].iloc[0]
            gain = _paired_points(comparisons, dataset, model, labels[0], labels[1])
            loss = _paired_points(comparisons, dataset, model, labels[0], labels[2])
            paper = [claimed.get((dataset, model, TABLE3_EPSILON, labels[0], other), math.nan) for other in labels[1:]]
            rows.append({
                "dataset": dataset, "model": model, "selector": selector.upper(),
                "gain (ours)": 100 * (control["mean"].iloc[0] - flat["mean"].iloc[0]),
                "gain ci95_low": gain["low"], "gain ci95_high": gain["high"], "gain p (Holm)": gain["p"],
                "gain (paper)": paper[0],
                "loss (ours)": 100 * (control["mean"].iloc[0] - plain["mean"].iloc[0]),
                "loss ci95_low": loss["low"], "loss ci95_high": loss["high"], "loss p (Holm)": loss["p"],
                "loss (paper)": paper[1],
                "acc PM": flat["mean"].iloc[0], f"acc {selector.upper()}-PM": plain["mean"].iloc[0],
                f"acc {selector.upper()}-PM-C": control["mean"].iloc[0],
            })
    return pd.DataFrame(rows)


def _with_interval(value: float, low: float, high: float, p_value: float) -> str:
    if not np.isfinite(low):
        return f"{value:+.2f}"
    return f"{value:+.2f} [{low:+.2f}, {high:+.2f}], p = {p_value:.2g}"


def gain_loss_section(summary: pd.DataFrame, comparisons: pd.DataFrame | None, scorecard: pd.DataFrame | None) -> str:
    rows = fedsel_gain_loss(summary, comparisons, scorecard)
    if rows.empty:
        return ""
    compact = pd.DataFrame({
        "dataset": rows["dataset"], "model": rows["model"], "selector": rows["selector"],
        "gain (ours)": [_with_interval(*v) for v in zip(rows["gain (ours)"], rows["gain ci95_low"],
                                                        rows["gain ci95_high"], rows["gain p (Holm)"])],
        "gain (paper)": rows["gain (paper)"],
        "loss (ours)": [_with_interval(*v) for v in zip(rows["loss (ours)"], rows["loss ci95_low"],
                                                        rows["loss ci95_high"], rows["loss p (Holm)"])],
        "loss (paper)": rows["loss (paper)"],
    })
    return render("gain_loss.html.j2", epsilon=TABLE3_EPSILON, gain_loss=table(compact))


def build_report(tables_dir: str | Path, report_dir: str | Path, audit: str | Path | None = None,
                 scorecard: str | Path | None = None) -> Path:
    """The report of the tables in `tables_dir`, with the sections of the privacy audit and the
    reproduction scorecard when their tables are given."""
    tables_dir, report_dir = Path(tables_dir), Path(report_dir)
    runs, curves, summary = (pd.read_parquet(table_file(tables_dir, name)) for name in AGGREGATE_TABLES)
    # Every table named on the command line is read before the first figure is drawn: a wrong path
    # fails at once, not after seconds of drawing.
    audit_table = None if audit is None else read_audit_table(audit)
    scorecard_table = None if scorecard is None else pd.read_parquet(scorecard)
    campaign = str(runs["campaign"].iloc[0])

    figures = report_dir / FIGURES_DIR
    palette = mechanism_palette(summary["label"])
    metric_figure(summary, figures / ACCURACY_FIGURE, palette, "accuracy")
    metric_figure(summary, figures / AUC_FIGURE, palette, "auc")
    curve_epsilon, levels = reference_epsilon(summary), accuracy_levels(summary)
    curves_figure(curves, figures / CURVES_FIGURE, curve_epsilon, palette, levels)
    communication = (figure(figures / COMMUNICATION_FIGURE, "test accuracy against uplink bits")
                     if communication_figure(runs, curves, figures / COMMUNICATION_FIGURE, curve_epsilon, palette,
                                             levels)
                     else None)
    pareto = [(what, figure(figures / name, f"Pareto front of accuracy against {what}"))
              for cost, name, what in (("epsilon", PARETO_EPSILON_FIGURE, "worst-case ε per client"),
                                       ("bits", PARETO_BITS_FIGURE, "uplink bits"))
              if pareto_figure(tables_dir, figures / name, palette, cost, _save)]
    started = pd.to_datetime(runs["started_at"]).min()
    finished = pd.to_datetime(runs["finished_at"]).max()
    diverged = runs[runs["status"] != "ok"]
    page = render(
        "report.html.j2", campaign=campaign, runs=len(runs), runs_ok=int((runs["status"] == "ok").sum()),
        datasets=sorted(runs["dataset"].unique()), models=sorted(runs["model"].unique()),
        compute_seconds=runs["wall_seconds"].sum(), started=started, finished=finished,
        elapsed_seconds=(finished - started).total_seconds(),
        verdicts=verdict_section(tables_dir), convergence=convergence_note(runs),
        accuracy_figure=figure(figures / ACCURACY_FIGURE, "test accuracy against epsilon"),
        auc_figure=figure(figures / AUC_FIGURE, "test AUC against epsilon"),
        curves_figure=figure(figures / CURVES_FIGURE, "test accuracy against round"),
        communication_figure=communication, comparisons=comparisons_section(tables_dir),
        scorecard=scorecard_section(scorecard_table), pareto_figures=pareto,
        tuning=tuning_section(tables_dir, summary), provenance=provenance_section(runs),
        gain_loss=gain_loss_section(summary, read_table(tables_dir, "comparisons"), scorecard_table),
        audit=audit_section(summary, audit_table), accounting=table(accounting_table(summary)),
        results=table(results_table(summary), best_private(summary)),
        diverged=None if diverged.empty else table(
            diverged[["run_id", "dataset", "model", "label", "epsilon", "seed", "fold", "rounds"]]),
        sources=[table_file(TABLES_DIR, name) for name in TABLES if table_file(tables_dir, name).exists()])
    target = report_dir / REPORT_INDEX
    write_text(target, page + "\n")  # the template's last newline is dropped (report_html.render)
    return target
