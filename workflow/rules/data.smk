rule prepare_dataset:
    """Fetch a dataset's official files (checksum-verified; raw dir, mirror or download) and prepare it."""
    output:
        data=f"{PREPARED_DIR}/{{dataset}}/data.parquet",
        meta=f"{PREPARED_DIR}/{{dataset}}/meta.json",
    log:
        f"logs/data/prepare_{{dataset}}.log",
    params:
        flags=prepare_flags(),
        out=lambda wildcards: shlex.quote(f"{PREPARED_DIR}/{wildcards.dataset}"),
    shell:
        "{LDPBENCH} prepare {wildcards.dataset:q} --out {params.out} {params.flags} 2> {log:q}"
