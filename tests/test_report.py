"""Report tables derived from the summary."""

import math

import pandas as pd
import pytest

from ldpbench.results.report import fedsel_gain_loss


def summary_row(mechanism, params, mean, epsilon=2.0, dataset="bank", model="lr"):
    return {"dataset": dataset, "model": model, "mechanism": mechanism, "mechanism_params": params,
            "epsilon": epsilon, "mean": mean, "label": mechanism}


def test_fedsel_gain_loss_from_results():
    summary = pd.DataFrame([
        summary_row("pm", "{}", 0.80),
        summary_row("ps-pm", '{"control": false, "mu": 0.1}', 0.84),
        summary_row("ps-pm", '{"control": true}', 0.85),
        summary_row("exp-pm", "{}", 0.83),  # no control variant: no EXP row
        summary_row("pm", "{}", 0.70, epsilon=4.0),  # other ε are ignored
        summary_row("pm", "{}", 0.9, dataset="syn-S-0.1-0.9"),  # no pairs there
    ])
    table = fedsel_gain_loss(summary)
    assert list(table["selector"]) == ["PS"]
    row = table.iloc[0]
    assert row["gain (ours)"] == pytest.approx(5.0) and row["loss (ours)"] == pytest.approx(1.0)
    assert (row["gain (paper)"], row["loss (paper)"]) == (2.5525, 0.1463)


def test_gain_loss_is_empty_without_the_mechanisms():
    assert fedsel_gain_loss(pd.DataFrame([summary_row("pm", "{}", 0.8)])).empty
    table = fedsel_gain_loss(pd.DataFrame([
        summary_row("pm", "{}", 0.8, dataset="syn-S-0.1-0.9"),
        summary_row("pe-pm", "{}", 0.8, dataset="syn-S-0.1-0.9"),
        summary_row("pe-pm", '{"control": true}', 0.81, dataset="syn-S-0.1-0.9")]))
    assert math.isnan(table.iloc[0]["gain (paper)"])  # the paper has no such row
