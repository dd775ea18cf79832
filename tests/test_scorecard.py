"""The reproduction scorecard (ldpbench.scorecard): claims as data, read against a campaign's tables."""

import math
import re
from pathlib import Path

import pandas as pd
import pytest
import yaml

from ldpbench.errors import ConfigError
from ldpbench.scorecard import NOT_REPRODUCED, NOT_RUN, REPRODUCED, load_claims, scorecard

REPO_CLAIMS = sorted((Path(__file__).resolve().parents[1] / "config" / "paper_claims").glob("*.yaml"))


def summary_row(label, epsilon, mean, low=None, high=None, runs_ok=3, dataset="adult", model="lr"):
    return {"dataset": dataset, "model": model, "label": label, "epsilon": epsilon, "mean": mean,
            "ci95_low": mean if low is None else low, "ci95_high": mean if high is None else high,
            "auc_mean": math.nan, "auc_ci95_low": math.nan, "auc_ci95_high": math.nan, "runs_ok": runs_ok}


def comparison(a, b, diff, low, high, p, epsilon=2.0):
    return {"dataset": "adult", "model": "lr", "epsilon": epsilon, "metric": "test_accuracy", "mechanism_a": a,
            "mechanism_b": b, "n_pairs": 15, "mean_diff": diff, "ci95_low": low, "ci95_high": high,
            "p_value_adjusted": p, "test": "paired t-test"}


def claims_file(tmp_path, claims, name="claims.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"paper": "A paper (2020)", "claims": claims}))
    return path


def claim(id, relation, mechanisms, epsilon=2, **extra):
    return {"id": id, "source": "Table 1", "dataset": "adult", "model": "lr", "epsilon": epsilon,
            "relation": relation, "mechanisms": mechanisms, **extra}


SUMMARY = pd.DataFrame([
    summary_row("A", 2.0, 0.80, 0.78, 0.82), summary_row("B", 2.0, 0.75, 0.74, 0.76),
    summary_row("A", 1.0, 0.70), summary_row("A", 4.0, 0.79),
])
COMPARISONS = pd.DataFrame([comparison("B", "A", -0.05, -0.07, -0.03, 0.001)])  # stored as B − A


@pytest.mark.parametrize("entry,status", [
    # value: the paper's 81 lies in [78, 82]; 84 lies outside even with a tolerance of 1, inside with 2.
    (claim("v1", "value", ["A"], value=81), REPRODUCED),
    (claim("v2", "value", ["A"], value=84, tolerance=1), NOT_REPRODUCED),
    (claim("v3", "value", ["A"], value=84, tolerance=2), REPRODUCED),
    # difference A − B read from the paired row stored as B − A: +5 [3, 7].
    (claim("d1", "difference", ["A", "B"], value=6), REPRODUCED),
    (claim("d2", "difference", ["A", "B"], value=9, tolerance=1), NOT_REPRODUCED),
    (claim("o1", "order", ["A", "B"]), REPRODUCED),
    (claim("o2", "order", ["B", "A"]), NOT_REPRODUCED),  # the opposite order, significant
    (claim("l1", "at_least", ["A", "B"], value=4), REPRODUCED),
    (claim("l2", "at_least", ["A", "B"], value=6), NOT_REPRODUCED),
    # growth over ε 1, 2, 4: 70, 80, 79: one fall of one point.
    (claim("g1", "increases", ["A"], epsilon=[1, 2, 4], tolerance=1), REPRODUCED),
    (claim("g2", "increases", ["A"], epsilon=[1, 2, 4], tolerance=0.5), NOT_REPRODUCED),
    (claim("n1", "order", ["A", "C"]), NOT_RUN),
    (claim("n2", "value", ["A"], epsilon=8, value=80), NOT_RUN),
])
def test_each_relation_is_read_against_the_tables(tmp_path, entry, status):
    [row] = scorecard(load_claims([claims_file(tmp_path, [entry])]), SUMMARY, COMPARISONS).to_dict("records")
    assert row["status"] == status, row


def test_a_difference_is_paired_where_the_comparisons_have_it_and_in_points(tmp_path):
    claims = load_claims([claims_file(tmp_path, [claim("d", "difference", ["A", "B"], value=5),
                                                 claim("o", "order", ["A", "B"])])])
    row = scorecard(claims, SUMMARY, COMPARISONS).to_dict("records")[0]
    assert (row["ours"], row["ours_low"], row["ours_high"]) == pytest.approx((5.0, 3.0, 7.0))
    assert row["gap"] == pytest.approx(0.0) and row["p_value_adjusted"] == 0.001
    assert row["basis"].startswith("paired over 15 replicates")
    # Without the comparisons: the difference of the means, with no interval, and no test for an order.
    unpaired = scorecard(claims, SUMMARY, None)
    assert unpaired.loc[0, "ours"] == pytest.approx(5.0) and math.isnan(unpaired.loc[0, "ours_low"])
    assert unpaired.loc[1, "status"] == NOT_REPRODUCED and "no paired test" in unpaired.loc[1, "why"]


def test_a_list_of_epsilons_gives_one_row_each(tmp_path):
    claims = load_claims([claims_file(tmp_path, [claim("o", "order", ["A", "B"], epsilon=[1, 2, 4])])])
    assert [c.epsilon for c in claims] == [1.0, 2.0, 4.0]
    table = scorecard(claims, SUMMARY, COMPARISONS)
    assert list(table["status"]) == [NOT_RUN, REPRODUCED, NOT_RUN]  # B ran at ε = 2 only


@pytest.mark.parametrize("entry,message", [
    (claim("x", "value", ["A", "B"], value=1), r"claims\[0\].*'value' claim names 1 mechanism"),
    (claim("x", "order", ["A", "B"], value=1), r"claims\[0\].*'order' claim has no 'value'"),
    (claim("x", "difference", ["A", "B"]), r"claims\[0\].*'difference' claim needs a 'value'"),
    (claim("x", "increases", ["A"], epsilon=2), r"needs a list of at least two ε"),
    (claim("x", "ordering", ["A", "B"]), r"key 'claims\[0\]\.relation'"),
    ({"id": "x", "source": "T"}, r"key 'claims\[0\]'.*'dataset' is a required property"),
])
def test_a_bad_claim_is_named_by_file_and_key(tmp_path, entry, message):
    path = claims_file(tmp_path, [entry])
    with pytest.raises(ConfigError, match=message) as error:
        load_claims([path])
    assert str(path) in str(error.value)


def test_a_claim_id_used_twice_and_a_missing_file_are_named(tmp_path):
    with pytest.raises(ConfigError, match="the id 'x' is used twice"):
        load_claims([claims_file(tmp_path, [claim("x", "order", ["A", "B"]), claim("x", "order", ["B", "A"])])])
    with pytest.raises(ConfigError, match="'.*missing.yaml': cannot read it"):
        load_claims([tmp_path / "missing.yaml"])


def test_the_shipped_claims_files_are_valid_and_cover_the_issue():
    claims = load_claims(REPO_CLAIMS)
    sources = {(c.claims_file, c.source) for c in claims}
    assert {("fedsel-table3.yaml", "Table 3"), ("fedsel-figure2.yaml", "Figure 2(f, g)"),
            ("bitrand-table2.yaml", "Table 2"), ("sqsgd-figures.yaml", "Figure 1"), ("sqsgd-figures.yaml", "Figure 3"),
            ("diffsketch-figures.yaml", "Figure 2"), ("diffsketch-figures.yaml", "Figure 3"),
            ("diffsketch-figures.yaml", "Figure 5")} <= sources
    assert sum(c.source == "Table 3" for c in claims) == 48  # 8 (data set, model) × 3 selectors × gain, loss


def test_a_campaign_naming_a_bad_claims_file_fails_validation_naming_the_key(tmp_path):
    from ldpbench.campaign import load_config

    bad = claims_file(tmp_path, [claim("x", "order", ["A"])], "bad.yaml")
    config = tmp_path / "campaign.yaml"
    config.write_text(yaml.safe_dump({
        "campaign": "c", "datasets": [{"name": "syn-S-0.1-0.9"}], "models": ["lr"],
        "mechanisms": [{"name": "pm"}], "epsilons": [1], "seeds": [0], "scorecard": {"claims": [str(bad)]}}))
    with pytest.raises(ConfigError, match=r"config key 'scorecard.claims\[0\]'.*bad.yaml"):
        load_config(config)


@pytest.mark.parametrize("entry,key,expected", [
    (claim("x", "value", ["A"], value=math.nan), "claims[0].value", "got nan"),
    (claim("x", "value", ["A"], value=-math.inf), "claims[0].value", "got -inf"),
    (claim("x", "value", ["A"], value=80, tolerance=math.inf), "claims[0].tolerance",
     r"\(a number in \[0, ∞\)\), got inf"),
    (claim("x", "order", ["A", "B"], epsilon=math.nan), "claims[0].epsilon", "got nan"),
    (claim("x", "order", ["A", "B"], epsilon=[1, -math.inf]), "claims[0].epsilon[1]", "got -inf"),
])
def test_a_non_finite_number_in_a_claims_file_is_refused_naming_the_file_and_key(tmp_path, entry, key, expected):
    path = claims_file(tmp_path, [entry])
    with pytest.raises(ConfigError, match=re.escape(f"paper claims file '{path}', key '{key}': must be a finite "
                                                    f"number") + ".*" + expected):
        load_claims([path])


def test_an_infinite_epsilon_is_the_documented_non_private_reference(tmp_path):
    [loaded] = load_claims([claims_file(tmp_path, [claim("x", "value", ["A"], epsilon=math.inf, value=80)])])
    assert loaded.epsilon == math.inf


def test_a_claims_file_whose_aliases_expand_past_the_limit_is_refused_naming_the_key(tmp_path):
    # A 'billion laughs' as the `paper`: the schema's error alone would print its 10**9 strings.
    lines = ["l0: &l0 [" + ", ".join(["lol"] * 10) + "]"]
    lines += [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, 9)]
    path = tmp_path / "bomb.yaml"
    path.write_text("paper:\n" + "".join(f"  {line}\n" for line in lines) + "claims: []\n")
    with pytest.raises(ConfigError, match=re.escape(f"paper claims file '{path}', key 'paper.l8': expands to "
                                                    "1.11e+09 values")):
        load_claims([path])


def campaign_covering(tmp_path, claims, **scorecard):
    """A campaign of syn-S × lr × labels A (np) and B (pm) at ε = 2, naming one claims file."""
    path = claims_file(tmp_path, claims)
    return {"campaign": "c", "datasets": [{"name": "syn-S-0.1-0.9"}], "models": ["lr"],
            "mechanisms": [{"name": "np", "label": "A"}, {"name": "pm", "label": "B"}], "epsilons": [2],
            "seeds": [0], "scorecard": {"claims": [str(path)], **scorecard}}, path


def covered(id, relation, mechanisms, **extra):
    return claim(id, relation, mechanisms, **{"dataset": "syn-S-0.1-0.9", **extra})


@pytest.mark.parametrize("entry,key,message", [
    (covered("o2", "order", ["A", "C"]), "claims[1].mechanisms[1]",
     "mechanism label 'C' is not one of the campaign's labels (A, B)"),
    (covered("o2", "value", ["a"], value=1), "claims[1].mechanisms[0]",
     "mechanism label 'a' is not one of the campaign's labels (A, B)"),
    (claim("o2", "order", ["A", "B"]), "claims[1].dataset",
     "dataset 'adult' is not one of the campaign's datasets (syn-S-0.1-0.9)"),
    (covered("o2", "order", ["A", "B"], model="mlp"), "claims[1].model",
     "model 'mlp' is not one the campaign trains on 'syn-S-0.1-0.9' (lr)"),
])
def test_a_claim_naming_what_the_campaign_lacks_fails_validation_naming_the_claim(tmp_path, entry, key, message):
    from ldpbench.campaign import validate_config

    config, path = campaign_covering(tmp_path, [covered("o1", "order", ["A", "B"]), entry])
    with pytest.raises(ConfigError, match=re.escape(f"config key 'scorecard.claims[0]': paper claims file '{path}', "
                                                    f"key '{key}' (claim 'o2'): {message}; if another campaign "
                                                    "runs this claim, list its id under scorecard.not_run")):
        validate_config(config)


def test_a_claim_another_campaign_runs_is_listed_and_an_epsilon_not_run_reads_as_not_run(tmp_path):
    from ldpbench.campaign import validate_config

    claims = [covered("o1", "order", ["A", "B"], epsilon=[2, 8]), covered("o2", "order", ["A", "C"])]
    config, _ = campaign_covering(tmp_path, claims, not_run=["o2"])
    assert validate_config(config)["scorecard"]["not_run"] == ["o2"]
    config, _ = campaign_covering(tmp_path, claims, not_run=["o2", "o3"])
    with pytest.raises(ConfigError, match=r"config key 'scorecard.not_run\[1\]': no claim 'o3' in the files"):
        validate_config(config)
    config, _ = campaign_covering(tmp_path, claims, not_run=["o1", "o2"])
    with pytest.raises(ConfigError, match=r"config key 'scorecard.not_run\[0\]': the campaign runs the dataset, "
                                          r"model and mechanisms claim 'o1' names; remove it"):
        validate_config(config)
