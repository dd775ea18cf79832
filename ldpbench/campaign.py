"""Campaign files → validated config → run plans (`ldpbench.plan.RunPlan`) with stable run ids.

A run plan holds exactly what determines a run's numbers, every default applied; its run_id is a
hash of its canonical JSON, so the same plan has the same id in every campaign, shard and machine,
and a changed plan is a new run.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from ldpbench import mechanisms, tuning
from ldpbench.data import registry as datasets
from ldpbench.errors import ConfigError
from ldpbench.fl.clients import FIXED_CLIENT_SCHEMES, validation_clients
from ldpbench.fl.network_declarations import NETWORKS, check_network_params
from ldpbench.fl.settings import TrainingSettings
from ldpbench.plan import RunPlan, canonical_json
from ldpbench.plan import run_id as plan_run_id
from ldpbench.validation import (
    check_expanded_size,
    check_numbers,
    format_path,
    read_schema,
    read_yaml_file,
    schema_message,
    subschema,
    validator_with_defaults,
)

# Inside the package (package data), so an installed wheel validates campaigns from any directory.
DEFAULT_SCHEMA = Path(__file__).resolve().parent / "schemas" / "config.schema.yaml"

# Above this many runs `ldpbench validate` and the workflow warn (a dry run then takes minutes).
LARGE_GRID_RUNS = 100_000
# Where +∞ is a documented value: `eps_y: .inf` releases labels as they are (BitRand's baselines).
INFINITY_ALLOWED = {("mechanisms", "params", "eps_y")}
# Keys holding a path or a URI: they reach Snakemake's file patterns, where braces are wildcards.
PATH_KEYS = [("results_dir",), ("data", "raw_dir"), ("data", "prepared_dir"), ("data", "mirror"),
             ("features", "dir")]


# ---------------------------------------------------------------------------- validation
def _config_key(path: Iterable[Any]) -> str:
    """How an error names a key of the campaign config."""
    return f"config key '{format_path(path)}'"


def _subschema(schema: dict[str, Any], path: list[Any]) -> dict[str, Any]:
    """The schema of the value at `path` ({} where the schema leaves it open); a dataset's or mechanism
    entry's `training` overrides are checked like the campaign's `training`."""
    if len(path) > 2 and path[2] == "training" and path[0] in ("datasets", "mechanisms"):
        return subschema(schema["properties"]["training"], path[3:])
    return subschema(schema, path)


def _path_problem(value: str, is_directory: bool) -> str | None:
    if not value.strip():
        return "is empty"
    if "{" in value or "}" in value:
        return "contains a brace ('{' or '}'), which Snakemake would read as a wildcard"
    if is_directory and os.path.normpath(value).strip("/") == "":
        return "is the filesystem root"
    return None


def _check_paths(config: dict[str, Any]) -> None:
    """Path and URI keys: not empty, not the root, no braces (Snakemake wildcards)."""
    keys = [(path, True) for path in PATH_KEYS]
    keys += [(("features", "weights", encoder), False) for encoder in config["features"]["weights"]]
    keys += [(("tracking", "uri"), False), (("tracking", "experiment"), False)]
    for path, is_directory in keys:
        value = config
        for part in path:
            value = value[part]
        problem = None if value is None else _path_problem(value, is_directory)
        if problem:
            raise ConfigError(f"config key '{format_path(path)}': {problem}, got {value!r}")


# Snakemake's `--config epsilons=[1,2]` gives the list ['1', '2']: inside a list or a mapping its
# values stay strings, which the schema then rejects one by one.
COMMAND_LINE_LIST_HINT = ("hint: a list or mapping given with Snakemake's --config arrives as strings "
                          "(--config epsilons=[1,2] gives ['1', '2']); put it in a YAML file and pass "
                          "--configfile, or edit the campaign file")


def _numeric_string_in_container(error) -> bool:
    """A schema error about a string that reads as the number or boolean expected, inside a list or mapping."""
    if len(error.absolute_path) < 2 or not isinstance(error.instance, str) or error.validator != "type":
        return False
    try:
        yaml_value = yaml.safe_load(error.instance)
    except yaml.YAMLError:
        return False
    return isinstance(yaml_value, (int, float, bool))


def validate_config(config: dict[str, Any], schema_path: str | Path = DEFAULT_SCHEMA) -> dict[str, Any]:
    """Validate a campaign config and fill defaults; raise ConfigError naming the key path.

    Checks the expanded size (YAML aliases) and every number first, then the JSON schema, then
    what a schema cannot know: registered dataset and mechanism names, mechanism parameters,
    unique labels, paths, what each configuration's runs build from their settings (without data),
    the scorecard's claims. Whether a training.device is there depends on where the jobs run
    (`check_devices`).
    """
    check_expanded_size(config, _config_key)
    config = copy.deepcopy(config)
    schema = read_schema(schema_path)
    check_numbers(config, schema, _config_key, INFINITY_ALLOWED, _subschema)
    errors = sorted(validator_with_defaults(schema).iter_errors(config),
                    key=lambda e: (list(e.absolute_path), e.message))
    if errors:
        lines = [f"config key '{format_path(e.absolute_path)}': {schema_message(e)}" for e in errors[:10]]
        if any(_numeric_string_in_container(e) for e in errors):
            lines.append(COMMAND_LINE_LIST_HINT)
        raise ConfigError("invalid campaign config:\n  " + "\n  ".join(lines))
    if config["split"]["folds"] == 1:
        raise ConfigError("config key 'split.folds': must be 0 (a hold-out split) or an integer ≥ 2 "
                          "(K-fold cross-validation), got 1")
    _check_paths(config)

    training_validator = jsonschema.validators.validator_for(schema)(schema["properties"]["training"])
    for i, entry in enumerate(config["datasets"]):
        try:
            datasets.get(entry["name"])
        except ConfigError as error:
            raise ConfigError(f"config key 'datasets[{i}].name': {error}") from None
        merged = {**config["training"], **entry["training"]}
        for error in training_validator.iter_errors(merged):
            where = format_path(["datasets", i, "training", *error.absolute_path])
            raise ConfigError(f"invalid campaign config:\n  config key '{where}': {schema_message(error)}")
        for j, mechanism in enumerate(config["mechanisms"]):
            for error in training_validator.iter_errors({**merged, **mechanism["training"]}):
                where = format_path(["mechanisms", j, "training", *error.absolute_path])
                raise ConfigError(f"invalid campaign config:\n  config key '{where}': "
                                  f"{schema_message(error)}")
    labels: dict[str, int] = {}
    for i, entry in enumerate(config["mechanisms"]):
        try:
            mechanisms.get(entry["name"])
        except ConfigError as error:
            raise ConfigError(f"config key 'mechanisms[{i}].name': {error}") from None
        try:
            # At a budget where the defaults are valid (sqSGD's PrivQuant needs ε in the hundreds).
            example = max(1.0, mechanisms.get(entry["name"]).example_epsilon)
            mechanisms.create(entry["name"], epsilon=example, dims=100, params=entry["params"])
            if is_private(entry["name"]):
                for epsilon in entry.get("epsilons") or config["epsilons"]:
                    mechanisms.get(entry["name"]).check_epsilon(float(epsilon), entry["params"])
        except (ConfigError, TypeError) as error:
            raise ConfigError(f"config key 'mechanisms[{i}].params': {error}") from None
        label = entry.setdefault("label", entry["name"])
        if label in labels:
            raise ConfigError(
                f"config key 'mechanisms[{i}].label': label '{label}' is already used by "
                f"mechanisms[{labels[label]}]; give each entry a distinct label"
            )
        labels[label] = i
    model_lists = [("models", config["models"])] + [
        (f"datasets[{i}].models", entry["models"]) for i, entry in enumerate(config["datasets"]) if "models" in entry]
    for where, models in model_lists:
        for j, model in enumerate(models):
            if model not in NETWORKS:
                raise ConfigError(f"config key '{where}[{j}]': unknown network '{model}'; "
                                  f"registered networks: {', '.join(NETWORKS)}")
    names = [d["name"] for d in config["datasets"]]
    if len(set(names)) != len(names):
        raise ConfigError("config key 'datasets': a dataset is listed twice")
    _check_configurations(config)
    _check_duplicate_entries(config)
    _check_tuning(config, schema)
    _check_claims(config)
    return config


def _training_sources(config: dict[str, Any], i: int, j: int, entry: dict[str, Any]) -> dict[str, str]:
    """The config key each training setting of datasets[i] × mechanism entry j comes from (the
    campaign's `training`, the dataset's over it, the entry's over both)."""
    sources = {name: f"training.{name}" for name in config["training"]}
    sources.update({name: f"datasets[{i}].training.{name}" for name in config["datasets"][i]["training"]})
    sources.update({name: f"mechanisms[{j}].training.{name}" for name in entry.get("training", {})})
    return sources


# The run plan's refusals name the setting they refuse ("training.partition.clients ..."): its key
# in the campaign is where that setting comes from.
_SETTING = re.compile(r"training\.(\w+)((?:\.\w+)*)")


def _check_configurations(config: dict[str, Any]) -> None:
    """Every (dataset, model, mechanism entry) of the campaign: _check_configuration."""
    for i, dataset_entry in enumerate(config["datasets"]):
        for model in dataset_entry.get("models") or config["models"]:
            for j, entry in enumerate(config["mechanisms"]):
                _check_configuration(config, i, model, j, entry)


def _check_configuration(config: dict[str, Any], i: int, model: str, j: int, entry: dict[str, Any],
                         context: str = "", sources: dict[str, str] | None = None) -> None:
    """What a run of datasets[i] × `model` × mechanism entry j builds from its settings, built here
    without its data, so a fault fails validation instead of the run: the run plan (its training
    settings, partition, early stopping, the network's capabilities), the network's parameters
    (names and values, their declared checks), partition settings its scheme would ignore, and the
    validation clients where the number of clients is a setting. The error names the config key the
    faulty setting comes from (`sources` over the campaign's own: a tuning point's keys).
    """
    dataset_entry = config["datasets"][i]
    training = {**config["training"], **dataset_entry["training"], **entry.get("training", {})}
    sources = {**_training_sources(config, i, j, entry), **(sources or {})}
    innermost = (f"mechanisms[{j}].training" if entry.get("training") else
                 f"datasets[{i}].training" if dataset_entry["training"] else "training")
    where = (f"dataset '{dataset_entry['name']}', model '{model}', mechanism '{entry.get('label', entry['name'])}'"
             + (f", {context}" if context else ""))
    try:
        _configuration_plan(config, dataset_entry, model, entry)
    except ConfigError as error:
        match = _SETTING.match(str(error))
        key = (sources[match.group(1)] + match.group(2)) if match and match.group(1) in sources else innermost
        raise ConfigError(f"config key '{key}': {error} ({where})") from None
    for name, value in training.get("model_params", {}).items():
        try:
            check_network_params(model, {name: value})
        except ConfigError as error:
            raise ConfigError(f"config key '{sources['model_params']}.{name}': {error} ({where})") from None
    partition = training.get("partition", {})
    scheme = partition.get("scheme", "record")
    if "clients" in partition and scheme not in FIXED_CLIENT_SCHEMES:
        raise ConfigError(f"config key '{sources['partition']}.clients': scheme '{scheme}' gives the clients itself "
                          f"(record: one per record; natural: the dataset's client ids); clients is for "
                          f"{' and '.join(FIXED_CLIENT_SCHEMES)} ({where})")
    if "alpha" in partition and scheme != "dirichlet":
        raise ConfigError(f"config key '{sources['partition']}.alpha': the concentration of scheme 'dirichlet', "
                          f"not used by scheme '{scheme}' ({where})")
    if scheme in FIXED_CLIENT_SCHEMES and training.get("validation_fraction", 0):
        try:
            validation_clients(training["validation_fraction"], partition["clients"])
        except ConfigError as error:
            raise ConfigError(f"config key '{sources['validation_fraction']}': {error} "
                              f"(partition.clients = {partition['clients']}; {where})") from None


def check_devices(config: dict[str, Any]) -> None:
    """Each configuration's training.device is available on this machine ('cuda' needs a CUDA device),
    naming the key that sets it. The workflow refuses it in onstart where its jobs run on this machine
    (only then does Snakemake know where they run) and warns at its parse; `ldpbench validate` only
    warns (a campaign may be checked on a login node for jobs on GPU nodes)."""
    for i in range(len(config["datasets"])):
        for j, entry in enumerate(config["mechanisms"]):
            training = {**config["training"], **config["datasets"][i]["training"], **entry.get("training", {})}
            device = training.get("device", TrainingSettings.device)
            if device != "cuda":  # 'cpu' and 'auto' run on any machine; asking torch about CUDA costs its import
                continue
            try:
                TrainingSettings(device=device).resolved_device()
            except ConfigError as error:
                key = _training_sources(config, i, j, entry)["device"]
                raise ConfigError(f"config key '{key}': {error} on this machine; use 'cpu', or 'auto' (CUDA "
                                  f"where a device is available)") from None


def _check_claims(config: dict[str, Any]) -> None:
    """Each paper claims file of the scorecard reads and validates, and each of its claims names what
    the campaign runs (a dataset, a model of it, mechanism labels), before any job starts.

    Otherwise a misspelt label or dataset would be scored as "not run". A claim another campaign runs
    is listed under scorecard.not_run. An ε the campaign does not run is no error: the scorecard
    reads that claim as not run there (an entry may have its own ε list).
    """
    from ldpbench.claims import load_claims

    labels = [entry["label"] for entry in config["mechanisms"]]
    models = {entry["name"]: entry.get("models") or config["models"] for entry in config["datasets"]}
    not_run = config["scorecard"]["not_run"]
    found: dict[str, bool] = {}  # id of a listed claim → whether the campaign runs what it names
    for i, path in enumerate(config["scorecard"]["claims"]):
        try:
            claims = load_claims([path])
        except ConfigError as error:
            raise ConfigError(f"config key 'scorecard.claims[{i}]': {error}") from None
        ids = list(dict.fromkeys(claim.claim for claim in claims))  # the file's order: claims[index]
        for claim in claims:
            where, problem = _claim_problem(claim, labels, models)
            if claim.claim in not_run:
                found[claim.claim] = found.get(claim.claim, False) or problem is None
            elif problem:
                raise ConfigError(f"config key 'scorecard.claims[{i}]': paper claims file '{path}', key "
                                  f"'claims[{ids.index(claim.claim)}]{where}' (claim '{claim.claim}'): {problem}; "
                                  f"if another campaign runs this claim, list its id under scorecard.not_run")
    for k, claim_id in enumerate(not_run):
        if claim_id not in found:
            raise ConfigError(f"config key 'scorecard.not_run[{k}]': no claim '{claim_id}' in the files of "
                              f"scorecard.claims")
        if found[claim_id]:
            raise ConfigError(f"config key 'scorecard.not_run[{k}]': the campaign runs the dataset, model and "
                              f"mechanisms claim '{claim_id}' names; remove it from the list")


def _claim_problem(claim, labels: list[str], models: dict[str, list[str]]) -> tuple[str, str | None]:
    """(the claim's key at fault, what is wrong) when it names a dataset, model or label the campaign
    lacks; ("", None) when the campaign runs what it names."""
    if claim.dataset not in models:
        return ".dataset", (f"dataset '{claim.dataset}' is not one of the campaign's datasets "
                            f"({', '.join(models)})")
    if claim.model not in models[claim.dataset]:
        return ".model", (f"model '{claim.model}' is not one the campaign trains on '{claim.dataset}' "
                          f"({', '.join(models[claim.dataset])})")
    for j, label in enumerate(claim.mechanisms):
        if label not in labels:
            return f".mechanisms[{j}]", (f"mechanism label '{label}' is not one of the campaign's labels "
                                         f"({', '.join(labels)})")
    return "", None


def _check_tuning(config: dict[str, Any], schema: dict[str, Any]) -> None:
    """Each entry's tuning (the campaign's keys with the entry's over them): its schema, space and points."""
    tuning_validator = jsonschema.validators.validator_for(schema)(schema["properties"]["tuning"])
    training_validator = jsonschema.validators.validator_for(schema)(schema["properties"]["training"])
    for j, entry in enumerate(config["mechanisms"]):
        where = f"mechanisms[{j}].tuning" if entry.get("tuning") else "tuning"
        if entry.get("tuning"):
            for error in tuning_validator.iter_errors({**config.get("tuning", {}), **entry["tuning"]}):
                raise ConfigError(f"invalid campaign config:\n  config key "
                                  f"'{format_path([*where.split('.'), *error.absolute_path])}': "
                                  f"{schema_message(error)}")
        spec = tuning.spec_for(config, entry)
        if spec is None:
            continue
        tuning.check_spec(spec, where, config)
        example = max(1.0, mechanisms.get(entry["name"]).example_epsilon)
        for point in spec.points():
            trial = tuning.with_point(entry, point, {"validation_fraction": spec.validation_fraction})
            try:
                for dataset_entry in config["datasets"]:
                    merged = {**config["training"], **dataset_entry["training"], **trial["training"]}
                    for error in training_validator.iter_errors(merged):
                        raise ConfigError(f"training.{format_path(error.absolute_path)} {schema_message(error)}")
                mechanisms.create(entry["name"], epsilon=example, dims=100, params=trial["params"])
            except (ConfigError, TypeError) as error:
                raise ConfigError(f"config key '{where}.space': the point {point} is not valid: {error}") from None
            # A trial's runs, as the final runs' (_check_configurations): the point's settings are the space's.
            sources = {name: f"{where}.space.{name}" for name in tuning.split_point(point)[0]}
            sources["validation_fraction"] = f"{where}.validation_fraction"
            for i, dataset_entry in enumerate(config["datasets"]):
                for model in dataset_entry.get("models") or config["models"]:
                    _check_configuration(config, i, model, j, trial, f"tuning point {point}", sources)


def _check_duplicate_entries(config: dict[str, Any]) -> None:
    """Two mechanism entries that would give identical runs (same mechanism, parameters, training
    and an ε in common, defaults applied), found per configuration rather than by expanding the grid."""
    for dataset in config["datasets"]:
        model = (dataset.get("models") or config["models"])[0]
        first_entry: dict[tuple[str, float | None], int] = {}
        for j, entry in enumerate(config["mechanisms"]):
            plan = canonical_json(_configuration_plan(config, dataset, model, entry))
            for epsilon in _entry_epsilons(config, entry):
                key = (plan, epsilon)
                if key in first_entry:
                    at = "" if epsilon is None else f" at ε = {epsilon:g}"
                    raise ConfigError(f"config key 'mechanisms[{j}]': gives the same runs as "
                                      f"mechanisms[{first_entry[key]}]{at} (same mechanism, params and "
                                      f"training); remove the duplicate entry")
                first_entry.setdefault(key, j)


def load_config(path: str | Path, schema_path: str | Path = DEFAULT_SCHEMA) -> dict[str, Any]:
    path = Path(path)
    raw = read_yaml_file(path, "campaign file")
    if not isinstance(raw, dict):
        raise ConfigError(f"campaign file '{path}' must hold a mapping at the top level")
    return validate_config(raw, schema_path)


# ---------------------------------------------------------------------------- grid expansion
def is_private(mechanism_name: str) -> bool:
    """Non-private mechanisms (infinite ε) are run once per seed, not once per ε."""
    return mechanisms.get(mechanism_name).private


def runnable_datasets(config: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(datasets the campaign runs, optional ones it skips): an optional dataset is skipped when its files
    are neither in data.raw_dir nor in the mirror and downloads are not allowed."""
    data = config["data"]
    runnable, skipped = [], []
    for entry in config["datasets"]:
        local = datasets.get(entry["name"]).is_local(data["raw_dir"], data["mirror"])
        if entry["optional"] and not local and not data["allow_download"]:
            skipped.append(entry["name"])
        else:
            runnable.append(entry["name"])
    return runnable, skipped


def _selected_datasets(config: dict[str, Any], datasets_to_run: Iterable[str] | None) -> list[str]:
    selected = [d["name"] for d in config["datasets"]]
    if datasets_to_run is not None:
        keep = set(datasets_to_run)
        selected = [name for name in selected if name in keep]
    return selected


def _entry_epsilons(config: dict[str, Any], entry: dict[str, Any]) -> list[float | None]:
    if not is_private(entry["name"]):
        return [None]
    return [float(epsilon) for epsilon in entry.get("epsilons") or config["epsilons"]]


def count_runs(config: dict[str, Any], datasets_to_run: Iterable[str] | None = None) -> int:
    """len(expand(config, datasets_to_run)), counted without building the runs."""
    models = {d["name"]: d.get("models") or config["models"] for d in config["datasets"]}
    configurations = sum(len(models[name]) for name in _selected_datasets(config, datasets_to_run))
    per_model = sum(len(_entry_epsilons(config, entry)) for entry in config["mechanisms"])
    return configurations * per_model * len(config["seeds"]) * max(config["split"]["folds"], 1)


def _configuration_plan(config: dict[str, Any], dataset_entry: dict[str, Any], model: str,
                        entry: dict[str, Any], data_part: str = "private") -> dict[str, Any]:
    """The serialised plan of one configuration at seed 0, fold 0 and no ε (its defaults applied)."""
    split = config["split"]
    folds = split["folds"]
    training = {**config["training"], **dataset_entry["training"], **entry.get("training", {})}
    return RunPlan.resolve(
        dataset=dataset_entry["name"], features=dataset_entry.get("features") or "", model=model,
        mechanism=entry["name"], params=copy.deepcopy(dict(entry["params"])), training=copy.deepcopy(training),
        epsilon=None, seed=0, fold=0, folds=folds,
        test_fraction=float(split["test_fraction"]) if folds == 0 else 0.0,
        public_fraction=float(split["public_fraction"]), data_part=data_part).to_dict()


def _indexed_configurations(config: dict[str, Any], datasets_to_run: Iterable[str] | None):
    """(mechanism entry's index, (dataset entry, model, mechanism entry)) of every configuration, in the
    campaign's order."""
    models = {d["name"]: d.get("models") or config["models"] for d in config["datasets"]}
    selected = set(_selected_datasets(config, datasets_to_run))
    for dataset_entry in config["datasets"]:
        if dataset_entry["name"] in selected:
            for model in models[dataset_entry["name"]]:
                for index, entry in enumerate(config["mechanisms"]):
                    yield index, (dataset_entry, model, entry)


def _cell_id(*description: Any) -> str:
    """A cell's id: 16 hex digits of the sha256 of what determines its runs (as JSON)."""
    return hashlib.sha256(json.dumps(list(description)).encode("utf-8")).hexdigest()[:16]


def _entry_runs(config: dict[str, Any], dataset_entry: dict[str, Any], model: str, entry: dict[str, Any],
                epsilons: list[float | None], order: list[tuple[int, int]], data_part: str,
                seen: set[str]) -> list[tuple[str, list[dict[str, Any]]]]:
    """The runs of one mechanism entry on one (dataset, model), per ε in `epsilons`: (the configuration's
    canonical JSON at that ε, its runs at every (seed, fold) of `order`). The canonical JSON of each plan is
    assembled here from the values serialised once (keys in sorted order, as RunPlan.canonical_json writes
    them), so a grid of a million runs costs one hash per run rather than a dataclass copy and a full
    serialisation. The runs have no cell id yet: the caller groups them into cells."""
    base = _configuration_plan(config, dataset_entry, model, entry, data_part)
    label = entry.get("label", entry["name"])
    head = (f'{{"data_part":{canonical_json(base["data_part"])},'
            f'"dataset":{canonical_json(base["dataset"])},')
    features = f'"features":{canonical_json(base["features"])},'
    middle = "".join(f'"{key}":{canonical_json(base[key])},' for key in
                     ("folds", "mechanism", "mechanism_params", "model", "network_params", "public_fraction"))
    tail = (f'"test_fraction":{canonical_json(base["test_fraction"])},'
            f'"training":{canonical_json(base["training"])}}}')
    per_epsilon = []
    for epsilon in epsilons:
        at = f'"epsilon":{canonical_json(epsilon)},'
        runs = []
        for seed, fold in order:
            canonical = f'{head}{at}{features}"fold":{fold},{middle}"seed":{seed},{tail}'
            run_id = plan_run_id(canonical)
            if run_id in seen:
                raise ConfigError("two mechanism entries expand to identical runs; remove the duplicate entry")
            seen.add(run_id)
            plan = {**base, "epsilon": epsilon, "seed": seed, "fold": fold}
            runs.append({"run_id": run_id, "label": label, "plan": plan})
        per_epsilon.append((head + at + features + middle + tail, runs))
    return per_epsilon


def _replicates(config: dict[str, Any]) -> list[tuple[int, int]]:
    return [(int(seed), fold) for seed in config["seeds"] for fold in range(max(config["split"]["folds"], 1))]


@dataclass(frozen=True)
class Cell:
    """One job of a campaign: the runs of one configuration at one ε, and what they are derived from.

    A cell's id hashes what determines its runs, so an edit of the campaign gives new cells exactly
    where runs change, and an edit back finds the old cells done. A final cell holds every seed and
    fold; a trial cell every point of its configuration's tuning space at every tuning seed. A tuned
    final cell's runs are known once its trials are scored (`tuned_cell_runs`): its id hashes its
    configuration as the campaign writes it, its replicates and its trial cell's id (which hashes
    every trial), so it is known before the selection and the job graph is fixed from the start.
    """

    cell_id: str
    phase: str  # layout.TRIAL or layout.FINAL
    dataset: str
    model: str
    mechanism: str
    label: str
    epsilon: float | None
    run_count: int
    runs: tuple[dict[str, Any], ...]  # {run_id, label, plan, cell_id[, trial facts]}; () for a tuned final cell
    trial_cell: str | None = None  # a tuned final cell: the trial cell its setting is selected from
    source: tuple[int, str, int] | None = None  # a tuned final cell: (dataset entry, model, mechanism entry)

    @property
    def tuned(self) -> bool:
        """A final cell whose setting the tuning selects (its runs are built after the selection)."""
        return self.trial_cell is not None


def _replicate_list(order: list[tuple[int, int]]) -> list[tuple[int, int]]:
    return sorted(order)


def campaign_cells(config: dict[str, Any], datasets_to_run: Iterable[str] | None = None) -> list[Cell]:
    """Every cell of the campaign in a stable order: the tuning trials' cells, then the final runs'.

    `datasets_to_run` restricts the grid (optional datasets that are unavailable are left out).
    """
    from ldpbench.layout import FINAL, TRIAL

    order = _replicates(config)
    trial_cells: list[Cell] = []
    final_cells: list[Cell] = []
    seen: set[str] = set()
    trial_seen: set[str] = set()
    dataset_index = {entry["name"]: i for i, entry in enumerate(config["datasets"])}
    for mechanism_index, (dataset_entry, model, entry) in _indexed_configurations(config, datasets_to_run):
        label = entry.get("label", entry["name"])
        epsilons = _entry_epsilons(config, entry)
        facts = (dataset_entry["name"], model, entry["name"], label)
        spec = tuning.spec_for(config, entry)
        if spec is None:
            for configuration, runs in _entry_runs(config, dataset_entry, model, entry, epsilons, order, "private",
                                                   seen):
                cell_id = _cell_id(configuration, _replicate_list(order))
                epsilon = runs[0]["plan"]["epsilon"]
                final_cells.append(Cell(cell_id, FINAL, *facts, epsilon, len(runs),
                                        tuple({**run, "cell_id": cell_id} for run in runs)))
            continue
        # The trials: every point at every tuning seed (fold 0 of the campaign's split), one cell per ε.
        trial_order = [(seed, 0) for seed in spec.seeds]
        selection = {"metric": spec.metric, "direction": "minimize" if spec.minimise else "maximize",
                     "data": spec.data}
        by_epsilon: list[tuple[list[str], list[dict[str, Any]]]] = [([], []) for _ in epsilons]
        for index, point in enumerate(spec.points()):
            trial = tuning.with_point(entry, point, {"validation_fraction": spec.validation_fraction})
            facts_of_point = {"point": index, "setting": tuning.setting_json(point), **selection}
            for (configurations, runs), (configuration, point_runs) in zip(
                    by_epsilon, _entry_runs(config, dataset_entry, model, trial, epsilons, trial_order, spec.data,
                                            trial_seen)):
                configurations.append(configuration)
                runs += [{**run, **facts_of_point} for run in point_runs]
        templates = _entry_runs(config, dataset_entry, model, entry, epsilons, [], "private", set())
        for epsilon, (configurations, runs), (template, _) in zip(epsilons, by_epsilon, templates):
            # What a trial cell's plan file says of its runs (how they are scored) is part of its id too.
            trial_id = _cell_id("trials", configurations, _replicate_list(trial_order), selection)
            trial_cells.append(Cell(trial_id, TRIAL, *facts, epsilon, len(runs),
                                    tuple({**run, "cell_id": trial_id} for run in runs)))
            final_id = _cell_id("tuned", template, _replicate_list(order), trial_id)
            final_cells.append(Cell(final_id, FINAL, *facts, epsilon, len(order), (), trial_id,
                                    (dataset_index[dataset_entry["name"]], model, mechanism_index)))
    return trial_cells + final_cells


def tuned_cell_runs(config: dict[str, Any], cell: Cell, point: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs of a tuned final cell, once its trials have selected `point` (tuning.select)."""
    if not cell.tuned:
        raise ValueError(f"cell {cell.cell_id} is not a tuned final cell")
    dataset_index, model, mechanism_index = cell.source
    entry = tuning.with_point(config["mechanisms"][mechanism_index], point)
    [(_, runs)] = _entry_runs(config, config["datasets"][dataset_index], model, entry, [cell.epsilon],
                              _replicates(config), "private", set())
    return [{**run, "cell_id": cell.cell_id} for run in runs]


def expand(config: dict[str, Any], datasets_to_run: Iterable[str] | None = None,
           selected: dict[tuple[str, str, str, float], dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The campaign's final runs as the campaign file writes them: a list of {run_id, label, plan, cell_id}.

    `plan` is a RunPlan's dict (RunPlan.from_dict reads it back). `datasets_to_run` restricts the
    grid (optional datasets that are unavailable are left out). `selected` maps (dataset, model,
    label, ε) to a point of the entry's tuning space (ε = inf for non-private entries): tuned entries
    then run with it; without it every entry runs with its own settings (a tuned campaign's final
    cells are `campaign_cells`', built after the selection by `tuned_cell_runs`). Cells are one per
    configuration and ε, by content. The runs of one configuration share their parameter and
    training dicts.
    """
    order = _replicates(config)
    runs: list[dict[str, Any]] = []
    seen: set[str] = set()
    for _, (dataset_entry, model, entry) in _indexed_configurations(config, datasets_to_run):
        if selected is not None and tuning.spec_for(config, entry) is not None:
            label = entry.get("label", entry["name"])
            epsilons = _entry_epsilons(config, entry)
            for epsilon in epsilons:
                key = (dataset_entry["name"], model, label, math.inf if epsilon is None else epsilon)
                if key not in selected:
                    raise ConfigError(f"the tuning selected no setting for {key}; run the selection again")
            entries = [(tuning.with_point(entry, selected[(dataset_entry["name"], model, label,
                                                            math.inf if epsilon is None else epsilon)]), [epsilon])
                       for epsilon in epsilons]
        else:
            entries = [(entry, _entry_epsilons(config, entry))]
        for used, epsilons in entries:
            for configuration, cell_runs in _entry_runs(config, dataset_entry, model, used, epsilons, order,
                                                        "private", seen):
                cell_id = _cell_id(configuration, _replicate_list(order))
                runs += [{**run, "cell_id": cell_id} for run in cell_runs]
    return runs


def expand_trials(config: dict[str, Any], datasets_to_run: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """The tuning trials: like `expand`'s runs, plus the point (index and setting JSON) each one tries and
    the metric, direction and data it is selected by; one cell per (dataset, model, entry, ε), every point
    at every tuning seed. Empty without tuning."""
    from ldpbench.layout import TRIAL

    return [run for cell in campaign_cells(config, datasets_to_run) if cell.phase == TRIAL for run in cell.runs]


def write_cell_index(path: str | Path, cell_ids) -> bool:
    """Write the sorted cell ids to `path` unless it already holds exactly them (its modification time
    then says when the set last changed); whether it was written."""
    from ldpbench.atomic import write_text

    text = json.dumps(sorted(cell_ids), indent=0) + "\n"
    path = Path(path)
    if path.is_file() and path.read_text(encoding="utf-8") == text:
        return False
    write_text(path, text)
    return True


def write_manifest(path: str | Path, campaign: str, phase: str, runs: list[dict[str, Any]],
                   skipped_datasets: list[str]) -> None:
    """A manifest: the runs of one phase of the campaign (trials.json, manifest.json) with their plans,
    ids, labels and cells, read by aggregation, the selection and `ldpbench status`."""
    from ldpbench.atomic import write_json

    write_json(path, {"campaign": campaign, "phase": phase, "runs": runs,
                      "skipped_datasets": sorted(skipped_datasets)})
