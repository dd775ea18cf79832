"""The report's sections that check claims: the privacy audit and the reproduction scorecard.

"Claimed / worst-case / audited ε" (tables/audit.parquet and the runs): each private configuration
(label, ε) with the ε of one report as its runs accounted it beside the audit's empirical lower
bound. "Reproduction scorecard" (tables/scorecard.parquet): each paper claim the campaign covers,
the paper's number beside ours with its interval, the gap and the status.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable

import numpy as np
import pandas as pd

from ldpbench.audit import CLAIM_EXCEEDED, CONSISTENT, DEFECT
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


def audit_section(summary: pd.DataFrame, audit: pd.DataFrame | None, table: Callable[[pd.DataFrame], str]) -> str:
    if audit is None:
        return ""
    frame = audit_frame(summary, audit)
    if frame.empty:
        return """<h2>Claimed / worst-case / audited ε</h2>
<p>Nothing to audit: every mechanism this campaign ran is non-private (ε = ∞), so no report's ε
was claimed and the privacy audit had no mechanism to check.</p>"""
    defects = frame[frame["verdict"] == DEFECT]
    alarm = ("" if defects.empty else
             "<p><b>Defect</b>: the audited ε of one report is above its reported worst case for "
             + html.escape(", ".join(f"{row['mechanism']} at ε = {row['ε']:g}" for _, row in defects.iterrows()))
             + ": the mechanism, or its accounting, is wrong.</p>")
    settings = audit.iloc[0] if len(audit) else None
    how = ("" if settings is None else
           f" Each mechanism was rebuilt on {int(settings['dims'])}-dimensional inputs and drew "
           f"{int(settings['samples']):,} reports per input of each pair; each bound holds at level "
           f"{settings['alpha']:g} (it exceeds the true ε with probability at most that).")
    return f"""<h2>Claimed / worst-case / audited ε</h2>
<p>The ε of one report three ways: <i>claimed</i> as the mechanism's paper accounts it,
<i>worst case</i> as pure ε-LDP over every input of the declared domain, and <i>audited</i>: an
empirical lower bound from a black-box audit of the mechanism that ran (ldpbench.audit: inputs the
mechanism declares worth testing and random ones; a distinguishing event chosen on half of the
reports, measured on the other half, Clopper–Pearson bounds).{how} <i>{CONSISTENT}</i>: the bound is
within the claim; <i>{CLAIM_EXCEEDED}</i>: above the claim but within the worst case (information:
the claim is an accounting that is not pure ε-LDP of one report); <i>{DEFECT}</i>: impossible for a
correct mechanism.</p>
{alarm}
{table(frame)}"""


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


def scorecard_section(scorecard: pd.DataFrame | None, table: Callable[[pd.DataFrame], str]) -> str:
    if scorecard is None:
        return ""
    counted = tally(scorecard["status"])
    files = ", ".join(f"<code>{html.escape(name)}</code>" for name in sorted(scorecard["claims_file"].unique()))
    substitutions = sorted(set(scorecard["substitution"]) - {""})
    substituted = ("" if not substitutions else
                   "<p>Our substitutions: " + html.escape("; ".join(substitutions)) + ".</p>")
    return f"""<h2>Reproduction scorecard</h2>
<p>The papers' numbers and claims ({files} under <code>config/paper_claims/</code>) read against this
campaign: {counted}. {html.escape(RULES_TEXT)} Accuracy in %, differences in points.</p>
{substituted}
{table(scorecard_frame(scorecard))}"""
