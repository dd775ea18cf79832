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


def test_run_rejects_bad_specs(tmp_path, capsys):
    assert main(["run", "--specs", "{not json", "--prepared", str(tmp_path), "--out", str(tmp_path)]) == 2
    assert "--specs is not valid JSON" in capsys.readouterr().err
