"""The edit loop of a researcher: run a campaign, edit its file, run again. Every edit reruns exactly what
it changes (the run executes exactly the cells the edited file adds, as its dry run planned; a stored run
is never trained again) and the tables then equal those of the edited file run from scratch. An edit back
to an earlier file trains nothing. (The default campaign's own edits: test_edits_default.py.)"""

from __future__ import annotations

import copy
import shutil
from collections import Counter
from pathlib import Path

import pytest

from edit_loop import AFTER_FINAL, TUNING, Campaign, cells_of, run, tables
from workflow_cli import small_config

pytestmark = pytest.mark.integration


def base_config(prepared: Path) -> dict:
    """A tuned campaign of a few cells: NP and PM on syn-S at two ε and two seeds, the learning rate tuned."""
    config = small_config(name="edits", prepared_dir=prepared, mechanisms=("np", "pm"), epsilons=(1, 4),
                          seeds=(0, 1), rounds=10)
    config["tuning"] = {"space": {"learning_rate": [0.03, 0.3]}}
    config["tracking"] = {"enabled": False}
    return config


@pytest.fixture(scope="session")
def first_run(tmp_path_factory) -> tuple[dict, Path]:
    """The base campaign file and a directory where it has run: each chain of edits starts from a copy."""
    root = tmp_path_factory.mktemp("edits-first")
    config = base_config(root / "prepared")
    run(root / "first", config)
    return config, root / "first"


def edited_campaign(tmp_path: Path, first_run: tuple[dict, Path]) -> Campaign:
    config, first = first_run
    campaign = Campaign(tmp_path, copy.deepcopy(config))
    campaign.start_from(first)
    return campaign


# The edits a researcher makes, in four chains from the same first run (so that they run side by side):
# each edit applies to the file the one before it left.
@pytest.mark.slow
def test_epsilon_edits_rerun_exactly_what_they_change(tmp_path, first_run):
    campaign = edited_campaign(tmp_path, first_run)
    # ε: added (its trials and final cell), changed, removed (nothing to train).
    new = campaign.edit(lambda c: c.update(epsilons=[1, 2, 4]), reruns=TUNING, tail=AFTER_FINAL)
    assert Counter(cells_of(campaign.config)[cell] for cell in new) == {"trial": 1, "final": 1}
    campaign.edit(lambda c: c.update(epsilons=[1, 2, 8]), reruns=TUNING, tail=AFTER_FINAL)
    assert campaign.edit(lambda c: c.update(epsilons=[1, 8]), reruns=TUNING, tail=AFTER_FINAL) == set()


@pytest.mark.slow
def test_seed_and_mechanism_edits_rerun_exactly_what_they_change(tmp_path, first_run):
    campaign = edited_campaign(tmp_path, first_run)
    # A seed: added (every final cell is new and trains that seed alone; the tuning seed is unchanged),
    # then removed again (the earlier cells are done: nothing runs but the tables).
    new = campaign.edit(lambda c: c.update(seeds=[0, 1, 2]), reruns=set(), tail=AFTER_FINAL)
    assert Counter(cells_of(campaign.config)[cell] for cell in new) == {"final": 3}
    assert campaign.edit(lambda c: c.update(seeds=[0, 1]), reruns=set(), tail=AFTER_FINAL) == set()
    # A mechanism entry: added, its parameter changed, removed.
    ps_pm = {"name": "ps-pm", "label": "ps-pm", "params": {"mu": 0.1}}
    campaign.edit(lambda c: c["mechanisms"].append(copy.deepcopy(ps_pm)), reruns=TUNING, tail=AFTER_FINAL)
    campaign.edit(lambda c: c["mechanisms"][-1]["params"].update(mu=0.2), reruns=TUNING, tail=AFTER_FINAL)
    assert campaign.edit(lambda c: c["mechanisms"].pop(), reruns=TUNING, tail=AFTER_FINAL) == set()


@pytest.mark.slow
def test_dataset_model_and_tuning_edits_rerun_exactly_what_they_change(tmp_path, first_run):
    campaign = edited_campaign(tmp_path, first_run)
    # A dataset and a model.
    campaign.edit(lambda c: c["datasets"].append({"name": "syn-S-0.01-0.9"}), reruns=TUNING | {"prepare_dataset"},
                  tail=AFTER_FINAL)
    campaign.edit(lambda c: c.update(models=["lr", "svm"]), reruns=TUNING, tail=AFTER_FINAL)
    # The tuning: a grid point (every trial and tuned cell is new; only the new point's trials train, and
    # a final run whose selection stays is not trained again), then the metric (the trial cells, which
    # say how their runs are scored, are new; none of their runs trains again).
    campaign.edit(lambda c: c["tuning"]["space"]["learning_rate"].append(0.1), reruns=TUNING, tail=AFTER_FINAL)
    campaign.edit(lambda c: c["tuning"].update(metric="validation_loss"), reruns=TUNING, tail=AFTER_FINAL)


@pytest.mark.slow
def test_training_fold_and_audit_edits_rerun_exactly_what_they_change_and_an_edit_back_trains_nothing(
        tmp_path, first_run):
    campaign = edited_campaign(tmp_path, first_run)
    first = copy.deepcopy(campaign.config)
    # A training setting and the fold count: every run changes.
    campaign.edit(lambda c: c["training"].update(l2=0.001), reruns=TUNING, tail=AFTER_FINAL)
    campaign.edit(lambda c: c.update(split={"folds": 2}), reruns=TUNING, tail=AFTER_FINAL)
    # The audit's settings: no cell, the audit table alone (it computes the audits they need).
    campaign.edit(lambda c: c["audit"].update(samples=30_000), reruns=set(), tail={"audit_table"})
    # Back to the first file: every cell is done; only the tables are written again.
    assert campaign.edit(lambda c: (c.clear(), c.update(copy.deepcopy(first))), reruns=TUNING,
                         tail=AFTER_FINAL) == set()


@pytest.mark.slow
def test_an_edit_reruns_what_it_changes_without_snakemakes_records(tmp_path, first_run):
    """Snakemake's "set of input files changed" trigger reads its records of the last run under
    .snakemake/; with them gone (deleted, or the results moved to another checkout) an added ε planned
    nothing and the tables silently lacked it. The phases' cell indexes rerun the manifests by time."""
    config, first = first_run
    campaign = Campaign(tmp_path, copy.deepcopy(config), dry_run_first=True)
    campaign.start_from(first)
    shutil.rmtree(campaign.workdir / ".snakemake")
    new = campaign.edit(lambda c: c.update(epsilons=[1, 2, 4]), reruns=TUNING, tail=AFTER_FINAL)
    assert len(new) == 2  # the new ε's trial cell and final cell, trained and in the tables
    assert 2.0 in set(tables(campaign.workdir)["summary"]["epsilon"])
