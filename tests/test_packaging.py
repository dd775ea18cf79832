"""Packaging: a built (not editable) wheel carries its data files; `ldpbench validate` works from it; the
dependencies are listed once, in pyproject.toml."""

import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml

SCHEMA = "ldpbench/schemas/config.schema.yaml"
TEMPLATES = "ldpbench/results/templates"
# The conda environments: conda provides these alone; pip installs the rest from pyproject.toml.
CONDA_ENVIRONMENTS = ("environment.yml", "workflow/envs/ldpbench.yaml")
CONDA_PROVIDES = {"python", "pip"}
# pip's part of a conda environment: this checkout, editable, with extras of pyproject.toml or none.
CHECKOUT = re.compile(r"-e \.(?:\[(?P<extras>[\w,-]+)\])?")


@pytest.mark.slow
def test_wheel_ships_the_schema_and_validates_from_any_directory(repo_root, tmp_path):
    # Build from a copy of what the wheel is made of: an in-tree build writes build/ and
    # *.egg-info into the checkout. No build isolation: setuptools comes from the test venv.
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(repo_root / name, source / name)
    shutil.copytree(repo_root / "ldpbench", source / "ldpbench",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(dist), str(source)], check=True, cwd=tmp_path)
    (wheel,) = dist.glob("ldpbench-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    assert SCHEMA in names, f"{SCHEMA} is not in the wheel: {sorted(n for n in names if 'dist-info' not in n)}"
    templates = sorted(path.relative_to(repo_root).as_posix() for path in (repo_root / TEMPLATES).iterdir())
    assert templates and set(templates) <= set(names), f"the report's templates are not all in the wheel: {templates}"

    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
                   check=True, cwd=tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # The dependencies come from the test venv, ldpbench from the installed wheel (not the checkout).
    env = {**os.environ, "PYTHONPATH": str(site)}
    where = subprocess.run([sys.executable, "-c", "import ldpbench; print(ldpbench.__file__)"],
                           cwd=elsewhere, env=env, capture_output=True, text=True, check=True)
    assert where.stdout.strip().startswith(str(site)), where.stdout
    result = subprocess.run([sys.executable, "-m", "ldpbench", "validate", str(repo_root / "config" / "config.yaml")],
                            cwd=elsewhere, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "runs" in result.stdout + result.stderr
    # The report's templates are found in the installed package, and each one compiles.
    load = ("from ldpbench.results.report_html import environment; "
            "names = environment().list_templates(); [environment().get_template(n) for n in names]; print(len(names))")
    result = subprocess.run([sys.executable, "-c", load], cwd=elsewhere, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) == len(templates)


def dependencies_outside_pyproject(environment: dict, extras: set[str]) -> list[str]:
    """What a conda environment file lists beyond Python, pip and this checkout installed by pip."""
    problems = []
    for entry in environment.get("dependencies") or []:
        if isinstance(entry, dict):
            for requirement in entry.get("pip") or []:
                match = CHECKOUT.fullmatch(str(requirement).strip())
                unknown = set((match.group("extras") or "").split(",")) - extras - {""} if match else set()
                if not match or unknown:
                    problems.append(f"pip: {requirement}")
            problems += [f"{key}: {value}" for key, value in entry.items() if key != "pip"]
        elif re.split(r"[\s=<>!~]", str(entry), maxsplit=1)[0] not in CONDA_PROVIDES:
            problems.append(str(entry))
    return problems


@pytest.mark.parametrize("name", CONDA_ENVIRONMENTS)
def test_conda_environment_lists_no_dependency_of_its_own(repo_root: Path, name: str):
    # pyproject.toml is the one list of dependencies: a pin written twice drifts.
    extras = set(tomllib.loads((repo_root / "pyproject.toml").read_text("utf-8"))["project"]["optional-dependencies"])
    environment = yaml.safe_load((repo_root / name).read_text(encoding="utf-8"))
    assert dependencies_outside_pyproject(environment, extras) == [], f"{name} lists dependencies: give them " \
        "to pyproject.toml and install the checkout with pip (-e .)"


def test_dependency_check_flags_packages_and_unknown_extras():
    environment = {"dependencies": ["python=3.11", "pip", "numpy>=1.26", {"pip": ["-e .[test]", "-e .[gpu]",
                                                                                 "torch==2.13.0"]}]}
    assert dependencies_outside_pyproject(environment, {"test"}) == ["numpy>=1.26", "pip: -e .[gpu]",
                                                                     "pip: torch==2.13.0"]
    assert dependencies_outside_pyproject({"dependencies": ["python=3.11", "pip", {"pip": ["-e ."]}]}, set()) == []


def test_conda_rules_environment_installs_the_checkout(repo_root: Path):
    # Snakemake creates the rules' environment from a copy of its file under .snakemake/conda/, where
    # pip's "-e ." would not be the checkout: its post-deploy script installs the checkout by path.
    script = (repo_root / "workflow/envs/ldpbench.post-deploy.sh").read_text(encoding="utf-8")
    assert re.search(r"^python -m pip install .*-e \"\$\{LDPBENCH_SOURCE", script, re.MULTILINE)
