"""A tuned campaign through Snakemake: trials, the selection, final runs, caching."""

import json

import pandas as pd
import pytest

from ldpbench.layout import CampaignLayout

from workflow_cli import small_config, snakemake


def tuned_config(rates):
    config = small_config(name="tuned", mechanisms=("np", "pm"), epsilons=(2,), seeds=(0, 1), rounds=20)
    config["tuning"] = {"space": {"learning_rate": list(rates)}, "seeds": [0]}
    config["tracking"] = {"enabled": False}
    return config


def run_times(layout: CampaignLayout, manifest) -> dict[str, int]:
    """The time each run of a manifest was stored."""
    content = json.loads(manifest.read_text())
    return {entry["run_id"]: layout.run_file("summaries", entry["plan"]["dataset"], entry["plan"]["mechanism"],
                                             content["phase"], entry["run_id"]).stat().st_mtime_ns
            for entry in content["runs"]}


@pytest.mark.slow
def test_a_tuned_campaign_selects_on_validation_and_trains_only_what_a_new_point_adds(tmp_path):
    snakemake(tmp_path, tuned_config([0.03, 0.3]))
    layout = CampaignLayout(tmp_path / "results", "tuned")
    tuning = pd.read_parquet(layout.table("tuning"))
    selected = pd.read_parquet(layout.table("selected")).set_index("label")
    assert len(tuning) == 2 * 2 and set(tuning["metric"]) == {"validation_auc"}  # the default
    assert set(selected.index) == {"np", "pm"} and (selected["trials"] == 2).all()
    # The final runs carry the selected learning rate, at the campaign's seeds, on all training clients.
    runs = json.loads(layout.manifest.read_text())["runs"]
    for run in runs:
        rate = json.loads(selected.loc[run["label"], "setting"])["learning_rate"]
        assert run["plan"]["training"]["learning_rate"] == rate
        assert run["plan"]["training"]["validation_fraction"] == 0
    assert sorted(run["plan"]["seed"] for run in runs) == [0, 0, 1, 1]
    summary = pd.read_parquet(layout.table("summary")).set_index("label")
    pm = summary.loc["pm"]
    assert pm["tuned"] and pm["epsilon_worst_case_client_total"] == pytest.approx(
        pm["epsilon_worst_case_client_max"] + selected.loc["pm", "tuning_epsilon_worst_case_client_max"])
    assert "converged" in pd.read_parquet(layout.table("runs")).columns
    page = (layout.report_dir / "index.html").read_text()
    # The report opens with the verdicts: its first table is theirs, and it has a tuning section.
    assert page.index('id="verdicts"') < page.index("<table ") < page.index("Accuracy vs ε")
    assert 'id="tuning"' in page and "Papernot" in page

    # A new grid point: only its trials train; the old trials keep their files.
    trials_before = run_times(layout, layout.trials_manifest)
    snakemake(tmp_path, tuned_config([0.03, 0.3, 0.1]))
    trials_after = run_times(layout, layout.trials_manifest)
    assert len(trials_after) == len(trials_before) + 2
    assert {run: trials_after[run] for run in trials_before} == trials_before
    assert len(pd.read_parquet(layout.table("tuning"))) == 3 * 2
