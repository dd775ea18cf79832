"""docs/findings.md is generated from the campaigns' scorecards (ldpbench.results.findings)."""

from pathlib import Path

import pandas as pd
import yaml

from ldpbench.results.findings import MARK, findings_page
from ldpbench.scorecard import load_claims, scorecard

REPO = Path(__file__).resolve().parents[2]


def test_the_page_has_each_covered_claim_and_names_files_no_campaign_ran(tmp_path):
    covered, uncovered = tmp_path / "covered.yaml", tmp_path / "uncovered.yaml"
    for path, label in ((covered, "PM"), (uncovered, "HM")):
        path.write_text(yaml.safe_dump({"paper": f"Paper of {label} (2020)", "claims": [
            {"id": "c", "source": "Table 9", "dataset": "adult", "model": "lr", "epsilon": 2, "relation": "value",
             "mechanisms": [label], "value": 80.0, "tolerance": 1.0, "substitution": "a stand-in"}]}))
    campaign = tmp_path / "results" / "demo"
    (campaign / "tables").mkdir(parents=True)
    summary = pd.DataFrame([{"dataset": "adult", "model": "lr", "label": "PM", "epsilon": 2.0, "mean": 0.805,
                             "ci95_low": 0.80, "ci95_high": 0.81, "runs_ok": 3}])
    scorecard(load_claims([covered]), summary, None).to_parquet(campaign / "tables" / "scorecard.parquet")
    pd.DataFrame({"finished_at": ["2026-11-25T10:00:00+00:00"] * 3, "ldpbench_version": ["0.1.0"] * 3}).to_parquet(
        campaign / "tables" / "runs.parquet")

    page = findings_page([campaign], [covered, uncovered], "ldpbench findings ...")
    assert page.startswith(MARK)
    assert "`demo` (3 runs, the last finished 2026-11-25 10:00 UTC, ldpbench 0.1.0)" in page
    assert "## Paper of PM (2020): `covered.yaml`" in page and "1 reproduced, 0 not reproduced, 0 not run" in page
    assert "| Table 9 | adult · lr | 2 | PM (%) | 80 | 80.50 [80.00, 81.00] |" in page
    assert "Our substitutions: a stand-in." in page
    assert "## Paper of HM (2020): `uncovered.yaml`\n\nNot run here yet: 1 claims (Table 9)" in page


def test_the_findings_page_in_docs_is_the_generated_one():
    assert (REPO / "docs" / "findings.md").read_text().startswith(MARK)
