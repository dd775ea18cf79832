# Run on the submit host, never queued: they are cheap, read many small files (aggregate, report)
# or write to the one tracking store (tracking_store, track), which cluster jobs must not race on.
localrules:
    manifest,
    aggregate,
    report,
    tracking_store,
    track,


rule manifest:
    """The campaign's run list (plans, ids, labels); rewritten only when the campaign changes."""
    output:
        f"{CAMPAIGN_DIR}/manifest.json",
    log:
        f"{LOG_DIR}/manifest.log",
    params:
        content=manifest_content(),
    run:
        save_manifest(output[0])


rule aggregate:
    """All run files of the manifest -> runs, curves and summary Parquet tables."""
    input:
        manifest=f"{CAMPAIGN_DIR}/manifest.json",
        cells=cell_outputs(),
    output:
        runs=f"{CAMPAIGN_DIR}/tables/runs.parquet",
        curves=f"{CAMPAIGN_DIR}/tables/curves.parquet",
        summary=f"{CAMPAIGN_DIR}/tables/summary.parquet",
    log:
        f"{LOG_DIR}/aggregate.log",
    conda:
        "../envs/ldpbench.yaml"
    params:
        runs_root=lambda wildcards, input: parent_dir(input.manifest, "runs"),
        tables_dir=lambda wildcards, output: parent_dir(output.summary),
    shell:
        "python -m ldpbench aggregate --manifest {input.manifest:q} --runs-root {params.runs_root:q} "
        "--tables-dir {params.tables_dir:q} 2> {log:q}"


rule report:
    """HTML report with seaborn figures and the claimed/worst-case ε and bits tables."""
    input:
        rules.aggregate.output,
    output:
        html=report(
            f"{CAMPAIGN_DIR}/report/index.html",
            caption="../report/campaign.rst",
            category="Campaign report",
        ),
        accuracy=report(
            f"{CAMPAIGN_DIR}/report/accuracy_vs_epsilon.png",
            caption="../report/accuracy.rst",
            category="Figures",
        ),
        curves=report(
            f"{CAMPAIGN_DIR}/report/convergence.png",
            caption="../report/convergence.rst",
            category="Figures",
        ),
    log:
        f"{LOG_DIR}/report.log",
    conda:
        "../envs/ldpbench.yaml"
    params:
        tables_dir=lambda wildcards, input: parent_dir(input[0]),
        out_dir=lambda wildcards, output: parent_dir(output.html),
    shell:
        "python -m ldpbench report --tables-dir {params.tables_dir:q} --out-dir {params.out_dir:q} 2> {log:q}"


rule tracking_store:
    """Create the MLflow store and experiment once, locally, before anything else writes to it."""
    output:
        f"{CAMPAIGN_DIR}/tracking/store.json",
    log:
        f"{LOG_DIR}/tracking_store.log",
    conda:
        "../envs/ldpbench.yaml"
    params:
        uri=config["tracking"]["uri"],
        experiment=tracking_experiment(),
        artifact_dir=f"{CAMPAIGN_DIR}/mlflow-artifacts",
    shell:
        "python -m ldpbench tracking-init --uri {params.uri:q} --experiment {params.experiment:q} "
        "--artifact-dir {params.artifact_dir:q} --marker {output:q} 2> {log:q}"


rule track:
    """Log the campaign to MLflow (parent + one child per run); idempotent by run key."""
    input:
        store=rules.tracking_store.output,
        tables=rules.aggregate.output,
        report=rules.report.output.html,
    output:
        f"{CAMPAIGN_DIR}/tracking/mlflow.json",
    log:
        f"{LOG_DIR}/track.log",
    conda:
        "../envs/ldpbench.yaml"
    params:
        uri=config["tracking"]["uri"],
        experiment=tracking_experiment(),
        tables_dir=lambda wildcards, input: parent_dir(input.tables[0]),
        report_dir=lambda wildcards, input: parent_dir(input.report),
        artifact_dir=f"{CAMPAIGN_DIR}/mlflow-artifacts",
    shell:
        "python -m ldpbench track --tables-dir {params.tables_dir:q} --report-dir {params.report_dir:q} "
        "--uri {params.uri:q} --experiment {params.experiment:q} "
        "--artifact-dir {params.artifact_dir:q} --marker {output:q} 2> {log:q}"
