# Written on the submit host: one small file per cell, needed before the cell's job can start.
localrules:
    plan,


rule plan:
    """The runs of one cell (its seeds and folds, or its trials) as the file its run_cell job reads; a
    tuned final cell's once its trials have selected its setting."""
    input:
        unpack(plan_inputs),
    output:
        str(LAYOUT.plan("{cell_id}")),
    log:
        str(LAYOUT.plan_log("{cell_id}")),
    run:
        write_cell_plan(wildcards.cell_id, output[0])


rule run_cell:
    """Train the runs of one cell that the run store lacks; its marker, written last, says it is done."""
    input:
        unpack(lambda wildcards: prepared(wildcards.dataset)),
        # A plan's content is fixed by its cell id, so its time stamp must not rerun the cell.
        plan=ancient(str(LAYOUT.plan("{cell_id}"))),
    output:
        str(LAYOUT.cell_marker("{dataset}", "{mechanism}", "{cell_id}")),
    log:
        str(LAYOUT.cell_log("{dataset}", "{mechanism}", "{cell_id}")),
    conda:
        "../envs/ldpbench.yaml"
    threads: 1
    resources:
        mem_mb=cell_memory_mb(),
    params:
        prepared=lambda wildcards, input: shlex.quote(parent_dir(input.meta)),
        runs_root=shlex.quote(str(LAYOUT.runs_dir)),
        checkpoints=shlex.quote(str(LAYOUT.checkpoints_dir)),
        label=lambda wildcards: shlex.quote(cell_label(wildcards.cell_id)),
    shell:
        "LDPBENCH_JOB=1 python -P -m ldpbench run-cell --cell {input.plan:q} --prepared {params.prepared} --runs-root {params.runs_root}"
        " --marker {output:q} --checkpoint-dir {params.checkpoints} --label {params.label} 2> {log:q}"
