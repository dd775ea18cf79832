"""The workflow's parse imports no torch: Snakemake validates a campaign and plans its runs with the
registries' declarations alone (ldpbench.deferred_import, ldpbench.fl.network_declarations, plugins
loaded only for a name that is not built in). Nor does planning a tuned cell, in Snakemake's own
process while jobs run, import scipy's statistics."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from ldpbench.deferred_import import deferred

from workflow_cli import environment, snakemake_command

REPO = Path(__file__).resolve().parents[1]

# Runs Snakemake as `snakemake` does, and prints at its exit whether the process imported torch.
IMPORTED_AT_EXIT = ("import atexit, runpy, sys; "
                    "atexit.register(lambda: print('torch imported:', 'torch' in sys.modules)); "
                    "sys.argv = ['snakemake', *sys.argv[1:]]; runpy.run_module('snakemake', run_name='__main__')")


def test_a_dry_run_of_the_default_campaign_imports_no_torch(tmp_path):
    """The default campaign file, planned from scratch (its syn-L part: UCI Adult's files are not at hand),
    with the example plugin installed as the README's test command installs it."""
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config["data"].update(raw_dir=str(tmp_path / "raw"), prepared_dir=str(tmp_path / "prepared"), mirror=None)
    command = snakemake_command(tmp_path / "campaign", config, "--dry-run", "--cores", "2")
    assert command[1:3] == ["-m", "snakemake"]
    result = subprocess.run([sys.executable, "-c", IMPORTED_AT_EXIT, *command[3:]], env=environment(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "run_cell" in result.stdout, result.stdout[-3000:]
    assert "torch imported: False" in result.stdout, result.stdout[-3000:]


def test_reading_a_tuned_cells_trials_imports_no_scipy():
    """Snakemake's process writes a tuned cell's plan from its trials' runs (tuning.select_cell, which
    reads them with results.tables): an import of half a second there holds up the scheduling of every
    job while a core waits."""
    probe = ("import sys\n"
             "from ldpbench.tuning import select_cell\n"
             "from ldpbench.results.tables import load_runs\n"
             "print(sorted(name for name in sys.modules if name.split('.')[0] == 'scipy'))\n")
    result = subprocess.run([sys.executable, "-c", probe], env=environment(), capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]"


def test_a_deferred_module_is_imported_at_its_first_use_and_then_bound_itself(tmp_path, monkeypatch):
    (tmp_path / "module_imported_late.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "module_imported_late", raising=False)
    namespace: dict = {}
    namespace["module_imported_late"] = deferred("module_imported_late", namespace)
    assert "module_imported_late" not in sys.modules
    assert "imported at its first use" in repr(namespace["module_imported_late"])
    assert namespace["module_imported_late"].VALUE == 42
    assert namespace["module_imported_late"] is sys.modules["module_imported_late"]
