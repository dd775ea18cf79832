"""Packaging: a built (not editable) wheel carries its data files; `ldpbench validate` works from it."""

import os
import shutil
import subprocess
import sys
import zipfile

import pytest

SCHEMA = "ldpbench/schemas/config.schema.yaml"


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
