"""The check that a campaign's files follow the column map (ldpbench/results/schema.py), shared by the
unit tests of the tables and the end-to-end campaign test."""

from __future__ import annotations

from pathlib import Path

from ldpbench.layout import CURVES, LEDGERS, RUN_FILES, SUMMARIES
from ldpbench.results.schema import RUN_CURVE, RUN_LEDGER, RUN_SUMMARY, file_problems, tables_problems

RUN_FILE_TABLES = {RUN_FILES[kind]: declared for kind, declared in
                   ((SUMMARIES, RUN_SUMMARY), (CURVES, RUN_CURVE), (LEDGERS, RUN_LEDGER))}


def assert_tables_follow_column_map(campaign_dir: str | Path) -> list[str]:
    """Every campaign table in <campaign_dir>/tables and every run file under <campaign_dir>/runs has the
    map's columns, in its order, with its types and no null where it allows none. Returns the names of
    the campaign tables checked, so a caller can say which it expected."""
    campaign_dir = Path(campaign_dir)
    problems = tables_problems(campaign_dir / "tables")
    for name, declared in RUN_FILE_TABLES.items():
        for path in sorted((campaign_dir / "runs").rglob(name)):
            problems += file_problems(path, declared)
    assert not problems, "the campaign's files depart from the column map:\n" + "\n".join(problems)
    return sorted(path.stem for path in (campaign_dir / "tables").glob("*.parquet"))
