"""Snakemake beyond its documented API is reached through ldpbench/snakemake_compat.py alone, which
fails naming what a Snakemake lacks, and the Snakemake pin admits the version the tests run on only.

The scan reads the Snakefile and the rule files as Python tokens (Snakemake's syntax is Python's, token
for token), so comments and paths such as "workflow.json" are not mistaken for code; in the package's
modules, where `workflow` is no Snakemake object, it checks the imports.
"""

from __future__ import annotations

import io
import re
import tokenize
import tomllib
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from ldpbench import snakemake_compat
from ldpbench.errors import UnsupportedSnakemake

REPO = Path(__file__).resolve().parents[1]
COMPAT = REPO / "ldpbench" / "snakemake_compat.py"
# What Snakemake documents of its `workflow` object, and the one module of it the workflow may import.
DOCUMENTED_WORKFLOW = {"source_path", "cores"}
PUBLIC_MODULES = {"snakemake.utils"}
SKIPPED = {tokenize.COMMENT, tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING}


def logical_lines(text: str) -> list[list[tokenize.TokenInfo]]:
    lines, line = [], []
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
            if line:
                lines.append(line)
            line = []
        elif token.type not in SKIPPED:
            line.append(token)
    return lines


def imported(line: list[tokenize.TokenInfo]) -> list[tuple[str, str | None]]:
    """(module, name) of each import in an import statement (name None for `import module`)."""
    words = [token.string for token in line if token.string not in "()"]
    if words[:1] == ["import"]:
        return [(clause.split(" as ")[0], None) for clause in " ".join(words[1:]).replace(" . ", ".").split(" , ")]
    if words[:1] == ["from"] and "import" in words:
        split = words.index("import")
        module = "".join(words[1:split])
        clauses = " ".join(words[split + 1:]).split(" , ")
        return [(module, clause.split(" as ")[0].strip(" ,")) for clause in clauses if clause.strip(" ,")]
    return []


def private_imports(line: list[tokenize.TokenInfo]) -> list[str]:
    """The Snakemake modules and names an import statement takes, other than PUBLIC_MODULES' public names."""
    return [module if name is None else f"{module}.{name}" for module, name in imported(line)
            if (module == "snakemake" or module.startswith("snakemake."))
            and (module not in PUBLIC_MODULES or name is None or name.startswith("_"))]


def private_workflow_uses(line: list[tokenize.TokenInfo]) -> list[str]:
    """`workflow.<name>` (in code or a format string) and `getattr(workflow, ...)` beyond what Snakemake
    documents."""
    found = []
    for i, token in enumerate(line):
        following = [t.string for t in line[i + 1:i + 3]]
        if token.string == "workflow" and following[:1] == ["."] and following[1:] != []:
            found += [f"workflow.{following[1]}"] if following[1] not in DOCUMENTED_WORKFLOW else []
        elif token.string == "getattr" and following == ["(", "workflow"]:
            found.append("getattr(workflow, ...)")
        elif token.type == tokenize.STRING:
            found += [f"workflow.{name}" for name in re.findall(r"\{workflow\.(\w+)", token.string)
                      if name not in DOCUMENTED_WORKFLOW]
    return found


def private_uses(text: str, workflow_file: bool) -> list[str]:
    found = []
    for line in logical_lines(text):
        uses = private_imports(line) + (private_workflow_uses(line) if workflow_file else [])
        found += [f"line {line[0].start[0]}: {use}" for use in uses]
    return found


def scanned_files() -> dict[Path, bool]:
    """Each file the scan reads, and whether it is one of the workflow's (where `workflow` is Snakemake's)."""
    workflow = [REPO / "Snakefile", *sorted((REPO / "workflow" / "rules").glob("*.smk"))]
    package = [path for path in sorted((REPO / "ldpbench").rglob("*.py")) if path != COMPAT]
    return {**dict.fromkeys(workflow, True), **dict.fromkeys(package, False)}


def test_only_the_compat_module_touches_snakemake_beyond_its_documented_api():
    files = scanned_files()
    assert REPO / "workflow" / "rules" / "common.smk" in files and len(files) > 20
    found = {str(path.relative_to(REPO)): uses for path, workflow_file in files.items()
             if (uses := private_uses(path.read_text(encoding="utf-8"), workflow_file))}
    assert found == {}, "reach these through ldpbench/snakemake_compat.py"


def test_the_scan_finds_private_names_and_leaves_documented_ones():
    text = '''from snakemake.utils import min_version, validate
from snakemake.scheduling.job_scheduler import JobScheduler
from snakemake.utils import _private
import snakemake.logging as log
from snakemake import api
report: "workflow/report/workflow.rst"  # workflow.local_exec in a comment
path = workflow.source_path("x") + workflow.cores
jobs_here = workflow.local_exec
workflow.scheduler.job_rate_limiter = None
value = getattr(workflow, "basedir")
shell: "cd {workflow.basedir} && run"
'''
    assert private_uses(text, workflow_file=True) == [
        "line 2: snakemake.scheduling.job_scheduler.JobScheduler", "line 3: snakemake.utils._private",
        "line 4: snakemake.logging", "line 5: snakemake.api", "line 8: workflow.local_exec",
        "line 9: workflow.scheduler", "line 10: getattr(workflow, ...)", "line 11: workflow.basedir"]
    assert private_uses(text, workflow_file=False) == private_uses(text, workflow_file=True)[:4]


def complete_workflow(**attributes) -> SimpleNamespace:
    """A stand-in for Snakemake's workflow object with every attribute the workflow uses."""
    values = dict(config_settings=SimpleNamespace(overwrite_config={}), overwrite_configfiles=[],
                  configfiles=[], local_exec=True, basedir="/checkout", scheduler=None)
    return SimpleNamespace(**{**values, **attributes})


def test_this_snakemakes_scheduler_and_a_complete_workflow_lack_nothing():
    assert snakemake_compat.missing(complete_workflow()) == []


def test_a_missing_attribute_is_named_with_the_snakemake_version():
    workflow = complete_workflow()
    del workflow.local_exec
    workflow.config_settings = SimpleNamespace()  # overwrite_config renamed

    class Scheduler:
        def __init__(self):
            self.rate_limiter = None

    assert snakemake_compat.missing(workflow, Scheduler) == [
        "workflow.config_settings.overwrite_config", "workflow.local_exec", "JobScheduler.job_rate_limiter"]
    with pytest.raises(UnsupportedSnakemake) as error:
        snakemake_compat.check(workflow)
    message = str(error.value)
    assert f"Snakemake {metadata.version('snakemake')} lacks" in message
    assert "workflow.local_exec: whether the jobs run on this machine" in message
    assert "workflow.config_settings.overwrite_config:" in message and "job_rate_limiter" not in message


def test_onstart_switches_the_rate_limit_off_for_local_jobs_only():
    limiter = object()
    local = complete_workflow(scheduler=SimpleNamespace(job_rate_limiter=limiter))
    assert snakemake_compat.switch_off_local_rate_limit(local)
    assert local.scheduler.job_rate_limiter is None
    # Through an executor plugin (SLURM) the limit paces the submissions: it stays.
    cluster = complete_workflow(local_exec=False, scheduler=SimpleNamespace(job_rate_limiter=limiter))
    assert not snakemake_compat.switch_off_local_rate_limit(cluster)
    assert cluster.scheduler.job_rate_limiter is limiter


def test_a_scheduler_without_the_rate_limiter_is_named():
    for scheduler in (None, SimpleNamespace(rate_limiter=None)):
        with pytest.raises(UnsupportedSnakemake, match=r"JobScheduler\.job_rate_limiter: the job rate limit"):
            snakemake_compat.switch_off_local_rate_limit(complete_workflow(scheduler=scheduler))


def snakemake_pin() -> Requirement:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    (pin,) = [Requirement(entry) for entry in project["dependencies"] if Requirement(entry).name == "snakemake"]
    return pin


def test_the_pin_admits_the_tested_snakemake_and_no_other_minor_version():
    """The tests run on the installed Snakemake: the pin (and the Snakefile's min_version) admit its
    minor version from it on, and neither the minor version before nor the one after."""
    installed = Version(metadata.version("snakemake"))
    specifier = snakemake_pin().specifier
    assert installed in specifier, f"the tests run on Snakemake {installed}, outside the pin {specifier}"
    major, minor = installed.release[:2]
    assert Version(f"{major}.{minor + 1}") not in specifier and Version(f"{major}.{minor - 1}.99") not in specifier
    (lower,) = [spec.version for spec in specifier if spec.operator == ">="]
    snakefile = (REPO / "Snakefile").read_text(encoding="utf-8")
    assert re.search(r'^min_version\("([^"]+)"\)', snakefile, re.MULTILINE).group(1) == lower
