"""The reproduction scorecard (ldpbench.scorecard): claims as data, read against a campaign's tables."""

import math
import re
from pathlib import Path

import pandas as pd
import pytest
import yaml
from scipy import stats

from ldpbench.errors import ConfigError
from ldpbench.scorecard import INCONCLUSIVE, NOT_RUN, REFUTED, REPRODUCED, load_claims, scorecard

REPO_CLAIMS = sorted((Path(__file__).resolve().parents[1] / "config" / "paper_claims").glob("*.yaml"))


def runs_of(values: dict, folds: int = 1, dataset: str = "adult", model: str = "lr") -> pd.DataFrame:
    """Runs whose accuracy and AUC (fractions) are, per seed, the given percentages ({(label, ε): [...]});
    each seed's `folds` share its value."""
    rows = [{"dataset": dataset, "model": model, "label": label, "epsilon": float(epsilon), "seed": seed,
             "fold": fold, "status": "ok", "test_accuracy": value / 100, "test_auc": value / 100}
            for (label, epsilon), seeds in values.items() for seed, value in enumerate(seeds) for fold in range(folds)]
    return pd.DataFrame(rows)


def summary_of(runs: pd.DataFrame, trivial=()) -> pd.DataFrame:
    summary = runs.groupby(["dataset", "model", "label", "epsilon"], as_index=False)["test_accuracy"].mean()
    summary["trivial"] = summary["label"].isin(trivial)
    summary["auc_trivial"] = False
    return summary


def comparison(a, b, p, epsilon=2.0):
    return {"dataset": "adult", "model": "lr", "epsilon": epsilon, "metric": "test_accuracy", "mechanism_a": a,
            "mechanism_b": b, "p_value_adjusted": p}


def claims_file(tmp_path, claims, name="claims.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"paper": "A paper (2020)", "claims": claims}))
    return path


def claim(id, relation, mechanisms, epsilon=2, **extra):
    return {"id": id, "source": "Table 1", "dataset": "adult", "model": "lr", "epsilon": epsilon,
            "relation": relation, "mechanisms": mechanisms, **extra}


A = [80.0, 81.0, 79.0, 80.5, 79.5]  # mean 80, sd 0.79 over 5 seeds
RUNS = runs_of({
    ("A", 2): A,
    ("B", 2): [a - d for a, d in zip(A, [5.0, 5.2, 4.8, 4.9, 5.1])],  # A − B: 5 ± 0.16
    ("Null", 2): [a - d for a, d in zip(A, [0.1, -0.1, 0.05, -0.05, 0.0])],  # A − Null: a null effect
    ("Small", 2): [a - d for a, d in zip(A, [0.3, 0.35, 0.25, 0.3, 0.3])],  # A − Small: +0.3, precisely
    ("A", 1): [70.0, 71.0, 69.0, 70.5, 69.5], ("A", 4): [90.0, 91.0, 89.0, 90.5, 89.5],  # A grows with ε
    ("Flat", 1): [50.2, 49.8, 50.1, 49.9, 50.0], ("Flat", 2): [49.9, 50.1, 50.0, 50.2, 49.8],
    ("Flat", 4): [50.0, 50.0, 49.9, 50.1, 50.0],  # at chance whatever ε
    ("Falling", 1): [80.0, 81.0, 79.0, 80.5, 79.5], ("Falling", 2): [75.0, 76.0, 74.0, 75.5, 74.5],
    ("Falling", 4): [74.0, 75.0, 73.0, 74.5, 73.5],  # falls by 1 point or more at each step
    ("Dip", 1): [70.0, 71.0, 69.0, 70.5, 69.5], ("Dip", 2): [90.0, 91.0, 89.0, 90.5, 89.5],
    ("Dip", 4): [85.0, 86.0, 84.0, 85.5, 84.5],  # grows overall, then drops by 5
})
SUMMARY = summary_of(RUNS)
COMPARISONS = pd.DataFrame([comparison("B", "A", 0.001)])  # stored as B − A


@pytest.mark.parametrize("entry,status", [
    # value: ours − paper has 90 % interval ±0.75 about the gap.
    (claim("v1", "value", ["A"], value=80, tolerance=1), REPRODUCED),
    (claim("v2", "value", ["A"], value=84, tolerance=1), REFUTED),
    (claim("v3", "value", ["A"], value=80.9, tolerance=1), INCONCLUSIVE),  # gap −0.9: neither
    (claim("v4", "value", ["A"], value=80, tolerance=0), INCONCLUSIVE),  # no margin: never equivalent
    # difference A − B (+5 ± 0.16 per seed).
    (claim("d1", "difference", ["A", "B"], value=5.5, tolerance=1), REPRODUCED),
    (claim("d2", "difference", ["A", "B"], value=9, tolerance=1), REFUTED),
    (claim("d3", "difference", ["B", "A"], value=5, tolerance=1), REFUTED),  # the opposite sign
    # below resolution (|value| ≤ tolerance): a null effect never reproduces; a precise +0.3 does.
    (claim("r1", "difference", ["A", "Null"], value=0.3, tolerance=1), INCONCLUSIVE),
    (claim("r2", "difference", ["A", "Small"], value=0.35, tolerance=1), REPRODUCED),
    (claim("r3", "difference", ["Small", "A"], value=0.35, tolerance=1), REFUTED),
    (claim("o1", "order", ["A", "B"]), REPRODUCED),
    (claim("o2", "order", ["B", "A"]), REFUTED),  # the opposite order, significant after Holm
    (claim("o3", "order", ["A", "Null"]), INCONCLUSIVE),  # a tie is not a refutation
    (claim("l1", "at_least", ["A", "B"], value=4), REPRODUCED),
    (claim("l2", "at_least", ["A", "B"], value=6), REFUTED),
    (claim("l3", "at_least", ["A", "B"], value=5), INCONCLUSIVE),
    (claim("g1", "increases", ["A"], epsilon=[1, 2, 4], tolerance=1), REPRODUCED),
    (claim("g2", "increases", ["Flat"], epsilon=[1, 2, 4]), INCONCLUSIVE),  # flat at chance: no growth
    (claim("g3", "increases", ["Falling"], epsilon=[1, 2, 4], tolerance=0.5), REFUTED),
    (claim("g4", "increases", ["Dip"], epsilon=[1, 2, 4], tolerance=1), REFUTED),  # a significant drop
    (claim("n1", "order", ["A", "C"]), NOT_RUN),
    (claim("n2", "value", ["A"], epsilon=8, value=80), NOT_RUN),
])
def test_each_relation_is_judged_both_ways(tmp_path, entry, status):
    [row] = scorecard(load_claims([claims_file(tmp_path, [entry])]), RUNS, SUMMARY, COMPARISONS).to_dict("records")
    assert row["status"] == status, row


def test_a_null_effect_never_reproduces_a_claim_above_or_below_resolution(tmp_path):
    """Ours − second is 0 ± 0.1 per seed; claims of every size from 0.05 to 3 points with a tolerance of
    1: none is reproduced (the old rule, "paper within our interval ± tolerance", reproduced all below 1)."""
    entries = [claim(f"c{index}", "difference", ["A", "Null"], value=value, tolerance=1)
               for index, value in enumerate([0.05, 0.3, -0.16, 0.9, 1.5, 3.0])]
    table = scorecard(load_claims([claims_file(tmp_path, entries)]), RUNS, SUMMARY, COMPARISONS)
    assert REPRODUCED not in set(table["status"]), table[["paper_value", "status", "why"]]


def test_a_single_seed_order_is_inconclusive_never_refuted(tmp_path):
    runs = runs_of({("A", 2): [80.0], ("B", 2): [70.0]}, folds=5)
    claims = load_claims([claims_file(tmp_path, [claim("o", "order", ["B", "A"]),
                                                 claim("l", "at_least", ["B", "A"], value=5)])])
    table = scorecard(claims, runs, summary_of(runs), None)
    assert list(table["status"]) == [INCONCLUSIVE, INCONCLUSIVE] and list(table["replicates"]) == [1, 1]
    assert table["why"].str.startswith("1 replicate").all()


def test_folds_of_one_seed_count_once(tmp_path):
    """2 seeds × 5 folds are 2 replicates: the interval has 1 degree of freedom."""
    runs = runs_of({("A", 2): [80.0, 82.0], ("B", 2): [75.0, 76.0]}, folds=5)
    [row] = scorecard(load_claims([claims_file(tmp_path, [claim("d", "difference", ["A", "B"], value=5.5,
                                                                 tolerance=1)])]),
                      runs, summary_of(runs), None).to_dict("records")
    assert row["replicates"] == 2 and row["ours"] == pytest.approx(5.5)
    half = stats.t.ppf(0.975, 1) * 0.5  # t(df 1) × sd (√0.5) / √2
    assert (row["ours_low"], row["ours_high"]) == pytest.approx((5.5 - half, 5.5 + half))
    assert row["status"] == INCONCLUSIVE and row["replicates_needed"] > 2


def test_a_claim_between_trivial_models_is_inconclusive_saying_so(tmp_path):
    claims = load_claims([claims_file(tmp_path, [claim("o", "order", ["A", "B"]),
                                                 claim("v", "value", ["A"], value=80, tolerance=1)])])
    table = scorecard(claims, RUNS, summary_of(RUNS, trivial={"A", "B"}), COMPARISONS)
    assert list(table["status"]) == [INCONCLUSIVE, INCONCLUSIVE]
    assert all("trivial" in why for why in table["why"])
    # One trivial model of two: judged, and named.
    [row] = scorecard(claims[:1], RUNS, summary_of(RUNS, trivial={"B"}), COMPARISONS).to_dict("records")
    assert row["status"] == REPRODUCED and "B trivial" in row["why"]


def test_a_difference_is_read_in_points_with_the_holm_p_of_its_family(tmp_path):
    claims = load_claims([claims_file(tmp_path, [claim("d", "difference", ["A", "B"], value=5, tolerance=1)])])
    [row] = scorecard(claims, RUNS, SUMMARY, COMPARISONS).to_dict("records")
    assert row["ours"] == pytest.approx(5.0) and row["gap"] == pytest.approx(0.0)
    assert row["ours_low"] < 5 < row["ours_high"] and row["p_value_adjusted"] == 0.001
    assert row["basis"] == "paired over 5 seed(s)"


def test_a_non_private_reference_is_read_at_infinity_whatever_the_claims_epsilon(tmp_path):
    """"DiffSketch loses at most 2 points to NP" at ε = 2: NP runs only at ε = ∞; paired on the seeds."""
    runs = pd.concat([RUNS, runs_of({("NP", math.inf): [a + 1.0 for a in A]})])
    claims = load_claims([claims_file(tmp_path, [claim("m", "at_least", ["A", "NP"], value=-2),
                                                 claim("o", "order", ["NP", "A"])])])
    table = scorecard(claims, runs, summary_of(runs), COMPARISONS)
    assert list(table["status"]) == [REPRODUCED, REPRODUCED]
    assert table.loc[0, "ours"] == pytest.approx(-1.0) and "NP at ε = ∞ (non-private)" in table.loc[0, "basis"]
    # A private mechanism is never read at another ε than the claim's.
    [row] = scorecard(load_claims([claims_file(tmp_path, [claim("x", "order", ["A", "B"], epsilon=4)])]),
                      runs, summary_of(runs), COMPARISONS).to_dict("records")
    assert row["status"] == NOT_RUN


def test_a_list_of_epsilons_gives_one_row_each(tmp_path):
    claims = load_claims([claims_file(tmp_path, [claim("o", "order", ["A", "B"], epsilon=[1, 2, 4])])])
    assert [c.epsilon for c in claims] == [1.0, 2.0, 4.0]
    table = scorecard(claims, RUNS, SUMMARY, COMPARISONS)
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
