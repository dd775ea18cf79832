"""Untrusted campaign files: rejected before any job starts, with the key path; YAML loaded safely;
names that would reach a path or a shell restricted by the schema."""

from __future__ import annotations

import copy
import math
import os
import re
import subprocess
import sys

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ldpbench.campaign import load_config, validate_config
from ldpbench.errors import ConfigError

from workflow_cli import REPO, environment, run_snakemake, run_snakemake_command, snakemake_command

BASE = {
    "campaign": "fuzz",
    "datasets": [{"name": "syn-S-0.1-0.9", "training": {"learning_rate": 0.5}}],
    "models": ["lr"],
    "mechanisms": [{"name": "pm", "label": "PM"}, {"name": "ps-pm", "params": {"mu": 0.2}}],
    "epsilons": [1, 2],
    "seeds": [0],
    "split": {"folds": 0},
    "training": {"epochs": 1},
    "tracking": {"enabled": False},
}

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10, 10**6), st.text(max_size=12),
                    st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from(["np", "pm", "adult", "lr", "$(rm -rf /)", "../x", "a;b", ""]))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)), max_leaves=6)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for key, child in node.items():
            yield from _paths(child, prefix + (key,))
    elif isinstance(node, list):
        for index, child in enumerate(node):
            yield from _paths(child, prefix + (index,))


@st.composite
def mutated_configs(draw):
    config = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(config) if p]
        path = draw(st.sampled_from(paths))
        parent = config
        for part in path[:-1]:
            parent = parent[part]
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "replace":
            parent[path[-1]] = draw(values)
        elif action == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=8))] = draw(values)
        else:
            parent.append(draw(values))
    return config


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_configs())
def test_validator_accepts_or_raises_config_error_naming_the_key(config):
    try:
        validated = validate_config(config)
    except ConfigError as error:
        assert "config key '" in str(error), str(error)
    else:
        assert isinstance(validated, dict) and validated["campaign"]
        for path in _paths(validated):
            value = validated
            for part in path:
                value = value[part]
            assert not isinstance(value, float) or math.isfinite(value), path


@st.composite
def non_finite_configs(draw):
    """A complete config (defaults written out) with one value replaced by NaN or ±∞."""
    config = validate_config(BASE)
    path = draw(st.sampled_from([p for p in _paths(config) if p]))
    parent = config
    for part in path[:-1]:
        parent = parent[part]
    parent[path[-1]] = draw(st.sampled_from([math.nan, math.inf, -math.inf]))
    return config, path


def _key(path) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else p) for i, p in enumerate(path))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(non_finite_configs())
def test_a_non_finite_number_anywhere_is_refused_naming_its_key(case):
    config, path = case
    with pytest.raises(ConfigError, match=re.escape(f"config key '{_key(path)}': must be a finite number")):
        validate_config(config)


# Unknown names, bad epsilons and seeds are test_campaign.py's (test_invalid_configs_name_the_key,
# which checks the whole message); these are the key paths it does not reach.
@pytest.mark.parametrize("change, key", [
    (lambda c: c["mechanisms"][0].__setitem__("epsilons", [0]), "mechanisms[0].epsilons[0]"),
    (lambda c: c.pop("datasets"), "<top level>"),
    (lambda c: c["training"].__setitem__("epochs", 1.5), "training.epochs"),
    (lambda c: c["datasets"][0]["training"].__setitem__("learning_rate", "fast"),
     "datasets[0].training.learning_rate"),
    (lambda c: c.__setitem__("campaign", "x; rm -rf ~"), "campaign"),
    (lambda c: c.__setitem__("campaign", "../../etc"), "campaign"),
])
def test_invalid_campaign_is_rejected_with_the_key_path(change, key):
    config = copy.deepcopy(BASE)
    change(config)
    with pytest.raises(ConfigError, match=re.escape(f"config key '{key}'")):
        validate_config(config)


EVIL_YAML = """campaign: evil
sentinel: !!python/object/apply:os.system ["touch {sentinel}"]
"""


def test_yaml_with_python_tags_is_refused_by_ldpbench_and_by_the_workflow(tmp_path):
    sentinel = tmp_path / "EXECUTED"
    evil = tmp_path / "evil.yaml"
    evil.write_text(EVIL_YAML.format(sentinel=sentinel))
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(evil)
    # Snakemake reads --configfile itself; it must refuse the tag too, before any job.
    command = snakemake_command(tmp_path / "work", {"placeholder": True}, "--dry-run", "--cores", "1")
    command[command.index("--configfile") + 1] = str(evil)
    result = run_snakemake_command(command, timeout=300)
    assert result.returncode != 0
    assert not sentinel.exists()
    assert "not valid JSON or YAML" in result.stdout


def alias_bomb(levels: int = 9) -> str:
    """BASE with a 'billion laughs' block under training.model_params: 10**levels strings once
    every alias is written out, in a file of a few hundred bytes."""
    lines = ["    l0: &l0 [" + ", ".join(["lol"] * 10) + "]"]
    lines += [f"    l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, levels)]
    lines[-1] = lines[-1].replace(f"&l{levels - 1} ", "")
    base = {k: v for k, v in BASE.items() if k != "training"}
    return yaml.safe_dump(base) + "training:\n  model_params:\n" + "\n".join(lines) + "\n"


def test_yaml_alias_bomb_is_refused_naming_the_key(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb())
    with pytest.raises(ConfigError, match=r"config key 'training.model_params.l8': expands to 1.11e\+09 values"):
        load_config(path)


def test_a_config_already_expanded_past_the_limit_is_refused_naming_the_key():
    # What Snakemake's config merge leaves of a mapping-alias bomb: nothing shared, many values.
    config = copy.deepcopy(BASE)
    config["training"]["model_params"] = {"weights": [{"w": 0.5} for _ in range(60_000)]}
    with pytest.raises(ConfigError, match=r"config key 'training.model_params': the document holds more than "
                                          r"100,000 values"):
        validate_config(config)


def test_recursive_alias_and_deep_nesting_are_refused_naming_the_key():
    looped = copy.deepcopy(BASE)
    looped["training"]["model_params"] = {"loop": []}
    looped["training"]["model_params"]["loop"].append(looped["training"]["model_params"]["loop"])
    with pytest.raises(ConfigError, match=r"config key 'training.model_params.loop\[0\]': refers to itself"):
        validate_config(looped)
    deep = copy.deepcopy(BASE)
    inner: list = []
    deep["training"]["model_params"] = {"deep": inner}
    for _ in range(40):
        inner.append([])
        inner = inner[0]
    with pytest.raises(ConfigError, match=r"config key 'training.model_params.deep(\[0\])+': nested more than 32"):
        validate_config(deep)


NUMBERS = [
    (lambda c: c.__setitem__("epsilons", [1, math.nan]), "epsilons[1]",
     r"finite number \(a number in \[0.001, 10000\]\)"),
    (lambda c: c.__setitem__("epsilons", [math.inf]), "epsilons[0]", "finite number"),
    (lambda c: c.__setitem__("epsilons", [1e308]), "epsilons[0]", r"a number in \[0.001, 10000\], got 1e\+308"),
    (lambda c: c.__setitem__("epsilons", [1e-308]), "epsilons[0]", r"a number in \[0.001, 10000\]"),
    (lambda c: c["mechanisms"][0].__setitem__("epsilons", [-math.inf]), "mechanisms[0].epsilons[0]", "finite"),
    (lambda c: c["training"].__setitem__("learning_rate", math.nan), "training.learning_rate",
     r"finite number \(a number in \(0, ∞\)\), got nan"),
    (lambda c: c["training"].__setitem__("learning_rate", math.inf), "training.learning_rate", "finite"),
    (lambda c: c["training"].__setitem__("l2", math.inf), "training.l2", r"a number in \[0, ∞\)"),
    (lambda c: c["datasets"][0]["training"].__setitem__("learning_rate", math.nan),
     "datasets[0].training.learning_rate", r"a number in \(0, ∞\)"),
    (lambda c: c["split"].__setitem__("test_fraction", math.nan), "split.test_fraction",
     r"a number in \(0, 1\)"),
    (lambda c: c["training"].__setitem__("batch_fraction", math.nan), "training.batch_fraction", r"\(0, 1\]"),
    (lambda c: c["training"].__setitem__("model_params", {"hidden": [math.nan]}),
     "training.model_params.hidden[0]", "finite number, got nan"),
    (lambda c: c["mechanisms"][1]["params"].__setitem__("mu", math.nan), "mechanisms[1].params.mu", "finite"),
    (lambda c: c["mechanisms"][1]["params"].__setitem__("eta", math.inf), "mechanisms[1].params.eta", "finite"),
    (lambda c: c.__setitem__("mechanisms", [{"name": "bitrand", "params": {"eps_y": -math.inf}}]),
     "mechanisms[0].params.eps_y", "finite"),
    (lambda c: c.__setitem__("seeds", [2**63]), "seeds[0]", r"an integer in \[0, 9223372036854775807\]"),
    (lambda c: c["training"].__setitem__("rounds", 2**64), "training.rounds", "an integer in"),
    (lambda c: c["split"].__setitem__("folds", 1), "split.folds", r"0 \(a hold-out split\) or an integer ≥ 2"),
    (lambda c: c.__setitem__("campaign", "c" * 101), "campaign", "must be at most 100 characters long, got 101"),
]


@pytest.mark.parametrize("change, key, expected", NUMBERS, ids=[key for _, key, _ in NUMBERS])
def test_numbers_out_of_range_are_refused_naming_the_key_and_range(change, key, expected):
    config = copy.deepcopy(BASE)
    change(config)
    with pytest.raises(ConfigError, match=re.escape(f"config key '{key}': ") + ".*" + expected):
        validate_config(config)


def test_documented_infinity_and_range_ends_are_accepted():
    config = copy.deepcopy(BASE)
    config["mechanisms"] = [{"name": "bitrand", "params": {"eps_y": math.inf}}]
    config.update(epsilons=[0.001, 10000], seeds=[0, 2**63 - 1], campaign="c" * 100)
    config["split"] = {"folds": 2}
    assert validate_config(config)["mechanisms"][0]["params"]["eps_y"] == math.inf


PATHS = [
    ("results_dir", ""), ("results_dir", "/"), ("results_dir", "/tmp/.."), ("results_dir", "res{ults}"),
    ("data.raw_dir", " "), ("data.prepared_dir", "prepared/{dataset}"), ("data.mirror", ""),
    ("features.dir", "//"), ("features.weights.resnet18", "w{}.pt"), ("tracking.uri", ""),
    ("tracking.experiment", "ldpbench/{x}"),
]


@pytest.mark.parametrize("key, value", PATHS)
def test_empty_root_and_brace_paths_are_refused_naming_the_key(key, value):
    config = copy.deepcopy(BASE)
    *parents, last = key.split(".")
    target = config
    for part in parents:
        target = target.setdefault(part, {})
    target[last] = value
    with pytest.raises(ConfigError, match=re.escape(f"config key '{key}': ") + "(is empty|contains a brace|is the "
                                          "filesystem root)"):
        validate_config(config)


def _without_campaign(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.startswith("campaign:")) + "\n"


SAME_ERROR_CASES = {
    "no campaign key": lambda: _without_campaign(yaml.safe_dump(BASE)),
    "alias bomb": alias_bomb,
    "NaN epsilon": lambda: yaml.safe_dump(BASE).replace("- 2\n", "- .nan\n", 1),
    "empty results_dir": lambda: yaml.safe_dump({**BASE, "results_dir": ""}),
    "brace in prepared_dir": lambda: yaml.safe_dump({**BASE, "data": {"prepared_dir": "p/{dataset}"}}),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(SAME_ERROR_CASES))
def test_ldpbench_validate_and_the_workflow_refuse_a_file_with_the_same_error(tmp_path, case):
    """Snakemake merges --configfile over config/config.yaml; the campaign is still the user's file
    alone (no `campaign: default` inherited), checked by the same rules as `ldpbench validate`."""
    work = tmp_path / "work"
    (work / "config").mkdir(parents=True)
    (work / "config" / "config.yaml").write_text((REPO / "config" / "config.yaml").read_text())
    path = work / "user.yaml"
    path.write_text(SAME_ERROR_CASES[case]())
    validate = subprocess.run([sys.executable, "-m", "ldpbench", "validate", str(path)], env=environment(),
                              capture_output=True, text=True, timeout=120)
    assert validate.returncode == 2 and "Traceback" not in validate.stderr
    message = validate.stderr.split("error: ", 1)[1].strip()
    assert "config key '" in message
    command = snakemake_command(work, {"placeholder": True}, "--dry-run", "--cores", "1")
    command[command.index("--configfile") + 1] = str(path)
    workflow = run_snakemake_command(command, timeout=300)
    assert workflow.returncode != 0
    output = workflow.stdout
    assert all(line.strip() in output for line in message.splitlines()), (message, output)
    assert not (work / "results").exists()


def _load_claims(path):
    from ldpbench.claims import load_claims

    return load_claims([path])


# What reads a campaign or paper claims file, and how its errors name it.
LOADERS = {"campaign file": load_config, "paper claims file": _load_claims}


def _special_file(tmp_path, kind):
    """A file that is not a few kilobytes of UTF-8 YAML, and the message that refuses it."""
    if kind == "/dev/zero":  # read whole, it would fill the memory
        return "/dev/zero", "not a regular file"
    if kind == "named pipe":  # opened for reading, it would wait for a writer forever
        path = tmp_path / "pipe.yaml"
        os.mkfifo(path)
        return path, "not a regular file"
    path = tmp_path / "file.yaml"
    if kind == "too large":  # valid YAML, a 4 MiB comment after it
        path.write_text(yaml.safe_dump(BASE) + "#" * 4 * 2**20 + "\n")
        return path, "larger than 4 MiB"
    path.write_bytes(yaml.safe_dump(BASE).encode() + "# caf\xe9\n".encode("latin-1"))  # Latin-1, not UTF-8
    return path, r"not UTF-8 text \(byte 0xe9 at offset \d+\)"


@pytest.mark.skipif(not hasattr(os, "mkfifo") or not os.path.exists("/dev/zero"), reason="POSIX special files")
@pytest.mark.parametrize("kind", ["/dev/zero", "named pipe", "too large", "not UTF-8"])
@pytest.mark.parametrize("what", sorted(LOADERS))
def test_a_special_large_or_non_utf8_file_is_refused_naming_it_before_it_is_read(tmp_path, what, kind):
    path, message = _special_file(tmp_path, kind)
    with pytest.raises(ConfigError, match=re.escape(f"{what} '{path}': ") + message):
        LOADERS[what](path)


@pytest.mark.slow
def test_the_workflow_refuses_cuda_without_a_cuda_device_when_its_jobs_run_here(tmp_path):
    """A local run stops before its first job, naming the key; a campaign whose jobs a cluster runs (SLURM's
    executor) is not refused on the machine that submits it: Snakemake knows where the jobs run only from
    onstart on (at the parse every run reads as local)."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    config = {**BASE, "training": {"epochs": 1, "device": "cuda"}}
    message = "config key 'training.device': training.device is 'cuda' but no CUDA device is available on this machine"
    result = run_snakemake(tmp_path / "work", config, "--cores", "1", timeout=300)
    assert result.returncode != 0 and message in result.stdout, result.stdout[-3000:]
    assert "Finished jobid" not in result.stdout and not (tmp_path / "work" / "data").exists()
    assert not list((tmp_path / "work" / "results").glob("*/progress/*.json"))  # no record of a campaign running
    submitted = run_snakemake(tmp_path / "work", config, "--executor", "slurm", "--jobs", "1", "--dry-run", timeout=300)
    assert submitted.returncode == 0, submitted.stdout[-3000:]
    assert f"NOTICE: {message}" in submitted.stdout and "run_cell" in submitted.stdout
