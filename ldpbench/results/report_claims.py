"""The report's sections that check claims: the privacy audit and the reproduction scorecard.

"Claimed / worst-case / audited ε" (tables/audit.parquet and the runs): each private configuration
(label, ε) with the ε of one report as its runs accounted it beside the audit's empirical lower
bound. "Reproduction scorecard" (tables/scorecard.parquet): each paper claim the campaign covers,
the paper's number beside ours with its interval, the gap and the status. Their words and markup are
their templates' (templates/audit.html.j2 and scorecard.html.j2; ldpbench.results.report_html).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ldpbench.audit import CLAIM_EXCEEDED, CONSISTENT, DEFECT
from ldpbench.results.report_html import render, table
from ldpbench.results.schema import headed, heading
from ldpbench.scorecard import RULES_TEXT, tally

# How the runs' summary names what the audit table calls mechanism, params and epsilon.
JOIN = {"mechanism": "mechanism", "mechanism_params": "params", "epsilon_per_report": "epsilon"}


def audit_frame(summary: pd.DataFrame, audit: pd.DataFrame) -> pd.DataFrame:
    """One row per private (label, ε): the three ε of one report, the verdict and where it came from."""
    private = summary[np.isfinite(summary["epsilon"])]
    configurations = private.drop_duplicates(["label", "mechanism_params", "epsilon", "epsilon_per_report"])
    audited = audit.rename(columns={value: f"audit_{value}" for value in JOIN.values()})
    merged = configurations.merge(
        audited, how="left", left_on=list(JOIN), right_on=[f"audit_{value}" for value in JOIN.values()])
    merged = merged.sort_values(["label", "epsilon", "epsilon_per_report"])
    return pd.DataFrame({
        "mechanism": merged["label"],
        **headed("summary", merged, ["epsilon", "epsilon_per_report"]),
        # The summary's ε of one report under the audit's headings, beside the audit's bound.
        heading("audit", "claimed"): merged["epsilon_claimed_per_report"],
        heading("audit", "worst_case"): merged["epsilon_worst_case_per_report"],
        **headed("audit", merged, ["audited_lower_bound"]),
        "verdict": merged["verdict"].fillna("not audited"),
        "pair and event": [f"{pair}: {event}" if isinstance(pair, str) else "–"
                           for pair, event in zip(merged["pair"], merged["event"])],
        **headed("audit", merged, ["samples"]),
    }).reset_index(drop=True)


def audit_section(summary: pd.DataFrame, audit: pd.DataFrame | None) -> str:
    """The three ε of each private configuration's report side by side, any defect named above them; a campaign
    that ran only non-private mechanisms is told it had nothing to audit."""
    if audit is None:
        return ""
    frame = audit_frame(summary, audit)
    defects = [f"{row['mechanism']} at ε = {row['ε']:g}" for _, row in frame[frame["verdict"] == DEFECT].iterrows()]
    first = audit.iloc[0] if len(audit) else None
    settings = None if first is None else {
        "dims": int(first["dims"]), "samples": int(first["samples"]), "alpha": float(first["alpha"])}
    return render("audit.html.j2", configurations=table(frame), defects=defects, settings=settings,
                  consistent=CONSISTENT, claim_exceeded=CLAIM_EXCEEDED, defect=DEFECT)


def scorecard_frame(scorecard: pd.DataFrame) -> pd.DataFrame:
    """The scorecard as the report shows it: the claim, the paper's number, ours, the gap, the status."""
    def ours(row) -> str:
        if pd.isna(row["ours"]):
            return "–"
        interval = (f" [{row['ours_low']:.2f}, {row['ours_high']:.2f}]"
                    if pd.notna(row["ours_low"]) and pd.notna(row["ours_high"]) else "")
        p_value = f" (p {row['p_value_adjusted']:.2g})" if pd.notna(row["p_value_adjusted"]) else ""
        if row["relation"] == "value":
            return f"{row['ours']:.2f}{interval}"
        if row["relation"] == "increases":
            return f"{row['ours']:+.2f}{interval} per ε step"
        return f"{row['ours']:+.2f}{interval}{p_value}"

    def seeds(row) -> str:
        needed = row.get("replicates_needed", math.nan)
        return f"{int(row['replicates'])}" + (f" (need {int(needed)})" if pd.notna(needed) else "")

    return pd.DataFrame({
        "paper, source": scorecard["paper"].str.split(" \\(").str[0] + ", " + scorecard["source"],
        "dataset · model": scorecard["dataset"] + " · " + scorecard["model"],
        "ε": scorecard["epsilon"],
        "claim": [claim_text(row) for _, row in scorecard.iterrows()],
        "paper": scorecard["paper_value"],
        "ours": [ours(row) for _, row in scorecard.iterrows()],
        "gap": [("–" if pd.isna(gap) else f"{gap:+.2f}") for gap in scorecard["gap"]],
        "seeds": [seeds(row) for _, row in scorecard.iterrows()],
        "status": scorecard["status"],
        "why": scorecard["why"],
    })


def claim_text(row) -> str:
    first, _, second = row["mechanisms"].partition(" vs ")
    return {"value": f"{first} (%)", "difference": f"{first} − {second} (points)", "order": f"{first} > {second}",
            "at_least": f"{first} − {second} ≥ {row['paper_value']:g}",
            "increases": f"{first} grows with ε"}[row["relation"]]


def scorecard_section(scorecard: pd.DataFrame | None) -> str:
    if scorecard is None:
        return ""
    return render("scorecard.html.j2", claims_files=sorted(scorecard["claims_file"].unique()),
                  tally=tally(scorecard["status"]), rules=RULES_TEXT,
                  substitutions=sorted(set(scorecard["substitution"]) - {""}), claims=table(scorecard_frame(scorecard)))
