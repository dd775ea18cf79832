rule prepare_dataset:
    """Fetch a dataset's official files (checksum-verified; raw dir, mirror or download) and prepare it.

    The output is meta.json, written last: it marks a complete preparation in either format
    (data.parquet for tabular sets; features/labels[/clients/official_test].npy for arrays).
    A job that finds a data file differing from the digest in meta.json moves meta.json aside
    (meta.json.damaged), so the next run of the workflow prepares the dataset again.
    """
    output:
        meta=str(prepared_meta(PREPARED_DIR, "{dataset}")),
    log:
        str(prepare_log("{dataset}")),
    conda:
        "../envs/ldpbench.yaml"
    params:
        flags=prepare_flags(),
        out=lambda wildcards, output: shlex.quote(parent_dir(output.meta)),
    shell:
        "LDPBENCH_JOB=1 python -P -m ldpbench prepare {wildcards.dataset:q} --out {params.out} {params.flags} 2> {log:q}"
