"""Campaign validation (errors name the key) and grid expansion."""

import copy
import subprocess
import sys

import pytest
import torch
import yaml

from ldpbench.campaign import DEFAULT_SCHEMA, check_devices, expand, load_config, validate_config
from ldpbench.errors import ConfigError
from ldpbench.plan import RunPlan

MINIMAL = {
    "campaign": "t",
    "datasets": [{"name": "syn-S-0.01-0.9"}],
    "models": ["lr"],
    "mechanisms": [{"name": "np"}, {"name": "pm"}, {"name": "ps-pm", "params": {"mu": 0.2}}],
    "epsilons": [1, 2],
    "seeds": [0, 1],
}


def with_change(path, value):
    config = copy.deepcopy(MINIMAL)
    target = config
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return config


def test_defaults_are_filled():
    config = validate_config(MINIMAL)
    # Training defaults are TrainingSettings' alone: the config keeps what the campaign set, the plan resolves.
    assert config["training"] == {}
    plan = RunPlan.from_dict(expand(config)[0]["plan"])
    assert plan.training.learning_rate == 0.1 and plan.training.epochs == 1
    assert config["data"]["allow_download"] is False and config["split"]["folds"] == 0
    assert config["mechanisms"][0]["label"] == "np" and config["datasets"][0]["optional"] is False
    assert "training" not in MINIMAL  # validation works on a copy


@pytest.mark.parametrize("config,expected", [
    ({**MINIMAL, "epsilon": [1]}, r"config key '<top level>': Additional properties .*'epsilon' was unexpected"),
    (with_change(["epsilons"], [1, 0]), r"config key 'epsilons\[1\]': must be a number in \[0.001, 10000\], got 0"),
    (with_change(["epsilons"], [-2]), r"config key 'epsilons\[0\]'"),
    (with_change(["seeds"], ["zero"]), r"config key 'seeds\[0\]': 'zero' is not of type 'integer'"),
    (with_change(["models"], ["cnn"]), r"config key 'models\[0\]': unknown network 'cnn'"),
    ({**MINIMAL, "training": {"learnin_rate": 0.1}}, r"config key 'training': Additional properties"),
    ({**MINIMAL, "training": {"epochs": 0}}, r"config key 'training.epochs'"),
    (with_change(["mechanisms"], [{"name": "pm2"}]), r"config key 'mechanisms\[0\].name': unknown mechanism 'pm2'"),
    (with_change(["mechanisms"], [{"name": "ps-pm", "params": {"muu": 1}}]),
     r"config key 'mechanisms\[0\].params': mechanism 'ps-pm' has no parameter\(s\) \['muu'\]"),
    (with_change(["mechanisms"], [{"name": "ps-pm", "params": {"mu": 1.5}}]), r"mechanisms\[0\].params.*mu must be in"),
    (with_change(["mechanisms"], [{"name": "pm"}, {"name": "pm"}]), r"mechanisms\[1\].label.*already used"),
    (with_change(["datasets"], [{"name": "adlt"}]), r"config key 'datasets\[0\].name': unknown dataset 'adlt'"),
    (with_change(["datasets"], [{"name": "adult", "training": {"learning_rate": -1}}]),
     r"config key 'datasets\[0\].training.learning_rate'"),
    (with_change(["datasets"], []), r"config key 'datasets'"),
    (with_change(["datasets"], [{"name": "adult", "models": ["lenet"]}]),
     r"config key 'datasets\[0\].models\[0\]': unknown network 'lenet'"),
    (with_change(["training"], {"partition": {"scheme": "shards"}}), r"config key 'training.partition.scheme'"),
    ({k: v for k, v in MINIMAL.items() if k != "seeds"}, r"'seeds' is a required property"),
    # 10⁸ reports per input needed about 18 GB in a job that declared 4 GB; the audit's memory and
    # time follow the samples (ldpbench.audit.memory_mib), bounded here.
    ({**MINIMAL, "audit": {"samples": 100_000_000}},
     r"config key 'audit.samples': must be an integer in \[1000, 10000000\], got 100000000"),
])
def test_invalid_configs_name_the_key(config, expected):
    with pytest.raises(ConfigError, match=expected):
        validate_config(config)


def test_config_files_in_the_repository_are_valid(repo_root):
    for path in [repo_root / "config" / "config.yaml", *sorted((repo_root / "config").glob("campaigns/*.yaml"))]:
        config = load_config(path)
        assert expand(config)


def test_a_campaign_with_claims_is_checked_without_the_statistics(repo_root):
    """Every Snakemake invocation (a dry run, a status, each edit's rerun) parses the workflow, which
    validates the campaign and its claims files: that must not import the scorecard's statistics (scipy
    alone is a second of every parse)."""
    script = ("import sys; from ldpbench.campaign import load_config; "
              "config = load_config(sys.argv[1]); assert config['scorecard']['claims']; "
              "heavy = ('scipy', 'ldpbench.scorecard', 'ldpbench.results.tables'); "
              "print(sorted(module for module in heavy if module in sys.modules))")
    campaign = repo_root / "config" / "campaigns" / "fedsel-table3.yaml"
    found = subprocess.run([sys.executable, "-c", script, str(campaign)], capture_output=True, text=True,
                           cwd=repo_root, check=True)
    assert found.stdout.strip() == "[]", found.stdout + found.stderr


def test_bad_yaml_names_the_file(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("campaign: [unclosed\n")
    with pytest.raises(ConfigError, match="broken.yaml"):
        load_config(path)


def test_grid_expansion():
    config = validate_config(MINIMAL)
    runs = expand(config)
    # np once per seed; pm and ps-pm per ε per seed.
    assert len(runs) == 2 + 2 * 2 * 2
    assert len({r["run_id"] for r in runs}) == len(runs)
    assert {r["plan"]["epsilon"] for r in runs if r["plan"]["mechanism"] == "np"} == {None}
    assert expand(config) == runs  # stable order and ids


def test_changing_one_epsilon_keeps_the_other_run_ids():
    before = {r["run_id"] for r in expand(validate_config(MINIMAL))}
    after = {r["run_id"] for r in expand(validate_config(with_change(["epsilons"], [1, 4])))}
    assert len(before & after) == 2 + 2 * 2  # np and the ε = 1 runs are unchanged
    assert len(after - before) == 2 * 2


def test_folds_and_per_dataset_training():
    config = validate_config({**MINIMAL, "split": {"folds": 3},
                              "datasets": [{"name": "syn-S-0.01-0.9", "training": {"learning_rate": 0.5}}]})
    runs = expand(config)
    assert len(runs) == 3 * (2 + 2 * 2 * 2)
    assert {r["plan"]["fold"] for r in runs} == {0, 1, 2}
    assert {r["plan"]["training"]["learning_rate"] for r in runs} == {0.5}
    assert expand(config, datasets_to_run=[]) == []


def test_schema_is_yaml_with_required_keys():
    schema = yaml.safe_load(DEFAULT_SCHEMA.read_text())
    assert set(schema["required"]) >= {"campaign", "datasets", "mechanisms", "epsilons", "seeds"}


def test_cells_group_replicates_and_change_only_with_their_runs():
    config = validate_config({**MINIMAL, "split": {"folds": 2}})
    runs = expand(config)
    cells = {}
    for run in runs:
        cells.setdefault(run["cell_id"], []).append(run)
    assert len(cells) == 1 + 2 * 2 and all(len(c) == 2 * 2 for c in cells.values())  # seeds × folds
    more = expand(validate_config({**MINIMAL, "split": {"folds": 2}, "epsilons": [1, 2, 8]}))
    assert {r["cell_id"] for r in runs} < {r["cell_id"] for r in more}
    other_seeds = expand(validate_config({**MINIMAL, "split": {"folds": 2}, "seeds": [0]}))
    assert not {r["cell_id"] for r in runs} & {r["cell_id"] for r in other_seeds}


def test_per_mechanism_epsilons():
    config = validate_config({**MINIMAL, "mechanisms": [
        {"name": "pm"}, {"name": "ps-pm", "label": "PS-PM-C", "params": {"control": True}, "epsilons": [2]}]})
    runs = expand(config)
    assert {r["plan"]["epsilon"] for r in runs if r["label"] == "PS-PM-C"} == {2.0}
    assert {r["plan"]["epsilon"] for r in runs if r["label"] == "pm"} == {1.0, 2.0}


def test_per_mechanism_training_overrides_apply_over_the_datasets_and_are_checked():
    config = {**MINIMAL,
              "training": {"learning_rate": 0.1, "epsilon_scope": "per_report"},
              "datasets": [{"name": "syn-S-0.01-0.9", "training": {"learning_rate": 0.5}}],
              "mechanisms": [{"name": "pm"}, {"name": "ldp-fl", "training": {"epsilon_scope": "total"}}]}
    runs = expand(validate_config(config))
    training = {r["label"]: r["plan"]["training"] for r in runs}
    assert training["pm"]["epsilon_scope"] == "per_report" and training["ldp-fl"]["epsilon_scope"] == "total"
    assert training["pm"]["learning_rate"] == training["ldp-fl"]["learning_rate"] == 0.5
    # Without an override the plan (and so the run id) is what it was before overrides existed.
    plain = expand(validate_config({**config, "mechanisms": [{"name": "pm"}]}))
    assert {r["run_id"] for r in plain} <= {r["run_id"] for r in runs}
    bad = {**config, "mechanisms": [{"name": "pm", "training": {"epsilon_scope": "sometimes"}}]}
    with pytest.raises(ConfigError, match=r"mechanisms\[0\]\.training\.epsilon_scope"):
        validate_config(bad)


def test_an_epsilon_a_mechanism_cannot_run_at_fails_validation_naming_the_entry():
    # cpSGD's (k, m) exist only at ε = 5 and 10 (DiffSketch App. C Table 1).
    cpsgd = {"name": "cpsgd", "params": {"bits": 4}}
    with pytest.raises(ConfigError, match=r"mechanisms\[0\]\.params.*ε=1"):
        validate_config({**MINIMAL, "mechanisms": [cpsgd]})
    runs = expand(validate_config({**MINIMAL, "mechanisms": [{**cpsgd, "epsilons": [5, 10]}]}))
    assert {r["plan"]["epsilon"] for r in runs} == {5.0, 10.0}


def test_a_dataset_may_name_its_own_models():
    from ldpbench.campaign import expand, validate_config

    config = validate_config({**MINIMAL, "datasets": [{"name": "syn-S-0.1-0.9", "models": ["svm"]}],
                              "models": ["lr"]})
    assert {run["plan"]["model"] for run in expand(config)} == {"svm"}


def test_every_shipped_campaign_is_valid():
    from pathlib import Path

    from ldpbench.campaign import expand, load_config

    campaigns = sorted((Path(__file__).resolve().parents[1] / "config" / "campaigns").glob("*.yaml"))
    assert {p.stem for p in campaigns} >= {"fedsel", "bitrand", "sqsgd", "diffsketch"}
    for path in campaigns:
        assert expand(load_config(path)), path


# (run_id, cell_id) of the first, middle and last run, the run count and a digest of all sorted
# (run_id, cell_id) pairs, as computed when run plans replaced run specs (every default and the
# network's parameters entered the hash) and again when validation clients, early stopping and the
# public data part entered the plan; the default campaign's grid was cut to LR at three ε then, to
# leave room for its tuning stage (the untuned final runs' ids are pinned), and when
# training.gradients entered the plan (the linear models' gradients by formula move their numbers at
# float rounding, so their runs are new runs). A change here moves every stored run id.
KNOWN_IDS = {
    "config/config.yaml": (42, "7201b16b563eaee8", [("1b7e4aae9534cd28", "a8f1054d77f7c595"),
                                                  ("113e962ed968b5a5", "2d8183b3ff8ffbe1"),
                                                  ("c24744d43f833fcd", "1b35da8075784a50")]),
    "config/campaigns/fedsel.yaml": (5280, "5b72f2390e20fc26", [("fe615be3bd0eb261", "70a4e55fba327c20"),
                                                               ("01eefe897c7a6778", "545af55dac6e0cca"),
                                                               ("a7e9db65cf4cd683", "7e0072fbfb416f03")]),
}


@pytest.mark.parametrize("path", sorted(KNOWN_IDS))
def test_run_and_cell_ids_are_stable(repo_root, path):
    import hashlib
    import json

    count, digest, samples = KNOWN_IDS[path]
    runs = expand(load_config(repo_root / path))
    pairs = sorted((run["run_id"], run["cell_id"]) for run in runs)
    assert len(runs) == count
    assert [(r["run_id"], r["cell_id"]) for r in (runs[0], runs[len(runs) // 2], runs[-1])] == samples
    assert hashlib.sha256(json.dumps(pairs).encode()).hexdigest()[:16] == digest


@pytest.mark.parametrize("path", ["config/config.yaml", "config/campaigns/bitrand.yaml"])
def test_run_ids_hash_the_plan_and_cell_ids_the_configuration_and_replicates(repo_root, path):
    """expand's fast path writes the canonical JSON by hand: it must be RunPlan's, byte for byte."""
    import hashlib
    import json

    from ldpbench.plan import canonical_json

    runs = expand(load_config(repo_root / path))
    cells = {}
    for run in runs:
        plan = RunPlan.from_dict(run["plan"])
        assert plan.run_id == run["run_id"] and plan.to_dict() == run["plan"]
        configuration = {key: value for key, value in run["plan"].items() if key not in ("seed", "fold")}
        cells.setdefault(run["cell_id"], (canonical_json(configuration), []))[1].append((plan.seed, plan.fold))
    for cell_id, (configuration, replicates) in cells.items():
        cell_json = json.dumps([configuration, sorted(replicates)])
        assert hashlib.sha256(cell_json.encode("utf-8")).hexdigest()[:16] == cell_id


@pytest.mark.parametrize("change", [
    {},
    {"split": {"folds": 3}},
    {"mechanisms": [{"name": "np"}, {"name": "pm", "epsilons": [4]}, {"name": "ps-pm"}]},
    {"datasets": [{"name": "syn-S-0.01-0.9", "models": ["lr", "svm"]}, {"name": "syn-S-0.1-0.9"}]},
])
def test_count_runs_counts_the_expanded_grid(change):
    from ldpbench.campaign import count_runs

    config = validate_config({**MINIMAL, **change})
    assert count_runs(config) == len(expand(config))
    assert count_runs(config, ["syn-S-0.1-0.9"]) == len(expand(config, ["syn-S-0.1-0.9"]))


def test_duplicate_entries_are_refused_at_validation_naming_the_entry():
    config = {**MINIMAL, "mechanisms": [{"name": "pm", "epsilons": [1, 2]},
                                        {"name": "pm", "label": "PM again", "epsilons": [2, 4]}]}
    with pytest.raises(ConfigError, match=r"config key 'mechanisms\[1\]': gives the same runs as mechanisms\[0\] "
                                          r"at ε = 2"):
        validate_config(config)
    # Same mechanism with other parameters or other ε: different runs, accepted.
    validate_config({**config, "mechanisms": [{"name": "pm", "epsilons": [1]},
                                              {"name": "pm", "label": "PM again", "epsilons": [2]}]})


def with_settings(training=None, models=None, dataset_training=None, entry_training=None, tuning=None):
    """MINIMAL with training settings at the campaign's, the dataset's or mechanisms[1]'s level."""
    config = copy.deepcopy(MINIMAL)
    config.update({key: value for key, value in (("training", training), ("models", models), ("tuning", tuning))
                   if value is not None})
    if dataset_training is not None:
        config["datasets"][0]["training"] = dataset_training
    if entry_training is not None:
        config["mechanisms"][1]["training"] = entry_training
    return config


# Settings a run would refuse when it starts (after the jobs began), refused at validation naming the key.
@pytest.mark.parametrize("config,expected", [
    # Counts with a ceiling (a typo such as 10**14 rounds would run for ever).
    (with_settings({"rounds": 10**14}), r"config key 'training.rounds': must be an integer in \[0, 1000000\]"),
    (with_settings({"epochs": 10**6}), r"config key 'training.epochs': must be an integer in \[1, 10000\]"),
    (with_settings(entry_training={"local_epochs": 10**4}),
     r"config key 'mechanisms\[1\].training.local_epochs': must be an integer in \[1, 1000\]"),
    (with_settings({"validation_fraction": 0.2, "stop": {"max_rounds": 10**7}}),
     r"config key 'training.stop.max_rounds': must be an integer in \[0, 1000000\]"),
    (with_settings(tuning={"space": {"learning_rate": {"low": 0.01, "high": 1}}, "method": "random",
                           "samples": 10_001}),
     r"config key 'tuning.samples': must be an integer in \[1, 10000\]"),
    # The network's parameters: names it has, values it takes, for every model trained.
    (with_settings({"model_params": {"hidden": [10]}}),
     r"config key 'training.model_params.hidden': network 'lr' has no parameter\(s\) \['hidden'\]; its parameters "
     r"are none \(dataset 'syn-S-0.01-0.9', model 'lr', mechanism 'np'\)"),
    (with_settings({"model_params": {"hidden": [10]}}, models=["mlp", "lr"]),
     r"config key 'training.model_params.hidden': network 'lr' has no parameter"),
    (with_settings({"model_params": {"hidden": "wide"}}, models=["mlp"]),
     r"config key 'training.model_params.hidden': network 'mlp': hidden must be a non-empty list of positive ints, "
     r"got 'wide'"),
    (with_settings(dataset_training={"model_params": {"layers": 0}}, models=["char-lstm"]),
     r"config key 'datasets\[0\].training.model_params.layers': network 'char-lstm': layers must be a positive int"),
    (with_settings(entry_training={"model_params": {"norm_groups": 3}}, models=["resnet20"]),
     r"config key 'mechanisms\[1\].training.model_params.norm_groups': network 'resnet20': norm_groups must divide 16"),
    # The plan of every model, not only the first: closed-form gradients need a network with a formula.
    (with_settings({"gradients": "closed-form"}, models=["lr", "mlp"]),
     r"config key 'training.gradients': training.gradients is 'closed-form' but network 'mlp' has no formula"),
    (with_settings(tuning={"space": {"gradients": ["auto", "closed-form"]}}, models=["lr", "mlp"]),
     r"config key 'tuning.space.gradients': training.gradients is 'closed-form' but network 'mlp' .*tuning point"),
    # The partition.
    (with_settings({"partition": {"scheme": "iid"}}),
     r"config key 'training.partition.clients': .* is needed by scheme 'iid'"),
    (with_settings(dataset_training={"partition": {"scheme": "dirichlet", "alpha": 0.1}}),
     r"config key 'datasets\[0\].training.partition.clients': .* is needed by scheme 'dirichlet'"),
    (with_settings({"partition": {"scheme": "record", "clients": 10}}),
     r"config key 'training.partition.clients': scheme 'record' gives the clients itself"),
    (with_settings({"partition": {"scheme": "iid", "clients": 10, "alpha": 0.1}}),
     r"config key 'training.partition.alpha': the concentration of scheme 'dirichlet', not used by scheme 'iid'"),
    (with_settings({"partition": {"scheme": "iid", "clients": 2}, "validation_fraction": 0.1}),
     r"config key 'training.validation_fraction': training.validation_fraction 0.1 holds out 0 of 2 clients"),
    (with_settings({"partition": {"scheme": "iid", "clients": 3}},
                   tuning={"space": {"learning_rate": [0.1, 0.2]}, "validation_fraction": 0.1}),
     r"config key 'tuning.validation_fraction': training.validation_fraction 0.1 holds out 0 of 3 clients"),
])
def test_settings_a_run_would_refuse_fail_validation_naming_the_key(config, expected):
    with pytest.raises(ConfigError, match=expected):
        validate_config(config)


def test_settings_a_run_accepts_pass_validation():
    config = with_settings({"partition": {"scheme": "dirichlet", "clients": 10, "alpha": 0.1},
                            "validation_fraction": 0.2, "rounds": 1_000_000, "model_params": {"hidden": [8]}},
                           models=["mlp"], entry_training={"model_params": {"hidden": [4, 4]}})
    assert validate_config(config)["mechanisms"][1]["training"]["model_params"] == {"hidden": [4, 4]}


def test_cuda_without_a_cuda_device_is_named_by_its_key_and_left_to_where_the_jobs_run(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    config = validate_config(with_settings({"device": "auto"}, entry_training={"device": "cuda"}))
    # Valid: the jobs may run elsewhere (GPU nodes); the workflow refuses it where they run here.
    with pytest.raises(ConfigError, match=r"config key 'mechanisms\[1\].training.device': training.device is 'cuda' "
                                          r"but no CUDA device is available on this machine; use 'cpu', or 'auto'"):
        check_devices(config)
    check_devices(validate_config(with_settings({"device": "auto"})))


def test_each_schema_reads_as_pyyamls_python_parser_reads_it():
    """The schemas are parsed by libyaml where PyYAML has it: the same documents as the Python parser's."""
    from ldpbench import validation

    for schema in sorted(DEFAULT_SCHEMA.parent.glob("*.yaml")):
        assert validation.read_schema(schema) == yaml.safe_load(schema.read_text()), schema.name


def test_a_schema_is_parsed_once_per_version_and_each_caller_gets_its_own_copy(tmp_path):
    from ldpbench import validation

    schema = tmp_path / "schema.yaml"
    schema.write_text(DEFAULT_SCHEMA.read_text())
    first = validation.read_schema(schema)
    first["properties"].clear()  # a caller's copy: changing it changes no later reading
    assert validation.read_schema(schema)["properties"] and validation._parsed_schema.cache_info().hits >= 1
    config = yaml.safe_load((DEFAULT_SCHEMA.parents[2] / "config" / "config.yaml").read_text())
    assert validate_config(copy.deepcopy(config), schema)["training"]["epochs"] == 1
    # The file edited (a key made required that the config lacks): read again.
    edited = yaml.safe_load(schema.read_text())
    edited["required"] = [*edited.get("required", []), "no_such_key"]
    schema.write_text(yaml.safe_dump(edited))
    with pytest.raises(ConfigError, match="no_such_key"):
        validate_config(copy.deepcopy(config), schema)
