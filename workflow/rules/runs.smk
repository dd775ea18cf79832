rule run:
    """One federated run of one run spec (identified by the hash of its canonical JSON)."""
    input:
        unpack(lambda wildcards: prepared(wildcards.dataset)),
    output:
        curve=f"{CAMPAIGN_DIR}/runs/dataset={{dataset}}/mechanism={{mechanism}}/run_id={{run_id}}/curve.parquet",
        ledger=f"{CAMPAIGN_DIR}/runs/dataset={{dataset}}/mechanism={{mechanism}}/run_id={{run_id}}/ledger.parquet",
        summary=f"{CAMPAIGN_DIR}/runs/dataset={{dataset}}/mechanism={{mechanism}}/run_id={{run_id}}/summary.parquet",
    log:
        f"{LOG_DIR}/runs/dataset={{dataset}}/mechanism={{mechanism}}/{{run_id}}.log",
    params:
        spec=run_spec_argument,
        prepared=lambda wildcards: shlex.quote(f"{PREPARED_DIR}/{wildcards.dataset}"),
        out=lambda wildcards, output: shlex.quote(str(Path(output.summary).parent)),
    threads: 1
    resources:
        mem_mb=2000,
    shell:
        "{LDPBENCH} run --run-id {wildcards.run_id} --spec {params.spec} "
        "--prepared {params.prepared} --out {params.out} 2> {log:q}"
