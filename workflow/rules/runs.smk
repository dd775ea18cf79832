# Written on the submit host: one small file per cell, needed before the cell's job can start.
localrules:
    plan,


rule plan:
    """The run plans of one cell (its seeds and folds), as the file its run_cell job reads."""
    output:
        str(LAYOUT.plan("{cell_id}")),
    log:
        str(LAYOUT.plan_log("{cell_id}")),
    run:
        write_cell_plan(wildcards.cell_id, output[0])


rule run_cell:
    """The runs of one cell (the seeds and folds of one configuration): their summaries, curves and ledgers."""
    input:
        unpack(lambda wildcards: prepared(wildcards.dataset)),
        # A plan's content is fixed by its cell id, so its time stamp must not rerun the cell.
        plan=ancient(str(LAYOUT.plan("{cell_id}"))),
    output:
        # One directory in each tree of run files (ldpbench.layout.RUN_FILES), summaries published last.
        curves=directory(str(LAYOUT.cell("{dataset}", "{mechanism}", "{cell_id}", CURVES))),
        ledgers=directory(str(LAYOUT.cell("{dataset}", "{mechanism}", "{cell_id}", LEDGERS))),
        summaries=directory(str(LAYOUT.cell("{dataset}", "{mechanism}", "{cell_id}", SUMMARIES))),
    log:
        str(LAYOUT.cell_log("{dataset}", "{mechanism}", "{cell_id}")),
    conda:
        "../envs/ldpbench.yaml"
    threads: 1
    resources:
        mem_mb=2000,
    params:
        prepared=lambda wildcards, input: shlex.quote(parent_dir(input.meta)),
        # Outside the output directory, which Snakemake deletes when a job fails or is killed.
        checkpoints=shlex.quote(str(LAYOUT.checkpoints_dir)),
        label=lambda wildcards: shlex.quote(cell_label(wildcards.cell_id)),
    shell:
        "python -P -m ldpbench run-cell --plans @{input.plan:q} --prepared {params.prepared} --out {output.summaries:q}"
        " --checkpoint-dir {params.checkpoints} --label {params.label} 2> {log:q}"
