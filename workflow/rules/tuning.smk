# The tuning stage of a campaign with a `tuning:` section (ldpbench.tuning). The trials are ordinary
# cells (rule run_cell), one per configuration and ε; each tuned final cell selects its setting from
# its own trial cell when its plan is written (rule plan). `select` gathers every trial and selection
# into the tables the report shows; nothing waits for it but aggregation.
localrules:
    trials,
    select,


rule trials:
    """The tuning trials (plans, ids, the point each tries), from the trial cells' plan files."""
    input:
        plans=trial_plans(),
        cells=str(LAYOUT.cell_index(TRIAL)),
    output:
        str(LAYOUT.trials_manifest),
    log:
        str(LAYOUT.log("trials")),
    run:
        save_manifest(output[0], input.plans, TRIAL)


rule select:
    """Score each trial on its validation clients and select every tuned configuration's setting."""
    input:
        trials=str(LAYOUT.trials_manifest),
        cells=trial_cell_markers(),
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
        "LDPBENCH_JOB=1 python -P -m ldpbench select --trials {input.trials:q} --runs-root {params.runs_root:q} "
        "--tables-dir {params.tables_dir:q} 2> {log:q}"
