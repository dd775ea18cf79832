"""docs/findings.md is generated from the scorecards committed under docs/scorecards/ (ldpbench.results.findings)."""

from pathlib import Path

import pandas as pd
import pytest
import yaml

from ldpbench.cli import main
from ldpbench.results.findings import MARK, findings_page, read_scorecards, render_analysis
from ldpbench.scorecard import NOT_RUN, load_claims, scorecard

REPO = Path(__file__).resolve().parents[2]


def claims_file(path: Path, label: str) -> Path:
    path.write_text(yaml.safe_dump({"paper": f"Paper of {label} (2020)", "claims": [
        {"id": "c", "source": "Table 9", "dataset": "adult", "model": "lr", "epsilon": 2, "relation": "value",
         "mechanisms": [label], "value": 80.0, "tolerance": 1.0, "substitution": "a stand-in"}]}))
    return path


def test_a_campaigns_scorecard_becomes_a_csv_and_the_page_lists_every_claim(tmp_path):
    covered, uncovered = claims_file(tmp_path / "covered.yaml", "PM"), claims_file(tmp_path / "uncovered.yaml", "HM")
    campaign = tmp_path / "results" / "demo"
    (campaign / "tables").mkdir(parents=True)
    runs = pd.DataFrame({"campaign": "demo", "dataset": "adult", "model": "lr", "label": "PM", "epsilon": 2.0,
                         "seed": [0, 1, 2], "fold": 0, "status": "ok", "test_accuracy": [0.799, 0.8, 0.801],
                         "test_auc": 0.85, "finished_at": "2026-11-25T10:00:00+00:00", "ldpbench_version": "0.1.0"})
    summary = pd.DataFrame([{"dataset": "adult", "model": "lr", "label": "PM", "epsilon": 2.0, "trivial": False}])
    runs.to_parquet(campaign / "tables" / "runs.parquet")
    scorecard(load_claims([covered]), runs, summary, None).to_parquet(campaign / "tables" / "scorecard.parquet")

    out, scorecards = tmp_path / "findings.md", tmp_path / "scorecards"
    template = tmp_path / "analysis.template.md"
    template.write_text("PM reads {{demo | c | 2 | ours}} {{demo | c | 2 | interval}}: {{demo | c | 2 | status}}.\n")
    assert main(["findings", "--campaign", str(campaign), "--scorecards", str(scorecards),
                 "--claims", str(covered), str(uncovered), "--out", str(out), "--analysis-template", str(template),
                 "--analysis", str(tmp_path / "analysis.md")]) == 0
    assert (tmp_path / "analysis.md").read_text().endswith("PM reads 80.00 [79.75, 80.25]: reproduced.\n")
    assert (scorecards / "demo.csv").exists()
    page = out.read_text()
    assert page == findings_page(scorecards, [covered, uncovered])  # from the CSVs alone
    assert page.startswith(MARK)
    assert "- `demo`: 3 runs over 3 seed(s), the last finished 2026-11-25 10:00 UTC, ldpbench 0.1.0" in page
    assert "| `covered.yaml` | Paper of PM (2020) | 1 | 1 | 1 | 0 | 0 | 0 |" in page
    assert "| `uncovered.yaml` | Paper of HM (2020) | 1 | 1 | 0 | 0 | 0 | 1 |" in page
    assert "| Table 9 | demo | adult · lr | 2 | PM (%) | 80 | 80.00 [79.75, 80.25] | +0.00 | 3 | reproduced |" in page
    assert "| Table 9 | – | adult · lr | 2 | HM (%) | 80 | – | – | 0 | not run | no campaign" in page
    assert "Our substitutions: a stand-in." in page


def test_the_findings_and_analysis_pages_in_docs_are_regenerated_byte_for_byte(monkeypatch):
    monkeypatch.chdir(REPO)
    assert (REPO / "docs" / "findings.md").read_text(encoding="utf-8") == findings_page()
    template = (REPO / "docs" / "templates" / "analysis.md").read_text(encoding="utf-8")
    assert (REPO / "docs" / "analysis.md").read_text(encoding="utf-8") == render_analysis(template, read_scorecards())


def test_a_placeholder_naming_no_scorecard_row_is_an_error_naming_it():
    table = pd.DataFrame({"campaign": ["demo"], "claim": ["c"], "epsilon": [2.0], "claims_file": ["x.yaml"]})
    with pytest.raises(ValueError, match=r"placeholder \{\{demo \| missing \| 2 \| ours\}\}: no claim 'missing'"):
        render_analysis("{{demo | missing | 2 | ours}}", table)


@pytest.mark.parametrize("claims_path", sorted((REPO / "config" / "paper_claims").glob("*.yaml")),
                         ids=lambda path: path.name)
def test_every_claim_of_every_claims_file_is_judged_by_a_committed_scorecard(claims_path):
    table = read_scorecards(REPO / "docs" / "scorecards")
    judged = table[(table["claims_file"] == claims_path.name) & (table["status"] != NOT_RUN)]
    missing = [(claim.claim, claim.epsilon) for claim in load_claims([claims_path])
               if judged[(judged["claim"] == claim.claim) & (judged["epsilon"] == claim.epsilon)].empty]
    assert not missing, f"{claims_path.name}: not run by any campaign of docs/scorecards/: {missing}"
