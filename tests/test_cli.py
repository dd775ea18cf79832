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


def test_validate_warns_of_cuda_without_a_cuda_device_here(tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    path = tmp_path / "gpu.yaml"
    path.write_text("campaign: x\ndatasets: [{name: syn-S-0.1-0.9}]\nmodels: [lr]\n"
                    "mechanisms: [{name: pm}]\nepsilons: [1]\nseeds: [0]\ntraining: {device: cuda}\n")
    assert main(["validate", str(path)]) == 0  # valid: its jobs may run on GPU nodes
    error = capsys.readouterr().err
    assert error.startswith("warning: config key 'training.device': training.device is 'cuda' but no CUDA device "
                            "is available on this machine")


def test_run_cell_rejects_bad_plan_files_naming_the_file(tmp_path, capsys):
    plans = tmp_path / "plans.json"
    plans.write_text("{not json")
    args = ["--prepared", str(tmp_path), "--runs-root", str(tmp_path / "runs"), "--marker", str(tmp_path / "m.json")]
    assert main(["run-cell", "--cell", str(plans), *args]) == 2
    assert f"--cell: '{plans}' is not valid JSON" in capsys.readouterr().err
    plans.write_text('[{"dataset": "d"}]')
    assert main(["run-cell", "--cell", str(plans), *args]) == 2
    assert "must hold a cell's plan file" in capsys.readouterr().err
    plans.write_text('{"cell_id": "c", "phase": "final", "runs": [{"run_id": "r", "plan": {"dataset": "d"}}]}')
    assert main(["run-cell", "--cell", str(plans), *args]) == 2
    assert "not a valid run plan: missing keys" in capsys.readouterr().err
    assert not (tmp_path / "m.json").exists() and not (tmp_path / "runs").exists()


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


def test_version_names_ldpbench_and_torch(capsys):
    import pytest

    from ldpbench import __version__

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith(f"ldpbench {__version__} (torch 2.13.0")


def test_missing_or_malformed_files_exit_2_with_one_line_naming_the_file(tmp_path, capsys):
    missing = tmp_path / "missing.yaml"
    assert main(["validate", str(missing)]) == 2
    error = capsys.readouterr().err
    assert error == f"ldpbench validate: error: campaign file '{missing}': cannot read it (No such file or directory)\n"
    broken = tmp_path / "broken.yaml"
    broken.write_text("campaign: x\nepsilons: [1\n")
    assert main(["validate", str(broken)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and f"'{broken}' is not valid YAML" in error and "at line 3, column 1" in error
    # A file another library opens (pyarrow, for the report's tables): the same one line, exit 2.
    assert main(["report", "--tables-dir", str(tmp_path / "none"), "--out-dir", str(tmp_path / "report")]) == 2
    error = capsys.readouterr().err
    assert error == f"ldpbench report: error: cannot use '{tmp_path / 'none' / 'runs.parquet'}': " \
                    "No such file or directory\n"
    # A missing audit or scorecard table fails as soon as the tables are read, before any figure.
    import pandas as pd

    tables = tmp_path / "tables"
    tables.mkdir()
    for table in ("runs", "curves", "summary"):
        pd.DataFrame({"campaign": ["c"]}).to_parquet(tables / f"{table}.parquet")
    for flag in ("--audit", "--scorecard"):
        missing = tmp_path / f"no-{flag[2:]}.parquet"
        out = tmp_path / f"report-{flag[2:]}"
        assert main(["report", "--tables-dir", str(tables), "--out-dir", str(out), flag, str(missing)]) == 2
        assert capsys.readouterr().err == f"ldpbench report: error: cannot use '{missing}': No such file or directory\n"
        assert not out.exists()


def test_a_list_given_with_snakemakes_config_gets_a_hint_to_use_a_file():
    import pytest

    from ldpbench.campaign import COMMAND_LINE_LIST_HINT, validate_config
    from ldpbench.errors import ConfigError

    campaign = {"campaign": "x", "datasets": [{"name": "syn-S-0.1-0.9"}], "models": ["lr"],
                "mechanisms": [{"name": "pm"}], "seeds": [0]}
    with pytest.raises(ConfigError) as error:
        validate_config({**campaign, "epsilons": ["1", "2"]})  # what --config epsilons=[1,2] gives
    assert "config key 'epsilons[0]'" in str(error.value) and COMMAND_LINE_LIST_HINT in str(error.value)
    with pytest.raises(ConfigError) as error:  # a word is not a number given on the command line
        validate_config({**campaign, "epsilons": ["one"]})
    assert COMMAND_LINE_LIST_HINT not in str(error.value)


def test_check_runs_the_contract_and_fails_a_mechanism_that_breaks_it(monkeypatch, capsys):
    from ldpbench.cli import main

    from stats import make_pm_modify_its_inputs

    assert main(["check", "pm", "--samples", "20000"]) == 0
    out = capsys.readouterr().out
    assert "FAILED" not in out and "audit: consistent" in out and out.rstrip().endswith("all checks passed")

    make_pm_modify_its_inputs(monkeypatch)
    assert main(["check", "pm", "--samples", "0"]) == 1
    out = capsys.readouterr().out
    assert "FAILED  does not modify its inputs: privatize() modified the updates" in out
    assert "privacy audit: skipped" in out and out.rstrip().endswith(" failed")  # in-place changes break chunking too
