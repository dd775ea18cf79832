rule features:
    """Pretrained features of one prepared dataset, cached per (dataset, encoder), written atomically.

    A run that finds a features file differing from the digest in meta.json moves meta.json aside,
    so the next run of the workflow extracts the features again.
    """
    input:
        meta=str(prepared_meta(PREPARED_DIR, "{dataset}")),
    output:
        meta=str(features_meta(FEATURES_DIR, "{dataset}", "{encoder}")),
    log:
        str(features_log("{dataset}", "{encoder}")),
    benchmark:
        str(features_log("{dataset}", "{encoder}", ".benchmark.tsv"))
    conda:
        "../envs/ldpbench.yaml"
    threads: config["features"]["threads"]
    resources:
        mem_mb=config["features"]["mem_mb"],
        gpu=config["features"]["gpus"],
    params:
        flags=features_flags,
        prepared=lambda wildcards, input: shlex.quote(parent_dir(input.meta)),
        out=lambda wildcards, output: shlex.quote(parent_dir(output.meta)),
    shell:
        "LDPBENCH_JOB=1 python -P -m ldpbench features {wildcards.dataset:q} --encoder {wildcards.encoder:q} "
        "--prepared {params.prepared} --out {params.out} --threads {threads} {params.flags} 2> {log:q}"
