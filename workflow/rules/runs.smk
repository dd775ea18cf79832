rule run:
    """The runs of one configuration cell (its seeds and folds), one run_id=<id>/ directory each."""
    input:
        unpack(lambda wildcards: prepared(wildcards.dataset)),
    output:
        directory(f"{CAMPAIGN_DIR}/runs/dataset={{dataset}}/mechanism={{mechanism}}/cell={{cell_id}}"),
    log:
        f"{LOG_DIR}/runs/dataset={{dataset}}/mechanism={{mechanism}}/{{cell_id}}.log",
    params:
        specs=cell_specs_argument,
        prepared=lambda wildcards, input: shlex.quote(parent_dir(input.meta)),
        # Outside the output directory, which Snakemake deletes when a job fails or is killed.
        checkpoints=shlex.quote(f"{CAMPAIGN_DIR}/checkpoints"),
    threads: 1
    resources:
        mem_mb=2000,
    shell:
        "{LDPBENCH} run --specs {params.specs} --prepared {params.prepared} --out {output:q}"
        " --checkpoint-dir {params.checkpoints} 2> {log:q}"
