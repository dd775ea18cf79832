"""The ldpbench command line."""

from ldpbench.cli import main


def test_mechanism_accounting_listing_shows_the_bitrand_gap(capsys):
    assert main(["mechanisms", "--epsilon", "1", "--dims", "768"]) == 0
    lines = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines()[2:]}
    claimed, worst, _ = (float(v) for v in lines["bitrand"])
    assert claimed == 2.0 and 3300 < worst < 3320
    assert lines["np"][:2] == ["inf", "inf"]


def test_invalid_campaign_exits_2_naming_the_key(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("campaign: x\ndatasets: [{name: syn-S-0.1-0.9}]\nmodels: [lr]\n"
                    "mechanisms: [{name: pm}]\nepsilons: [1]\nseeds: [0]\nsplits: {}\n")
    assert main(["validate", str(path)]) == 2
    assert "config key '<top level>'" in capsys.readouterr().err


def test_run_cell_rejects_bad_plan_files_naming_the_file(tmp_path, capsys):
    plans = tmp_path / "plans.json"
    plans.write_text("{not json")
    args = ["--prepared", str(tmp_path), "--out", str(tmp_path / "cell")]
    assert main(["run-cell", "--plans", f"@{plans}", *args]) == 2
    assert f"--plans: '{plans}' is not valid JSON" in capsys.readouterr().err
    plans.write_text('[{"dataset": "d"}]')
    assert main(["run-cell", "--plans", f"@{plans}", *args]) == 2
    assert "not a valid run plan: missing keys" in capsys.readouterr().err
    assert main(["run-cell", "--plans", "[]", *args]) == 2
    assert "--plans must be @<file>" in capsys.readouterr().err


def test_validate_counts_a_million_run_grid_without_expanding_it_and_warns(tmp_path, capsys):
    epsilons = ", ".join(f"{1 + i / 1000:g}" for i in range(1000))
    path = tmp_path / "huge.yaml"
    path.write_text(f"campaign: huge\ndatasets: [{{name: syn-S-0.1-0.9}}]\nmodels: [lr]\n"
                    f"mechanisms: [{{name: pm}}]\nepsilons: [{epsilons}]\nseeds: {list(range(1000))}\n")
    assert main(["validate", str(path)]) == 0
    captured = capsys.readouterr()
    assert "campaign 'huge', 1,000,000 runs" in captured.out
    assert "warning: 1,000,000 runs is more than 100,000" in captured.err


def test_validate_of_a_small_grid_does_not_warn(tmp_path, capsys):
    path = tmp_path / "small.yaml"
    path.write_text("campaign: small\ndatasets: [{name: syn-S-0.1-0.9}]\nmodels: [lr]\n"
                    "mechanisms: [{name: np}, {name: pm}]\nepsilons: [1, 2]\nseeds: [0, 1]\n")
    assert main(["validate", str(path)]) == 0
    captured = capsys.readouterr()
    assert "campaign 'small', 6 runs" in captured.out and "warning" not in captured.err
