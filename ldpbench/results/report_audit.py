"""The report's "claimed / worst-case / audited ε" section, from tables/audit.parquet and the runs.

Each private configuration of the campaign (label, ε) with the ε of one report as its runs
accounted it (claimed, worst case) beside the audit's empirical lower bound on that report's ε.
"""

from __future__ import annotations

import html
from collections.abc import Callable

import pandas as pd

from ldpbench.audit import CLAIM_EXCEEDED, CONSISTENT, DEFECT

# How the runs' summary names what the audit table calls mechanism, params and epsilon.
JOIN = {"mechanism": "mechanism", "mechanism_params": "params", "epsilon_per_report": "epsilon"}


def audit_frame(summary: pd.DataFrame, audit: pd.DataFrame) -> pd.DataFrame:
    """One row per private (label, ε): the three ε of one report, the verdict and where it came from."""
    private = summary[summary["epsilon"].notna() & (summary["epsilon"] != float("inf"))]
    configurations = private.drop_duplicates(["label", "mechanism_params", "epsilon", "epsilon_per_report"])
    audited = audit.rename(columns={value: f"audit_{value}" for value in JOIN.values()})
    merged = configurations.merge(
        audited, how="left", left_on=list(JOIN), right_on=[f"audit_{value}" for value in JOIN.values()])
    merged = merged.sort_values(["label", "epsilon", "epsilon_per_report"])
    return pd.DataFrame({
        "mechanism": merged["label"],
        "ε": merged["epsilon"],
        "ε / report": merged["epsilon_per_report"],
        "claimed ε": merged["epsilon_claimed_per_report"],
        "worst-case ε": merged["epsilon_worst_case_per_report"],
        "audited ε ≥": merged["audited_lower_bound"],
        "verdict": merged["verdict"].fillna("not audited"),
        "pair and event": [f"{pair}: {event}" if isinstance(pair, str) else "–"
                           for pair, event in zip(merged["pair"], merged["event"])],
        "reports per input": merged["samples"],
    }).reset_index(drop=True)


def audit_section(summary: pd.DataFrame, audit: pd.DataFrame | None, table: Callable[[pd.DataFrame], str]) -> str:
    if audit is None:
        return ""
    frame = audit_frame(summary, audit)
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
