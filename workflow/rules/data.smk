rule prepare_dataset:
    """Fetch a dataset's official files (checksum-verified; raw dir, mirror or download) and prepare it.

    The output is meta.json, written last: it marks a complete preparation in either format
    (data.parquet for tabular sets; features/labels[/clients/official_test].npy for arrays).
    A job that finds a data file differing from the digest in meta.json moves meta.json aside
    (meta.json.damaged), so the next run of the workflow prepares the dataset again.
    """
    output:
        meta=f"{PREPARED_DIR}/{{dataset}}/meta.json",
    log:
        f"logs/data/prepare_{{dataset}}.log",
    conda:
        "../envs/ldpbench.yaml"
    params:
        flags=prepare_flags(),
        out=lambda wildcards: shlex.quote(f"{PREPARED_DIR}/{wildcards.dataset}"),
    shell:
        "python -m ldpbench prepare {wildcards.dataset:q} --out {params.out} {params.flags} 2> {log:q}"
