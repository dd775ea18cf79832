"""ldpbench.layout is the one description of the results tree: the workflow's paths come from it, they
are the paths campaigns have always been written to, and no other file spells a piece of it."""

import io
import re
import sys
import tokenize
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

from ldpbench import layout
from ldpbench.layout import CampaignLayout

REPO = Path(__file__).resolve().parents[1]


def dry_run_jobs(root: Path, config: dict) -> dict[str, list[dict[str, str]]]:
    """rule → its jobs' input, output, log, wildcards and shell command, as `snakemake --dry-run -p` prints them."""
    (root / "campaign.yaml").write_text(yaml.safe_dump(config))
    from workflow_cli import run_snakemake_command

    result = run_snakemake_command(
        [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory", str(root),
         "--configfile", str(root / "campaign.yaml"), "--dry-run", "--printshellcmds", "--cores", "1"], cwd=REPO)
    assert result.returncode == 0, result.stdout[-5000:]
    jobs: dict[str, list[dict[str, str]]] = defaultdict(list)
    job: dict[str, str] = {}
    for line in result.stdout.splitlines():
        if match := re.match(r"(?:local)?rule (\w+):$", line):
            job = {}
            jobs[match[1]].append(job)
        elif match := re.match(r"    (input|output|log|wildcards): (.*)$", line):
            job[match[1]] = match[2]
        elif line.startswith("Shell command: "):
            job["shell"] = line.removeprefix("Shell command: ")
    return jobs


def wildcards(job: dict[str, str]) -> dict[str, str]:
    return dict(pair.split("=", 1) for pair in job["wildcards"].split(", "))


@pytest.fixture(scope="module")
def campaign(tmp_path_factory):
    from workflow_cli import tiny_config

    root = tmp_path_factory.mktemp("layout")
    config = tiny_config(root)
    config["tracking"]["enabled"] = True
    return root, dry_run_jobs(root, config)


def test_the_workflow_writes_where_the_layout_says(campaign):
    root, jobs = campaign
    paths = CampaignLayout(root / "results", "tiny")
    cells = [wildcards(job) for job in jobs["run_cell"]]
    assert len(cells) == 5
    expected = {
        "manifest": {(str(paths.manifest), str(paths.log("manifest")))},
        "plan": {(str(paths.plan(cell["cell_id"])), str(paths.plan_log(cell["cell_id"]))) for cell in cells},
        "run_cell": {(str(paths.cell_marker(cell["dataset"], cell["mechanism"], cell["cell_id"])),
                      str(paths.cell_log(cell["dataset"], cell["mechanism"], cell["cell_id"]))) for cell in cells},
        "prepare_dataset": {(str(layout.prepared_meta(root / "prepared", "syn-S-0.01-0.9")),
                             str(layout.prepare_log("syn-S-0.01-0.9")))},
        "aggregate": {(", ".join(str(paths.table(table)) for table in layout.AGGREGATE_TABLES),
                       str(paths.log("aggregate")))},
        "compare": {(", ".join(str(paths.table(table)) for table in layout.COMPARE_TABLES), str(paths.log("compare")))},
        "report": {(f"{paths.report(layout.REPORT_INDEX)}, {paths.figures_dir}", str(paths.log("report")))},
        "tracking_store": {(str(paths.tracking_store), str(paths.log("tracking_store")))},
        "track": {(str(paths.tracking_marker), str(paths.log("track")))},
        "track_report": {(str(paths.tracking_report_marker), str(paths.log("track_report")))},
        "campaign_file": {(str(paths.campaign_file), str(paths.log("campaign_file")))},
        "audit_table": {(str(paths.table(layout.AUDIT_TABLE)), str(paths.log("audit_table")))},
    }
    declared = {rule: {(job["output"], job["log"]) for job in rule_jobs}
                for rule, rule_jobs in jobs.items() if rule != "all"}
    assert declared == expected
    [cell_job] = [job for job in jobs["run_cell"] if wildcards(job)["mechanism"] == "np"]
    assert f"--checkpoint-dir {paths.checkpoints_dir} " in cell_job["shell"]
    assert f"--runs-root {paths.runs_dir} " in cell_job["shell"]
    assert f"--runs-root {paths.runs_dir} " in jobs["aggregate"][0]["shell"]
    assert f"--audits {paths.audits_dir} " in jobs["audit_table"][0]["shell"]
    assert f"--artifact-dir {paths.artifacts_dir} " in jobs["track"][0]["shell"]


def test_the_layout_is_the_one_campaigns_were_written_to(campaign):
    """Byte for byte the paths of earlier versions, so existing results stay valid."""
    root, jobs = campaign
    results = f"{root}/results/tiny"
    cells = [wildcards(job) for job in jobs["run_cell"]]
    old = {f"{results}/manifest.json", f"{results}/tables/runs.parquet", f"{results}/tables/curves.parquet",
           f"{results}/tables/summary.parquet", f"{results}/report/index.html",
           f"{results}/tracking/store.json", f"{results}/tracking/mlflow.json",
           f"{root}/prepared/syn-S-0.01-0.9/meta.json", "logs/data/prepare_syn-S-0.01-0.9.log",
           *(f"logs/tiny/{job}.log" for job in ("manifest", "aggregate", "report", "tracking_store", "track"))}
    for cell in cells:
        dataset, mechanism, cell_id = cell["dataset"], cell["mechanism"], cell["cell_id"]
        old |= {f"{results}/plans/{cell_id}.json", f"logs/tiny/plans/{cell_id}.log",
                f"logs/tiny/runs/dataset={dataset}/mechanism={mechanism}/{cell_id}.log"}
    # Changed since: the run files, once one tree runs/dataset=/mechanism=/cell=/ mixing three kinds,
    # are three trees, one per kind, each one dataset for pyarrow, DuckDB and polars; then a
    # store of runs by id and phase (runs/<kind>/dataset=/mechanism=/phase=/run_id=/), which a cell's job
    # fills with the runs it lacks, its marker cells/dataset=/mechanism=/<cell_id>.json written last
    # (so that an edit of the campaign trains only the runs it adds).
    added = {f"{results}/cells/dataset={cell['dataset']}/mechanism={cell['mechanism']}/{cell['cell_id']}.json"
             for cell in cells}
    # Added since, beside the old paths: the comparison of mechanisms.
    added |= {*(f"{results}/tables/{table}.parquet" for table in ("comparisons", "rankings", "verdicts")),
              "logs/tiny/compare.log"}
    # Changed since: the report's figures, once two declared files in report/, are one declared
    # directory report/figures/ holding every figure as PNG and SVG.
    added |= {f"{results}/report/figures"}
    # ... and the privacy audit, computed by the final cells' jobs into audit/.
    added |= {f"{results}/tables/audit.parquet", "logs/tiny/audit_table.log"}
    # ... and the campaign file attached to the MLflow campaign run.
    added |= {f"{results}/campaign.yaml", "logs/tiny/campaign_file.log"}
    # ... and the report attached to it by a step of its own, after `track` and the report.
    added |= {f"{results}/tracking/report.json", "logs/tiny/track_report.log"}
    declared = {path for rule, rule_jobs in jobs.items() if rule != "all"
                for job in rule_jobs for key in ("output", "log") for path in job[key].split(", ")}
    assert declared == old | added
    assert f"--checkpoint-dir {results}/checkpoints " in jobs["run_cell"][0]["shell"]
    assert f"--artifact-dir {results}/mlflow-artifacts " in jobs["track"][0]["shell"]


def test_track_waits_for_every_table_it_logs_or_attaches_and_the_report_for_no_one_but_track_report(tmp_path):
    """`track` no longer waits for the report (they run side by side), so it must wait for each table
    itself: with tuning, the audit and paper claims, every table a job writes is an input of `track`."""
    from workflow_cli import tiny_config

    config = tiny_config(tmp_path)
    claims = tmp_path / "claims.yaml"
    claims.write_text(yaml.safe_dump({"paper": "P", "claims": [
        {"id": "c", "source": "T", "dataset": "syn-S-0.01-0.9", "model": "lr", "epsilon": 1, "relation": "order",
         "mechanisms": ["PM", "PS-PM"]}]}))
    config.update(audit={}, scorecard={"claims": [str(claims)]}, tuning={"space": {"learning_rate": [0.1, 0.3]}})
    jobs = dry_run_jobs(tmp_path, config)
    tables = {path for rule_jobs in jobs.values() for job in rule_jobs for path in job.get("output", "").split(", ")
              if "/tables/" in path}
    assert {Path(path).stem for path in tables} == set(layout.TABLES)
    [track] = jobs["track"]
    assert tables <= set(track["input"].split(", "))
    [report] = jobs["report"]
    assert report["output"].split(", ")[0] not in track["input"].split(", ")
    [attach] = jobs["track_report"]
    assert set(attach["input"].split(", ")) == {report["output"].split(", ")[0], track["output"]}


def test_paths_inside_a_campaign_keep_their_names(tmp_path):
    run = layout.run_dir(tmp_path / "runs", "summaries", "adult", "pm", "final", "ab12")
    assert run == tmp_path / "runs" / "summaries" / "dataset=adult" / "mechanism=pm" / "phase=final" / "run_id=ab12"
    curve = layout.run_file(tmp_path / "runs", "curves", "adult", "pm", "trial", "ab12")
    assert curve == tmp_path / "runs" / "curves" / "dataset=adult" / "mechanism=pm" / "phase=trial" / "run_id=ab12" \
        / "curve.parquet"
    with pytest.raises(ValueError, match="unknown kind of run file 'curve'; the kinds are curves, ledgers, summaries"):
        layout.run_dir(tmp_path, "curve", "adult", "pm", "final", "ab12")
    with pytest.raises(ValueError, match="unknown phase 'tuning'; the phases are trial, final"):
        layout.run_dir(tmp_path, "curves", "adult", "pm", "tuning", "ab12")
    attempt = layout.attempt_dir(tmp_path / "runs", "0123456789abcdef", 42, "beef")
    assert attempt == tmp_path / "runs" / ".attempts" / "cell=0123456789abcdef.attempt-42-beef"
    assert attempt.name.startswith(layout.attempt_prefix("0123456789abcdef"))
    assert layout.campaign_attempts(tmp_path / "runs") == []
    attempt.mkdir(parents=True)
    assert layout.campaign_attempts(tmp_path / "runs") == [("0123456789abcdef", 42, attempt)]
    assert layout.checkpoint_file(tmp_path, "ab12") == tmp_path / "ab12.pt"
    run.mkdir(parents=True)
    (run / "summary.parquet").touch()
    assert layout.stored_summaries(tmp_path / "runs") == [run / "summary.parquet"]
    campaign = CampaignLayout(tmp_path / "results", "c")
    assert CampaignLayout.at(campaign.root) == CampaignLayout(tmp_path / "results", "c")
    assert campaign.cell_marker("adult", "pm", "0123") == campaign.root / "cells" / "dataset=adult" / "mechanism=pm" \
        / "0123.json"
    assert layout.quarantine_dir(tmp_path / "runs") == tmp_path / "quarantine"
    assert layout.features_meta("features", "agnews", "minilm") == Path("features/agnews/minilm/meta.json")
    benchmark = Path("logs/features/agnews/minilm.benchmark.tsv")
    assert layout.features_log("agnews", "minilm", ".benchmark.tsv") == benchmark
    with pytest.raises(ValueError, match="unknown campaign table 'run'; the tables are runs, curves, summary"):
        layout.table_file(tmp_path, "run")


# Pieces of the results tree that only ldpbench/layout.py may spell. A mention in a docstring or
# comment, or a placeholder such as run_id=<id>/ in a help text, documents the layout and is allowed.
LAYOUT_PIECES = re.compile(
    r"\b(?:run_id|cell|dataset|mechanism)=(?!<)"
    r"|(?:^[rbfRBF]*[\"']+|\})/?(?:runs|plans|tables|report|tracking|checkpoints|quarantine|logs)/"
    r"|^[rbfRBF]*[\"'](?:plans|checkpoints|quarantine)[\"']$"
    r"|\b(?:summary|curve|ledger|runs|curves)\.parquet\b|manifest\.json|mlflow\.json|store\.json|index\.html"
    r"|mlflow-artifacts|\.attempt-|(?<!>)\.pt\b|\.png\b")


def string_literals(path: Path) -> list[tuple[int, str]]:
    """(line, text) of each string literal of a Python or Snakemake file, docstrings left out."""
    tokens = [token for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
              if token.type not in (tokenize.COMMENT, tokenize.NL)]
    statement_start = {tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
    literals = []
    for before, token, after in zip([None, *tokens], tokens, [*tokens[1:], None]):
        if token.type != tokenize.STRING:
            continue
        is_docstring = (before is None or before.type in statement_start) and after.type == tokenize.NEWLINE
        if not is_docstring:
            literals.append((token.start[0], token.string))
    return literals


def source_files() -> list[Path]:
    files = [REPO / "Snakefile", *sorted((REPO / "workflow" / "rules").glob("*.smk")),
             *sorted((REPO / "ldpbench").rglob("*.py"))]
    return [path for path in files if path != REPO / "ldpbench" / "layout.py"]


def test_no_other_file_spells_the_layout():
    stray = [f"{path.relative_to(REPO)}:{line}: {text}" for path in source_files()
             for line, text in string_literals(path) if LAYOUT_PIECES.search(text)]
    assert not stray, "layout paths outside ldpbench/layout.py:\n" + "\n".join(stray)


def test_the_stray_layout_check_can_fail(tmp_path):
    source = tmp_path / "rules.smk"
    source.write_text('"""Writes run_id=<id>/ per run and tables/runs.parquet."""\n'
                      'rule x:\n    output:\n        f"{CAMPAIGN_DIR}/tables/summary.parquet",\n'
                      'def run_path(run_id):\n    return f"run_id={run_id}"\n')
    found = [line for line, text in string_literals(source) if LAYOUT_PIECES.search(text)]
    assert found == [4, 6]


def test_a_campaign_without_audit_or_claims_has_neither_job(tmp_path):
    from workflow_cli import tiny_config

    config = tiny_config(tmp_path)
    config["audit"] = {"enabled": False}
    jobs = dry_run_jobs(tmp_path, config)
    assert not {"audit_table", "scorecard"} & set(jobs)
    [report] = jobs["report"]
    assert "--audit" not in report["shell"] and "--scorecard" not in report["shell"]
    # With claims (and the audit on), the report reads both tables.
    claims = tmp_path / "claims.yaml"
    claims.write_text(yaml.safe_dump({"paper": "P", "claims": [
        {"id": "c", "source": "T", "dataset": "syn-S-0.01-0.9", "model": "lr", "epsilon": 1, "relation": "order",
         "mechanisms": ["PM", "PS-PM"]}]}))
    config.update(audit={}, scorecard={"claims": [str(claims)]})
    jobs = dry_run_jobs(tmp_path, config)
    [report] = jobs["report"]
    assert len(jobs["scorecard"]) == 1 and "--audit " in report["shell"] and "--scorecard " in report["shell"]
