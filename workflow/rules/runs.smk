# Written on the submit host: one small file per cell, needed before the cell's job can start.
localrules:
    plan,


rule plan:
    """The run specs of one configuration cell, as a file the cell's job reads."""
    output:
        f"{CAMPAIGN_DIR}/plans/{{cell_id}}.json",
    log:
        f"{LOG_DIR}/plans/{{cell_id}}.log",
    run:
        write_cell_plan(wildcards.cell_id, output[0])


rule run_cell:
    """The runs of one configuration cell (its seeds and folds), one run_id=<id>/ directory each."""
    input:
        unpack(lambda wildcards: prepared(wildcards.dataset)),
        # A plan's content is fixed by its cell id, so its time stamp must not rerun the cell.
        plan=ancient(f"{CAMPAIGN_DIR}/plans/{{cell_id}}.json"),
    output:
        directory(f"{CAMPAIGN_DIR}/runs/dataset={{dataset}}/mechanism={{mechanism}}/cell={{cell_id}}"),
    log:
        f"{LOG_DIR}/runs/dataset={{dataset}}/mechanism={{mechanism}}/{{cell_id}}.log",
    conda:
        "../envs/ldpbench.yaml"
    threads: 1
    resources:
        mem_mb=2000,
    params:
        prepared=lambda wildcards, input: shlex.quote(parent_dir(input.meta)),
        # Outside the output directory, which Snakemake deletes when a job fails or is killed.
        checkpoints=shlex.quote(f"{CAMPAIGN_DIR}/checkpoints"),
    shell:
        "python -m ldpbench run --specs @{input.plan:q} --prepared {params.prepared} --out {output:q}"
        " --checkpoint-dir {params.checkpoints} 2> {log:q}"
