"""Report tables derived from the summary."""

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ldpbench.audit import DEFECT
from ldpbench.results.report import fedsel_gain_loss
from ldpbench.scorecard import load_claims, scorecard


def summary_row(mechanism, params, mean, epsilon=2.0, dataset="bank", model="lr"):
    return {"dataset": dataset, "model": model, "mechanism": mechanism, "mechanism_params": params,
            "epsilon": epsilon, "mean": mean, "label": mechanism}


def table3_scorecard(repo_root) -> pd.DataFrame:
    """The scorecard of FedSel's Table 3 claims (config/paper_claims/) as the scorecard step writes it, for a
    campaign that ran none of them: the paper's numbers without ours."""
    runs = pd.DataFrame(columns=["dataset", "model", "label", "epsilon"])
    return scorecard(load_claims([repo_root / "config/paper_claims/fedsel-table3.yaml"]), runs, pd.DataFrame(), None)


def test_fedsel_gain_loss_from_results_beside_the_claims_of_the_scorecard(repo_root):
    summary = pd.DataFrame([
        summary_row("pm", "{}", 0.80) | {"label": "PM"},
        summary_row("ps-pm", '{"control": false, "mu": 0.1}', 0.84) | {"label": "PS-PM"},
        summary_row("ps-pm", '{"control": true}', 0.85) | {"label": "PS-PM-C"},
        summary_row("exp-pm", "{}", 0.83) | {"label": "EXP-PM"},  # no control variant: no EXP row
        summary_row("pm", "{}", 0.70, epsilon=4.0) | {"label": "PM"},  # other ε are ignored
        summary_row("pm", "{}", 0.9, dataset="syn-S-0.1-0.9"),  # no pairs there
    ])
    table = fedsel_gain_loss(summary, scorecard=table3_scorecard(repo_root))
    assert list(table["selector"]) == ["PS"]
    row = table.iloc[0]
    assert row["gain (ours)"] == pytest.approx(5.0) and row["loss (ours)"] == pytest.approx(1.0)
    # FedSel's Table 3, bank, LR, PS: as config/paper_claims/fedsel-table3.yaml transcribes it
    assert (row["gain (paper)"], row["loss (paper)"]) == (2.5525, 0.1463)
    # without a scorecard (a campaign that names no such claims) the paper's numbers are missing, not invented
    assert math.isnan(fedsel_gain_loss(summary).iloc[0]["gain (paper)"])


def test_the_paper_column_pairs_each_claim_by_its_two_labels(repo_root):
    # A campaign whose labels are not the claims' reads no claim: its scorecard says "not run", and so
    # does the paper column.
    summary = pd.DataFrame([summary_row("pm", "{}", 0.80), summary_row("ps-pm", "{}", 0.84),
                            summary_row("ps-pm", '{"control": true}', 0.85) | {"label": "PS-PM-C"}])
    row = fedsel_gain_loss(summary, scorecard=table3_scorecard(repo_root)).iloc[0]
    assert math.isnan(row["gain (paper)"]) and math.isnan(row["loss (paper)"])


def test_fedsel_gain_loss_reads_parameters_with_their_defaults_applied():
    # Summaries carry every parameter with its default (run plans): flat PM is {"anonymizer": false};
    # PM with the anonymizer accounting is not Table 3's PM.
    fedsel = '{"auto_c": 1.0, "control": %s, "eta": 0.5, "k_fraction": 0.1, "mu": 0.1}'
    summary = pd.DataFrame([
        summary_row("pm", '{"anonymizer": false}', 0.80),
        summary_row("pm", '{"anonymizer": true}', 0.10),
        summary_row("pe-pm", fedsel % "false", 0.84),
        summary_row("pe-pm", fedsel % "true", 0.85),
    ])
    row = fedsel_gain_loss(summary).iloc[0]
    assert row["selector"] == "PE" and row["gain (ours)"] == pytest.approx(5.0) and row["acc PM"] == 0.80


def test_fedsel_gain_loss_carries_the_paired_intervals_of_the_comparisons():
    summary = pd.DataFrame([
        summary_row("pm", "{}", 0.80) | {"label": "PM"},
        summary_row("ps-pm", "{}", 0.84) | {"label": "PS-PM"},
        summary_row("ps-pm", '{"control": true}', 0.85) | {"label": "PS-PM-C"},
    ])
    family = {"dataset": "bank", "model": "lr", "epsilon": 2.0, "metric": "test_accuracy"}
    comparisons = pd.DataFrame([
        # stored as PM − PS-PM-C: the gain is its negation, the interval flipped
        family | {"mechanism_a": "PM", "mechanism_b": "PS-PM-C", "mean_diff": -0.05, "ci95_low": -0.07,
                  "ci95_high": -0.02, "p_value_adjusted": 0.001},
        family | {"mechanism_a": "PS-PM-C", "mechanism_b": "PS-PM", "mean_diff": 0.01, "ci95_low": -0.01,
                  "ci95_high": 0.03, "p_value_adjusted": 0.4},
        family | {"metric": "test_auc", "mechanism_a": "PS-PM-C", "mechanism_b": "PM", "mean_diff": 9.0,
                  "ci95_low": 9.0, "ci95_high": 9.0, "p_value_adjusted": 0.0},  # another metric: ignored
    ])
    row = fedsel_gain_loss(summary, comparisons).iloc[0]
    assert (row["gain ci95_low"], row["gain ci95_high"]) == pytest.approx((2.0, 7.0))
    assert row["gain p (Holm)"] == 0.001
    assert (row["loss ci95_low"], row["loss ci95_high"], row["loss p (Holm)"]) == pytest.approx((-1.0, 3.0, 0.4))
    # without comparisons (one replicate) the intervals are missing, not invented
    assert math.isnan(fedsel_gain_loss(summary).iloc[0]["gain ci95_low"])


def test_gain_loss_is_empty_without_the_mechanisms():
    assert fedsel_gain_loss(pd.DataFrame([summary_row("pm", "{}", 0.8)])).empty
    table = fedsel_gain_loss(pd.DataFrame([
        summary_row("pm", "{}", 0.8, dataset="syn-S-0.1-0.9"),
        summary_row("pe-pm", "{}", 0.8, dataset="syn-S-0.1-0.9"),
        summary_row("pe-pm", '{"control": true}', 0.81, dataset="syn-S-0.1-0.9")]))
    assert math.isnan(table.iloc[0]["gain (paper)"])  # the paper has no such row


def test_communication_frame_counts_bits_per_round_and_leaves_out_data_releases():
    from ldpbench.results.report import communication_frame

    runs = pd.DataFrame([
        {"run_id": "a", "mechanism": "pm", "epsilon": 2.0, "rounds": 10, "uplink_bits_total": 1000.0},
        {"run_id": "b", "mechanism": "np", "epsilon": math.inf, "rounds": 10, "uplink_bits_total": 5000.0},
        {"run_id": "c", "mechanism": "pm", "epsilon": 4.0, "rounds": 10, "uplink_bits_total": 1000.0},
        {"run_id": "d", "mechanism": "bitrand", "epsilon": 2.0, "rounds": 10, "uplink_bits_total": 77.0},
    ])
    curves = pd.DataFrame([{"run_id": r, "round": k, "test_accuracy": 0.5, "label": r}
                           for r in "abcd" for k in (0, 5, 10)])
    frame = communication_frame(runs, curves, 2.0)
    assert sorted(zip(frame["run_id"], frame["round"], frame["uplink_bits"])) == [
        ("a", 5, 500.0), ("a", 10, 1000.0), ("b", 5, 2500.0), ("b", 10, 5000.0)]


def test_provenance_table_one_row_per_dataset_and_encoder():
    from ldpbench.results.report import provenance_table

    minilm = json.dumps({"encoder": "minilm", "dim": 384, "source": "pkg", "weights_sha256": "ab12",
                         "pooling": "mean", "text_preprocessing": "lower"})
    runs = pd.DataFrame({"dataset": ["ag", "ag", "syn"], "features_provenance": [minilm, minilm, None]})
    table = provenance_table(runs)
    assert table.to_dict("records") == [{"dataset": "ag", "encoder": "minilm", "dim": 384, "weights": "pkg",
                                         "weights sha256": "ab12", "pooling": "mean", "preprocessing": "lower"}]


def test_run_files_from_before_the_added_columns_read_with_nulls(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ldpbench.results.schema import ADDED_FIELDS, SUMMARY_SCHEMA
    from ldpbench.results.tables import CorruptRunFile, read_checked_table

    row = {field.name: None for field in SUMMARY_SCHEMA}
    row.update(run_id="r1", dataset="d", model="lr", mechanism="pm", mechanism_params="{}", epsilon=1.0,
               seed=0, fold=0, plan="{}", status="ok", test_accuracy=0.9)
    old_schema = pa.schema([f for f in SUMMARY_SCHEMA if f.name not in ADDED_FIELDS])
    pq.write_table(pa.Table.from_pylist([{k: row[k] for k in old_schema.names}], old_schema), tmp_path / "old.parquet")
    frame = read_checked_table(tmp_path / "old.parquet", SUMMARY_SCHEMA, "r1").to_pandas()
    assert frame["classes"].isna().all() and frame["features_provenance"].isna().all()
    assert frame["test_accuracy"].iloc[0] == 0.9
    # Power: a column that was always there is still required.
    older = pa.schema([f for f in old_schema if f.name != "test_auc"])
    pq.write_table(pa.Table.from_pylist([{k: row[k] for k in older.names}], older), tmp_path / "bad.parquet")
    with pytest.raises(CorruptRunFile, match="test_auc"):
        read_checked_table(tmp_path / "bad.parquet", SUMMARY_SCHEMA, "r1")


def test_reference_epsilon_is_where_most_mechanisms_ran_then_nearest_two():
    from ldpbench.results.report import reference_epsilon

    rows = [("a", 200.0), ("a", 400.0), ("b", 400.0), ("c", 400.0), ("np", math.inf), ("np", math.inf)]
    assert reference_epsilon(pd.DataFrame(rows, columns=["label", "epsilon"])) == 400.0
    grid = [(label, eps) for label in "ab" for eps in (0.5, 1.0, 4.0, 8.0)]
    # 1 and 4 are equally near 2 on a log scale: the smaller wins.
    assert reference_epsilon(pd.DataFrame(grid, columns=["label", "epsilon"])) == 1.0
    assert math.isinf(reference_epsilon(pd.DataFrame([("np", math.inf)], columns=["label", "epsilon"])))


# ---------------------------------------------------------------- verdicts, tuning, convergence
def verdict_tables(directory, best="tie: PM, HM", unconverged=False):
    from ldpbench.layout import table_file

    pd.DataFrame([{"dataset": "d", "model": "lr", "epsilon": 2.0, "metric": "test_accuracy", "best": "PM, HM",
                   "verdict": best, "mechanisms": 3, "n_pairs": 9, "best_mean": 0.8, "best_ci95_low": 0.78,
                   "best_ci95_high": 0.82, "epsilon_worst_case_client_total": 8.0, "bits_per_report": 64.0,
                   "unconverged": unconverged}]).to_parquet(table_file(directory, "verdicts"))
    pd.DataFrame([{"test": "paired t-test", "alpha": 0.05, "metric": "test_accuracy", "better": "tie"}]).to_parquet(
        table_file(directory, "comparisons"))


def test_the_verdict_section_names_ties_and_the_test_and_is_absent_without_its_tables(tmp_path):
    from ldpbench.results.report_verdicts import verdict_section

    assert verdict_section(tmp_path) == ""
    verdict_tables(tmp_path, unconverged=True)
    text = verdict_section(tmp_path)
    assert "tie: PM, HM" in text and "paired t-test" in text and "α = 0.05" in text
    assert "80.00" in text and "[78.00, 82.00]" in text and "⚠ not all runs" in text


def selected_table(directory, data):
    from ldpbench.layout import table_file

    pd.DataFrame([{"dataset": "d", "model": "lr", "label": "PM", "mechanism": "pm", "epsilon": 2.0,
                   "setting": '{"learning_rate":0.1}', "score": 0.81, "metric": "validation_accuracy", "trials": 3,
                   "trial_runs": 3, "tuning_data": data,
                   "tuning_epsilon_claimed_client_max": 0.0 if data == "public" else 6.0,
                   "tuning_epsilon_worst_case_client_max": 0.0 if data == "public" else 9.0}]).to_parquet(
        table_file(directory, "selected"))


@pytest.mark.parametrize("data", ["private", "public"])
def test_the_tuning_section_puts_the_total_with_tuning_beside_the_final_run(tmp_path, data):
    from ldpbench.results.report_verdicts import tuning_section

    summary = pd.DataFrame([{"dataset": "d", "model": "lr", "label": "PM", "epsilon": 2.0,
                             "epsilon_claimed_client_max": 2.0, "epsilon_worst_case_client_max": 3.0}])
    assert tuning_section(tmp_path, summary) == ""
    selected_table(tmp_path, data)
    text = tuning_section(tmp_path, summary)
    assert "worst-case ε / client (final run)" in text and "worst-case ε / client (with tuning)" in text
    if data == "public":
        assert "declared public" in text and "<td>3</td><td>3</td></tr>" in text
    else:
        assert "Papernot" in text and "<td>3</td><td>12</td></tr>" in text  # 3 + 9 trials' worst case


def test_unconverged_configurations_are_marked():
    from ldpbench.results.report_verdicts import unconverged_mark

    assert unconverged_mark({"runs_unconverged": 2, "runs_ok": 3}) == "⚠ 2/3 unconverged"
    assert unconverged_mark({"runs_unconverged": 0, "runs_ok": 3}) == ""
    assert unconverged_mark({"runs_ok": 3}) == ""  # tables written before convergence was recorded


def test_the_audit_section_puts_the_three_epsilons_of_each_private_configuration_side_by_side():
    from ldpbench.results.report_claims import audit_frame, audit_section

    summary = pd.DataFrame([
        {"label": label, "mechanism": name, "mechanism_params": params, "epsilon": epsilon,
         "epsilon_per_report": epsilon / 2, "epsilon_claimed_per_report": epsilon / 2,
         "epsilon_worst_case_per_report": worst, "dataset": dataset}
        for label, name, params, worst in (("PM", "pm", "{}", None), ("NP", "np", "{}", math.inf))
        for epsilon in ((2.0, 4.0) if name == "pm" else (math.inf,))
        for dataset in ("a", "b")])
    summary.loc[summary["mechanism"] == "pm", "epsilon_worst_case_per_report"] = summary["epsilon_per_report"]
    audit = pd.DataFrame([{"mechanism": "pm", "params": "{}", "epsilon": 1.0, "dims": 4, "samples": 1000,
                           "alpha": 0.01, "audited_lower_bound": 1.5, "pair": "p", "event": "e",
                           "verdict": DEFECT}])
    frame = audit_frame(summary, audit)
    # One row per private (label, ε), the audit joined on what one report spends; NP is not listed.
    assert list(zip(frame["mechanism"], frame["ε"], frame["verdict"])) == [
        ("PM", 2.0, DEFECT), ("PM", 4.0, "not audited")]
    assert frame.loc[0, "audited ε ≥"] == 1.5 and frame.loc[0, "worst-case ε"] == 1.0
    page = audit_section(summary, audit)
    assert "<b>Defect</b>" in page and "PM at ε = 2" in page
    assert audit_section(summary, None) == ""


def test_the_curve_band_is_the_tables_interval_over_seeds():
    from ldpbench.results.report import seed_curves, student_t_band
    from ldpbench.results.tables import bounded_interval

    values = [0.8, 0.9, 0.7]
    assert student_t_band(values) == pytest.approx(bounded_interval(np.array(values))[2:])
    assert all(math.isnan(bound) for bound in student_t_band([0.8]))  # no band from one run
    # 2 seeds × 3 folds: the band is drawn over the 2 seed means.
    curves = pd.DataFrame({"panel": "p", "label": "PM", "round": 10, "seed": [0, 0, 0, 1, 1, 1],
                           "fold": [0, 1, 2] * 2, "test_accuracy": [0.7, 0.8, 0.9, 0.6, 0.6, 0.6]})
    assert seed_curves(curves, "round")["test_accuracy"].tolist() == pytest.approx([0.8, 0.6])


def test_the_accuracy_figure_draws_the_majority_class_not_a_random_guess():
    from ldpbench.results.report import constant_level

    summary = pd.DataFrame({"majority_accuracy": [0.7607, 0.7607]})
    assert constant_level(summary, "accuracy") == (0.7607, "majority class (76.1 %)")
    assert constant_level(summary, "auc") == (0.5, "constant predictor (AUC 0.5)")
    assert constant_level(pd.DataFrame({"majority_accuracy": [np.nan]}), "accuracy") is None


def test_the_results_table_gives_accuracy_and_auc_in_percent_with_intervals_and_marks_the_best():
    from ldpbench.results.report import best_private, results_table

    nan = float("nan")
    rows = [
        {"label": "NP", "mechanism": "np", "epsilon": math.inf, "mean": 0.9, "ci95_low": 0.88, "ci95_high": 0.92},
        {"label": "PM", "mechanism": "pm", "epsilon": 2.0, "mean": 0.8193, "ci95_low": 0.801, "ci95_high": 0.8375},
        {"label": "PS-PM", "mechanism": "ps-pm", "epsilon": 2.0, "mean": 0.75, "ci95_low": nan, "ci95_high": nan},
        {"label": "PS-PM", "mechanism": "ps-pm", "epsilon": 8.0, "mean": 0.85, "ci95_low": 0.84, "ci95_high": 0.86},
    ]
    summary = pd.DataFrame([{**row, "dataset": "adult", "model": "lr", "auc_mean": row["mean"] - 0.1,
                             "auc_ci95_low": row["ci95_low"] - 0.1, "auc_ci95_high": row["ci95_high"] - 0.1,
                             "runs_ok": 3, "runs": 3, "epsilon_claimed_per_report": row["epsilon"],
                             "epsilon_worst_case_per_report": row["epsilon"],
                             "epsilon_claimed_client_max": row["epsilon"],
                             "epsilon_worst_case_client_max": row["epsilon"], "bits_per_report": 32.0}
                            for row in rows])
    table = results_table(summary)
    by_label = dict(zip(zip(table["mechanism"], table["ε"]), table["accuracy % [95 % CI]"]))
    assert by_label[("PM", 2.0)] == "81.93 [80.10, 83.75]"
    assert by_label[("PS-PM", 2.0)] == "75.00"  # one run: no interval
    assert dict(zip(zip(table["mechanism"], table["ε"]), table["AUC % [95 % CI]"]))[("PM", 2.0)] == \
        "71.93 [70.10, 73.75]"
    # The best private mechanism of each (dataset, model, ε): PM at ε = 2, PS-PM alone at ε = 8; NP never.
    best = best_private(summary)
    assert sorted(zip(table.loc[best.values, "mechanism"], table.loc[best.values, "ε"])) == [("PM", 2.0),
                                                                                         ("PS-PM", 8.0)]
    page = table_html(table, best)
    assert page.startswith('<table class="sortable">') and page.count('<tr class="best">') == 2


def table_html(frame, best=None) -> str:
    """`frame` as the report's pages write a table (the macro of templates/macros.html.j2)."""
    from ldpbench.results.report_html import environment, table

    return str(environment().get_template("macros.html.j2").module.table(table(frame, best)))


def test_the_page_escapes_every_value_it_writes():
    # Autoescaping is on: a label, a cell or a claims file name holding markup is shown as text, not run.
    from ldpbench.results.report_claims import scorecard_section

    page = table_html(pd.DataFrame({"mechanism <i>": ["<script>alert(1)</script>"], "ε": [float("inf")]}))
    assert "<th>mechanism &lt;i&gt;</th>" in page and "<td>&lt;script&gt;alert(1)&lt;/script&gt;</td>" in page
    assert "<td>∞</td>" in page and "<script>" not in page
    scorecard = pd.DataFrame([{"paper": "P (2020)", "source": "Table 1", "dataset": "d", "model": "lr", "epsilon": 1.0,
                               "mechanisms": "A vs B", "relation": "order", "paper_value": math.nan,
                               "ours": math.nan, "ours_low": math.nan, "ours_high": math.nan, "gap": math.nan,
                               "p_value_adjusted": math.nan, "replicates": 1, "status": "not run", "why": "w",
                               "claims_file": "a&b.yaml", "substitution": "x < y"}])
    section = scorecard_section(scorecard)
    assert "<code>a&amp;b.yaml</code>" in section and "<p>Our substitutions: x &lt; y.</p>" in section


def test_load_runs_gathers_every_run_with_its_label_and_reports_each_bad_file(tmp_path):
    """The runs are gathered as Arrow tables and converted once: each run keeps its own label and
    cell, its values are those of its file, and every bad file is reported with its run."""
    from ldpbench.atomic import write_parquet
    from ldpbench.layout import CURVES, SUMMARIES, run_file
    from ldpbench.results.schema import CURVE_SCHEMA, SUMMARY_SCHEMA
    from ldpbench.results.tables import CorruptRunFile, load_runs, read_checked_table

    manifest = []
    for index, (mechanism, label) in enumerate([("pm", "PM"), ("pm", "PM"), ("hm", "HM tuned")]):
        run_id, cell_id = f"run{index}", f"cell{index // 2}"
        row = {field.name: None for field in SUMMARY_SCHEMA}
        row.update(run_id=run_id, dataset="syn", model="lr", mechanism=mechanism, mechanism_params="{}",
                   epsilon=1.0, seed=0, fold=index, plan="{}", status="ok", test_accuracy=0.5 + index / 10,
                   stopped_early=False)
        write_parquet(run_file(tmp_path, SUMMARIES, "syn", mechanism, "final", run_id), [row], SUMMARY_SCHEMA)
        points = [{field.name: math.nan for field in CURVE_SCHEMA} | {"run_id": run_id, "round": r, "epoch": r}
                  for r in (0, 10)]
        write_parquet(run_file(tmp_path, CURVES, "syn", mechanism, "final", run_id), points, CURVE_SCHEMA)
        manifest.append({"plan": {"dataset": "syn", "mechanism": mechanism}, "run_id": run_id,
                         "cell_id": cell_id, "label": label})
    runs, curves = load_runs(manifest, tmp_path)
    assert list(runs[["run_id", "label", "cell_id"]].itertuples(index=False, name=None)) == [
        ("run0", "PM", "cell0"), ("run1", "PM", "cell0"), ("run2", "HM tuned", "cell1")]
    assert list(runs.columns[:3]) == ["run_id", "label", "cell_id"]
    assert runs["test_accuracy"].tolist() == [0.5, 0.6, 0.7]
    first = read_checked_table(run_file(tmp_path, SUMMARIES, "syn", "pm", "final", "run0"), SUMMARY_SCHEMA,
                               "run0").to_pandas()
    pd.testing.assert_frame_equal(runs.drop(columns=["label", "cell_id", "final_slope", "converged"]).iloc[:1],
                                  first)
    assert curves.groupby("run_id")["label"].first().to_dict() == {"run0": "PM", "run1": "PM", "run2": "HM tuned"}
    # Power: a summary copied from another run, and a missing curve, are both reported.
    run_file(tmp_path, SUMMARIES, "syn", "hm", "final", "run2").write_bytes(
        run_file(tmp_path, SUMMARIES, "syn", "pm", "final", "run0").read_bytes())
    run_file(tmp_path, CURVES, "syn", "pm", "final", "run1").unlink()
    with pytest.raises(CorruptRunFile, match="2 corrupt or missing") as raised:
        load_runs(manifest, tmp_path)
    assert "belongs to another run" in str(raised.value) and "cannot be read" in str(raised.value)
    assert sorted(entry["run_id"] for entry in raised.value.runs) == ["run1", "run2"]


def non_private_campaign_tables(root) -> None:
    """root/tables of a campaign that ran NP alone (three seeds), aggregated from its run files."""
    import json

    from ldpbench.atomic import write_parquet
    from ldpbench.layout import CURVES, SUMMARIES, run_file
    from ldpbench.results.schema import CURVE_SCHEMA, SUMMARY_SCHEMA
    from ldpbench.results.tables import aggregate

    manifest = []
    for seed in range(3):
        run_id = f"run{seed}"
        row = {field.name: None for field in SUMMARY_SCHEMA} | {
            "run_id": run_id, "dataset": "syn", "model": "lr", "mechanism": "np", "mechanism_params": "{}",
            "epsilon": math.inf, "seed": seed, "fold": 0, "plan": "{}", "status": "ok", "test_accuracy": 0.8,
            "test_auc": 0.85, "rounds": 10, "classes": 2, "uplink_bits_total": 1e3, "train_seconds": 1.0,
            "wall_seconds": 1.5, "started_at": "2024-01-01T00:00:00", "finished_at": "2024-01-01T00:00:02",
            "bits_per_report": 32.0, "reports_per_client_max": 1, "stopped_early": False}
        row |= {f"epsilon_{kind}": math.inf for kind in ("per_report", "claimed_per_report", "worst_case_per_report",
                                                          "claimed_client_max", "worst_case_client_max")}
        write_parquet(run_file(root / "runs", SUMMARIES, "syn", "np", "final", run_id), [row], SUMMARY_SCHEMA)
        points = [{field.name: 0.8 for field in CURVE_SCHEMA} | {"run_id": run_id, "round": r, "epoch": r}
                  for r in (0, 10)]
        write_parquet(run_file(root / "runs", CURVES, "syn", "np", "final", run_id), points, CURVE_SCHEMA)
        manifest.append({"plan": {"dataset": "syn", "mechanism": "np"}, "run_id": run_id, "cell_id": "cell0",
                         "label": "NP"})
    (root / "manifest.json").write_text(json.dumps({"campaign": "np-only", "runs": manifest}))
    aggregate(root / "manifest.json", root / "runs", root / "tables")


@pytest.mark.parametrize("written_by", ["write_table", "an earlier version"])
def test_the_report_of_a_campaign_with_nothing_to_audit_says_so(tmp_path, written_by):
    # An NP-only campaign's audit table has no rows: the report is built (the runs' ε per report,
    # float, joined the empty table's untyped columns and failed) and says there was nothing to audit.
    from ldpbench.audit import AuditResult, write_table
    from ldpbench.results.report import build_report

    non_private_campaign_tables(tmp_path)
    audit = tmp_path / "audit.parquet"
    if written_by == "write_table":
        write_table(audit, [])
    else:
        pd.DataFrame(columns=list(AuditResult.__annotations__)).to_parquet(audit)
    page = build_report(tmp_path / "tables", tmp_path / "report", audit).read_text()
    section = page[page.index("<h2>Claimed / worst-case / audited ε</h2>"):]
    section = section[:section.index("<h2>", 5)]
    assert "Nothing to audit: every mechanism this campaign ran is non-private" in section
    assert "<table" not in section


def labelled_ticks(svg: Path) -> list[tuple[str, list[str]]]:
    """Each axis of an SVG figure (matplotlib's "matplotlib.axis_N" groups, x then y of each panel) with the
    labels of its ticks: matplotlib writes each text as a comment before the glyphs that draw it."""
    import xml.etree.ElementTree as ET

    root = ET.fromstring(svg.read_text(), parser=ET.XMLParser(target=ET.TreeBuilder(insert_comments=True)))
    axes = []
    for axis in root.iter("{http://www.w3.org/2000/svg}g"):
        if not axis.get("id", "").startswith("matplotlib.axis_"):
            continue
        labels = []
        for tick in axis:
            if tick.get("id", "").split("_")[0] in ("xtick", "ytick"):
                labels += [node.text.strip() for node in tick.iter() if node.tag is ET.Comment]
        axes.append((axis.get("id"), labels))
    return axes


def test_every_axis_of_every_figure_is_labelled_accuracy_in_percent_beside_the_majority_class(tmp_path):
    """The figures as the issue found them: a log axis of costs within one decade had no tick label, the
    figures gave fractions where the tables give percent, and only one figure drew the majority class."""
    from ldpbench.results.report import _save as save_figure
    from ldpbench.results.report import (
        accuracy_levels,
        communication_figure,
        curves_figure,
        mechanism_palette,
        metric_figure,
    )
    from ldpbench.results.report_verdicts import pareto_figure

    labels = {"PM": "pm", "PS-PM": "ps-pm", "NP": "np"}
    configurations = [(label, epsilon) for label in ("PM", "PS-PM") for epsilon in (0.5, 1.0, 2.0)] + [("NP", math.inf)]
    summary = pd.DataFrame([
        {"dataset": "adult", "model": "lr", "label": label, "epsilon": epsilon, "mean": 0.8, "ci95_low": 0.78,
         "ci95_high": 0.82, "auc_mean": 0.85, "auc_ci95_low": 0.83, "auc_ci95_high": 0.87, "majority_accuracy": 0.7607}
        for label, epsilon in configurations])
    runs = pd.DataFrame([{"run_id": f"{label}-{epsilon}", "mechanism": labels[label], "epsilon": epsilon, "rounds": 100,
                          "uplink_bits_total": 3e6 if label == "NP" else 2e6} for label, epsilon in configurations])
    curves = pd.DataFrame([{"run_id": f"{label}-{epsilon}", "dataset": "adult", "model": "lr", "label": label,
                            "epsilon": epsilon, "seed": 0, "round": round_, "test_accuracy": 0.7 + round_ / 1000}
                           for label, epsilon in configurations for round_ in (0, 10, 20, 30)])
    rankings = summary[np.isfinite(summary["epsilon"])].assign(
        metric="test_accuracy", uplink_bits_total_mean=[2.1e6, 2.4e6, 2.9e6, 3.1e6, 3.6e6, 4.2e6],
        epsilon_worst_case_client_total=[1.0, 2.0, 4.0, 1.5, 3.0, 6.0], pareto_bits=True, pareto_epsilon=True)
    (tmp_path / "tables").mkdir()
    rankings.to_parquet(tmp_path / "tables" / "rankings.parquet")

    palette, levels, figures = mechanism_palette(summary["label"]), accuracy_levels(summary), tmp_path / "figures"
    metric_figure(summary, figures / "accuracy.png", palette, "accuracy")
    metric_figure(summary, figures / "auc.png", palette, "auc")
    curves_figure(curves, figures / "curves.png", 2.0, palette, levels)
    assert communication_figure(runs, curves, figures / "bits.png", 2.0, palette, levels)
    for cost in ("epsilon", "bits"):
        assert pareto_figure(tmp_path / "tables", figures / f"pareto_{cost}.png", palette, cost, save_figure)

    for name in ("accuracy", "auc", "curves", "bits", "pareto_epsilon", "pareto_bits"):
        svg = figures / f"{name}.svg"
        axes = labelled_ticks(svg)
        assert len(axes) == 2, (name, axes)  # one panel: its x and y axes
        for axis, ticks in axes:
            assert len(ticks) >= 2, (name, axis, ticks)
        y_ticks = axes[1][1]
        assert all(tick.endswith("%") for tick in y_ticks), (name, y_ticks)
        drawn = svg.read_text()
        if name in ("accuracy", "curves", "bits"):
            assert "<!-- majority class (76.1 %) -->" in drawn, name
    assert [tick for tick in labelled_ticks(figures / "accuracy.svg")[0][1]] == ["0.5", "1", "2"]
    for name in ("accuracy", "auc", "curves", "bits", "pareto_epsilon", "pareto_bits"):
        assert same_area(figures / f"{name}.png", figures / f"{name}.svg"), name


def same_area(png: Path, svg: Path) -> bool:
    """Whether a figure's PNG and SVG show the same area of it: the PNG's pixels at the report's dpi and
    the SVG's points (72 an inch) give the same inches, to within the PNG's rounding to whole pixels."""
    import xml.etree.ElementTree as ET

    from PIL import Image

    from ldpbench.results.report import PNG_DPI

    with Image.open(png) as image:
        pixels = image.size
    _, _, width, height = (float(value) for value in ET.parse(svg).getroot().get("viewBox").split())
    return all(abs(count / PNG_DPI - points / 72) <= 1 / PNG_DPI for count, points in zip(pixels, (width, height)))


@pytest.mark.parametrize(("base", "limits", "expected"), [
    (2, (0.4, 10), ["0.5", "1", "2", "4", "8"]),
    (2, (0.01, 1000), ["0.015625", "0.125", "1", "8", "64", "512"]),  # every third of 16 powers
    (10, (2.03e6, 4.4e6), ["3M", "4M"]),
    (10, (1e3, 1e12), None),
    (10, (2.1e6, 2.3e6), None),
])
def test_a_log_axis_gets_two_to_seven_labelled_ticks_inside_it_whatever_its_span(base, limits, expected):
    import matplotlib.pyplot as plt

    from ldpbench.results.figure_axes import MOST_TICKS, labelled_log_axis

    figure, ax = plt.subplots()
    ax.set_xscale("log", base=base)
    ax.set_xlim(*limits)
    labelled_log_axis(ax, base=base)
    ticks = ax.xaxis.get_major_locator()()
    labels = [ax.xaxis.get_major_formatter()(tick) for tick in ticks]
    plt.close(figure)
    assert 2 <= len(ticks) <= MOST_TICKS and all(limits[0] <= tick <= limits[1] for tick in ticks), labels
    if expected is not None:
        assert labels == expected
