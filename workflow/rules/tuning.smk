# The tuning stage of a campaign with a `tuning:` section (ldpbench.tuning): the trials are ordinary
# cells (rule run_cell); `select` scores them and is a checkpoint, because the final runs, and so
# the final cells, are known only once it has chosen each tuned configuration's setting.
localrules:
    trials,
    select,


rule trials:
    """The tuning trials (plans, ids, the point each tries); rewritten only when the tuning changes."""
    output:
        str(LAYOUT.trials_manifest),
    log:
        str(LAYOUT.log("trials")),
    params:
        content={"trials": TRIALS, "skipped": SKIPPED_DATASETS},
    run:
        save_trials(output[0])


checkpoint select:
    """Score each trial on its validation clients and select every tuned configuration's setting."""
    input:
        trials=str(LAYOUT.trials_manifest),
        cells=trial_cell_outputs(),
    output:
        tuning=str(LAYOUT.table("tuning")),
        selected=str(LAYOUT.table("selected")),
    log:
        str(LAYOUT.log("select")),
    conda:
        "../envs/ldpbench.yaml"
    params:
        runs_root=lambda wildcards, input: parent_dir(input.trials, RUNS_DIR),
        tables_dir=lambda wildcards, output: parent_dir(output.selected),
    shell:
        "python -P -m ldpbench select --trials {input.trials:q} --runs-root {params.runs_root:q} "
        "--tables-dir {params.tables_dir:q} 2> {log:q}"
