# All workflow Python: config validation, campaign -> run plans, paths and input functions.
import json
import os
import shlex
import sys
from pathlib import Path

import yaml

from snakemake.exceptions import WorkflowError
from snakemake.logging import logger

from ldpbench.atomic import write_json, write_text
from ldpbench.audit import merge_tables as merge_audit_tables
from ldpbench.campaign import expand as expand_campaign
from ldpbench.campaign import expand_trials
from ldpbench.campaign import DEFAULT_SCHEMA, LARGE_GRID_RUNS, count_runs, validate_config, write_manifest
from ldpbench.data import registry as dataset_registry
from ldpbench.errors import LdpbenchError
from ldpbench.results.live import LIVE_ENV, live_environment
from ldpbench.scheduler_wakeups import coalesce_wakeups
from ldpbench.tuning import selected_settings
from ldpbench import worker
from ldpbench.plan import canonical_json, run_id
from ldpbench.layout import (
    CURVES,
    FIGURE_PATTERNS,
    LEDGERS,
    RUNS_DIR,
    SUMMARIES,
    TUNING_TABLES,
    CampaignLayout,
    features_log,
    features_meta,
    prepare_log,
    prepared_meta,
)

SCHEMA = DEFAULT_SCHEMA  # ldpbench/schemas/config.schema.yaml, shipped in the package

# Snakemake's scheduler would otherwise wake itself once a second per finished job for the rest of
# the campaign: a quarter of a core in a 10,000-run campaign (ldpbench/scheduler_wakeups.py).
coalesce_wakeups()

# Validate (and fill defaults) before any job is scheduled: a typo fails here, naming the key.
# With --configfile, the campaign is the user's files (and --config) alone, as `ldpbench validate`
# sees it: keys missing there must not be filled from config/config.yaml (the default campaign).
_campaign_config = workflow.config_settings.overwrite_config if workflow.overwrite_configfiles else config
# Where the jobs run on this machine, a training.device it lacks ('cuda' without CUDA) fails here too.
try:
    _validated = validate_config(_campaign_config, SCHEMA, jobs_run_here=workflow.local_exec)
except LdpbenchError as error:
    raise WorkflowError(str(error)) from None
config.clear()
config.update(_validated)

# Shell rules call `python -m ldpbench`. Without --use-conda, `python` is the interpreter running
# Snakemake: its directory goes first on PATH (so no activated venv is needed). With --use-conda,
# the rules' environment (workflow/envs/ldpbench.yaml) is activated in front of it; its post-deploy
# script installs ldpbench from LDPBENCH_SOURCE.
_interpreter_dir = str(Path(sys.executable).parent)
if not (Path(_interpreter_dir) / "python").exists():
    raise WorkflowError(
        f"no 'python' next to the interpreter running Snakemake ({sys.executable}): run Snakemake "
        "from a virtual environment or conda environment (see the README)"
    )
# Set here, for the jobs (not read from the user: nothing for an envvars directive to assert).
_path = os.environ.get("PATH", "")
if _path.split(os.pathsep)[0] != _interpreter_dir:
    os.environ.update(PATH=os.pathsep.join(filter(None, [_interpreter_dir, _path])))
os.environ.update(LDPBENCH_SOURCE=workflow.basedir)

CAMPAIGN = config["campaign"]
LAYOUT = CampaignLayout(config["results_dir"], CAMPAIGN)
RAW_DIR = config["data"]["raw_dir"]
PREPARED_DIR = config["data"]["prepared_dir"]
MIRROR = config["data"]["mirror"]
FEATURES_DIR = config["features"]["dir"]
FEATURES = {entry["name"]: entry["features"] for entry in config["datasets"] if entry["features"]}


def _runnable_datasets():
    """Datasets to run; optional ones whose files are not at hand are skipped with a notice."""
    runnable, skipped = [], []
    for entry in config["datasets"]:
        dataset = dataset_registry.get(entry["name"])
        local = dataset.is_local(RAW_DIR, MIRROR)
        if entry["optional"] and not local and not config["data"]["allow_download"]:
            logger.warning(
                f"NOTICE: optional dataset '{entry['name']}' skipped: its files are neither in "
                f"'{RAW_DIR}/{dataset.mirror_dir}' nor in the mirror (data.mirror: {MIRROR!r})."
            )
            skipped.append(entry["name"])
        else:
            runnable.append(entry["name"])
    return runnable, skipped


DATASETS, SKIPPED_DATASETS = _runnable_datasets()
RUN_COUNT = count_runs(config, DATASETS)
if RUN_COUNT > LARGE_GRID_RUNS:
    logger.warning(
        f"NOTICE: campaign '{CAMPAIGN}' has {RUN_COUNT:,} runs (more than "
        f"{LARGE_GRID_RUNS:,}); building their plans takes a while."
    )


def group_cells(runs):
    """Cells by id: one job per cell, all seeds and folds of a configuration, one dataset load."""
    cells = {}
    for run in runs:
        cells.setdefault(run["cell_id"], []).append(run)
    return cells


# With a `tuning:` section the trials run first; the final runs are known once the checkpoint
# `select` has chosen each tuned configuration's setting (ldpbench.tuning).
TRIALS = expand_trials(config, DATASETS)
TUNED = bool(TRIALS)
TRIAL_CELLS = group_cells(TRIALS)
RUNS = expand_campaign(config, DATASETS)  # without tuning, the final runs
CELLS = group_cells(RUNS)
_SELECTIONS = {}


def runs_of_selection(selected):
    """The final runs (and their cells) of a tuned campaign, given its tables/selected.parquet."""
    key = (selected, os.stat(selected).st_mtime_ns)
    if key not in _SELECTIONS:
        runs = expand_campaign(config, DATASETS, selected_settings(selected))
        _SELECTIONS[key] = (runs, group_cells(runs))
    return _SELECTIONS[key]


def final_cells():
    """The cells of the final runs; with tuning, after the selection (checkpoint select)."""
    if not TUNED:
        return CELLS
    return runs_of_selection(checkpoints.select.get().output.selected)[1]


wildcard_constraints:
    dataset="[A-Za-z0-9_.-]+",
    mechanism="[A-Za-z0-9_.-]+",
    cell_id="[0-9a-f]{16}",
    audit_id="[0-9a-f]{16}",
    encoder="[A-Za-z0-9_.-]+",


def prepared(dataset):
    """What a run reads: the prepared dataset, or its features when the config names an encoder.

    meta.json is written last in both formats, so it stands for the whole directory.
    """
    if dataset in FEATURES:
        return {"meta": str(features_meta(FEATURES_DIR, dataset, FEATURES[dataset]))}
    return {"meta": str(prepared_meta(PREPARED_DIR, dataset))}


def cell_dir(cell):
    plan = cell[0]["plan"]
    return str(LAYOUT.cell(plan["dataset"], plan["mechanism"], cell[0]["cell_id"]))


def parent_dir(path, sibling=None):
    """The directory of `path` (or its sibling directory `sibling`), derived from a declared file."""
    parent = Path(path).parent
    return str(parent / sibling) if sibling else str(parent)


def final_cell_outputs(wildcards):
    return [cell_dir(cell) for cell in final_cells().values()]


def trial_cell_outputs():
    return [cell_dir(cell) for cell in TRIAL_CELLS.values()]


def tuning_tables():
    """What a tuned campaign's manifest, aggregation and report read from the selection."""
    return [str(LAYOUT.table(table)) for table in TUNING_TABLES] if TUNED else []


def selected_flag():
    return f"--selected {shlex.quote(str(LAYOUT.table('selected')))}" if TUNED else ""


def campaign_cell(cell_id):
    """The runs of a cell of this campaign (trials, final cells, and the selected ones once chosen)."""
    cells = {**TRIAL_CELLS, **CELLS}
    selected = LAYOUT.table("selected")
    if TUNED and selected.exists():
        cells.update(runs_of_selection(str(selected))[1])
    try:
        return cells[cell_id]
    except KeyError:
        raise WorkflowError(f"cell {cell_id} is not part of campaign '{CAMPAIGN}'") from None


def cell_label(cell_id):
    """The label of a cell's configuration (the campaign's `label`), which names its runs in the log."""
    run = campaign_cell(cell_id)[0]
    return f"{run['label']} (tuning trial {run['setting']})" if "setting" in run else run["label"]


def write_cell_plan(cell_id, path):
    """The run plans of one cell, in (seed, fold) order, as the JSON list `ldpbench run-cell --plans` reads.

    A file, not a command-line argument: a cell of a few hundred runs exceeds Linux's 128 KiB
    limit on one argument. The cell id hashes the cell's whole content, so a plan never changes.
    """
    plans = sorted((run["plan"] for run in campaign_cell(cell_id)), key=lambda plan: (plan["seed"], plan["fold"]))
    write_json(path, plans)


def fetch_flags():
    """Where official files (and weights) are looked up: raw dir, mirror, download."""
    flags = [f"--raw-dir {shlex.quote(RAW_DIR)}"]
    if MIRROR:
        flags.append(f"--mirror {shlex.quote(MIRROR)}")
    if config["data"]["allow_download"]:
        flags.append("--allow-download")
    return flags


def prepare_flags():
    flags = fetch_flags()
    for key, digest in sorted(config["data"]["checksums"].items()):
        flags.append(f"--sha256 {shlex.quote(f'{key}={digest}')}")
    return " ".join(flags)


def features_flags(wildcards):
    settings = config["features"]
    flags = [*fetch_flags(), f"--device {shlex.quote(settings['device'])}", f"--batch-size {settings['batch_size']}"]
    weights = settings["weights"].get(wildcards.encoder)
    if weights:
        flags.append(f"--weights {shlex.quote(weights)}")
    return " ".join(flags)


def manifest_content():
    """What the manifest job reruns on (a tuned campaign's also reruns when its selection changes)."""
    return {"runs": TRIALS if TUNED else RUNS, "skipped": SKIPPED_DATASETS}


def save_manifest(path, selected=None):
    """The final runs' manifest; with tuning, written after the selection (`selected`)."""
    runs = RUNS if selected is None else runs_of_selection(selected)[0]
    write_manifest(path, CAMPAIGN, runs, SKIPPED_DATASETS, only_if_changed=selected is None)


def save_campaign_file(path):
    """The resolved configuration, as YAML: what ran, whatever files and --config produced it."""
    sources = ", ".join(map(str, workflow.configfiles)) or "no config file"
    plain = json.loads(json.dumps(config, default=str))  # what YAML can write (paths as text)
    body = yaml.safe_dump(plain, sort_keys=False, allow_unicode=True)
    write_text(path, f"# The campaign as it ran: {sources}, --config and the defaults.\n{body}")


def dataset_track_args():
    """track's --dataset options: each dataset and the meta.json its runs read."""
    return " ".join(f"--dataset {shlex.quote(f'{name}={meta}')}" for name, meta in dataset_metas().items())


def dataset_metas():
    """Each dataset of the campaign and the meta.json of what its runs read (MLflow logs it as an input)."""
    return {dataset: prepared(dataset)["meta"] for dataset in DATASETS}


def save_trials(path):
    write_manifest(path, CAMPAIGN, TRIALS, SKIPPED_DATASETS)


AUDIT = config["audit"]


def audit_groups():
    """The final cells of each private (mechanism, parameters, ε), by audit id: one audit job each.

    A job audits what its cells ran, at the budget of one report their runs recorded, so it starts
    once they are done; the id hashes what is audited (like a run id), so reruns keep it.
    """
    groups = {}
    for cell in final_cells().values():
        plan = cell[0]["plan"]
        if plan["epsilon"] is None:  # a non-private mechanism: nothing to audit
            continue
        audited = {key: plan[key] for key in ("mechanism", "mechanism_params", "epsilon")}
        groups.setdefault(run_id(canonical_json(audited)), []).append(cell_dir(cell))
    return groups


def audit_cells(wildcards):
    try:
        return sorted(audit_groups()[wildcards.audit_id])
    except KeyError:
        raise WorkflowError(f"audit {wildcards.audit_id} is not part of campaign '{CAMPAIGN}'") from None


def audit_parts(wildcards):
    return [str(LAYOUT.audit(audit_id)) for audit_id in sorted(audit_groups())]


def audit_flags():
    flags = [f"--{key.replace('_', '-')} {AUDIT[key]}" for key in ("samples", "dims", "alpha", "random_pairs", "seed")]
    if AUDIT["on_defect"] == "warn":
        flags.append("--warn")
    return " ".join(flags)


def audit_table():
    """The campaign's audit table, which the report shows, when the audit is enabled."""
    return [str(LAYOUT.table("audit"))] if AUDIT["enabled"] else []


def audit_table_flag():
    return f"--audit {shlex.quote(audit_table()[0])}" if AUDIT["enabled"] else ""


def scorecard_table():
    """The campaign's scorecard, which the report shows, when it names paper claims."""
    return [str(LAYOUT.table("scorecard"))] if config["scorecard"]["claims"] else []


def scorecard_flag():
    return f"--scorecard {shlex.quote(scorecard_table()[0])}" if scorecard_table() else ""


def tracking_experiment():
    return config["tracking"]["experiment"] or f"ldpbench/{CAMPAIGN}"


def tracking_store_after(tables):
    """What the tracking_store step waits for. A tracking server: nothing (runs stream into its
    experiment while they train, and a server that is away fails the campaign at its start). A
    SQLite store, which only `track` writes: the aggregated tables, so that MLflow's schema (5-10 s
    of migrations) is built beside the report on a core the serial tail leaves idle, not taken from
    the runs at the start. ancient(): a new aggregation does not redo the store."""
    if config["tracking"]["uri"].startswith(("http://", "https://")):
        return []
    return [ancient(path) for path in tables]


def live_tracking():
    """Whether runs stream their rounds to a tracking server while they train (tracking.live)."""
    tracking = config["tracking"]
    return tracking["enabled"] and tracking["live"] and tracking["uri"].startswith(("http://", "https://"))


# The jobs learn where to stream from the environment they inherit (local, worker or SLURM), not
# from their command line: switching the server on or off must not rerun finished cells.
if live_tracking():
    os.environ[LIVE_ENV] = live_environment(config["tracking"]["uri"], tracking_experiment(), CAMPAIGN)
else:
    os.environ.pop(LIVE_ENV, None)


def final_targets():
    targets = [LAYOUT.table("summary"), LAYOUT.report()]
    if config["tracking"]["enabled"]:
        targets.append(LAYOUT.tracking_marker)
    return [str(target) for target in targets]


_WORKER = {}


def start_worker():
    """The campaign's warm process (ldpbench/worker.py), for a local run; jobs find it through
    $LDPBENCH_WORKER and start as fresh processes without it."""
    if not config["worker"]["enabled"] or not workflow.local_exec:
        return
    started = worker.start(os.getpid(), LAYOUT.log("worker"))
    if started is None:
        log = LAYOUT.log("worker")
        logger.warning(f"NOTICE: the warm worker did not start (see {log}); each job imports ldpbench itself.")
        return
    _WORKER["process"], _WORKER["socket"] = started
    os.environ[worker.SOCKET_ENV] = str(_WORKER["socket"])


def stop_worker():
    if _WORKER:
        os.environ.pop(worker.SOCKET_ENV, None)
        worker.stop(_WORKER.pop("process"), _WORKER.pop("socket"))
