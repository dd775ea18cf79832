# Run on the submit host, never queued: they are cheap, read many small files (aggregate, report)
# or write to the one tracking store (tracking_store, track), which cluster jobs must not race on.
localrules:
    manifest,
    aggregate,
    compare,
    report,
    tracking_store,
    campaign_file,
    track,
    track_report,


rule manifest:
    """The campaign's final runs (plans, ids, labels, cells), from the final cells' plan files."""
    input:
        plans=final_plans(),
        cells=str(LAYOUT.cell_index(FINAL)),
    output:
        str(LAYOUT.manifest),
    log:
        str(LAYOUT.log("manifest")),
    run:
        save_manifest(output[0], input.plans, FINAL)


rule aggregate:
    """All run files of the manifest -> runs, curves and summary Parquet tables."""
    input:
        manifest=str(LAYOUT.manifest),
        cells=final_cell_markers(),
        tuning=tuning_tables(),
    output:
        runs=str(LAYOUT.table("runs")),
        curves=str(LAYOUT.table("curves")),
        summary=str(LAYOUT.table("summary")),
    log:
        str(LAYOUT.log("aggregate")),
    # The serial tail (aggregate, compare, report) goes before audits waiting for a core.
    priority: 20
    # Never retried (the SLURM profile retries failed jobs): its failures are its verdicts on the run
    # files. A corrupt one is quarantined and its cell marker removed so that the next run recomputes
    # it; a retry would only wait latency-wait for that marker, then end on a missing-file error.
    retries: 0
    conda:
        "../envs/ldpbench.yaml"
    params:
        runs_root=lambda wildcards, input: parent_dir(input.manifest, RUNS_DIR),
        tables_dir=lambda wildcards, output: parent_dir(output.summary),
        selected=selected_flag(),
    shell:
        "LDPBENCH_JOB=1 python -P -m ldpbench aggregate --manifest {input.manifest:q} --runs-root {params.runs_root:q} "
        "--tables-dir {params.tables_dir:q} {params.selected} 2> {log:q}"


rule compare:
    """Paired comparisons of the mechanisms over shared seeds and folds, rankings and verdicts."""
    input:
        rules.aggregate.output,
    output:
        comparisons=str(LAYOUT.table("comparisons")),
        rankings=str(LAYOUT.table("rankings")),
        verdicts=str(LAYOUT.table("verdicts")),
    log:
        str(LAYOUT.log("compare")),
    priority: 20
    conda:
        "../envs/ldpbench.yaml"
    params:
        tables_dir=lambda wildcards, output: parent_dir(output.verdicts),
    shell:
        "LDPBENCH_JOB=1 python -P -m ldpbench compare --tables-dir {params.tables_dir:q} 2> {log:q}"


rule report:
    """HTML report: the verdicts first, then figures, the claimed/worst-case/audited ε and bits tables."""
    input:
        campaign_tables(),
    output:
        html=report(
            str(LAYOUT.report()),
            caption="../report/campaign.rst",
            category="Campaign report",
        ),
        # Every figure, PNG and SVG: which ones a campaign has depends on its tables.
        figures=report(
            directory(str(LAYOUT.figures_dir)),
            patterns=FIGURE_PATTERNS,
            caption="../report/figures.rst",
            category="Figures",
        ),
    log:
        str(LAYOUT.log("report")),
    conda:
        "../envs/ldpbench.yaml"
    params:
        tables_dir=lambda wildcards, input: parent_dir(input[0]),
        out_dir=lambda wildcards, output: parent_dir(output.html),
        audit=audit_table_flag(),
        scorecard=scorecard_flag(),
    shell:
        "LDPBENCH_JOB=1 python -P -m ldpbench report --tables-dir {params.tables_dir:q} --out-dir {params.out_dir:q} "
        "{params.audit} {params.scorecard} 2> {log:q}"


rule tracking_store:
    """Create the MLflow store and experiment once, locally, before anything else writes to it."""
    input:
        tracking_store_after(rules.aggregate.output),
    output:
        str(LAYOUT.tracking_store),
    log:
        str(LAYOUT.log("tracking_store")),
    conda:
        "../envs/ldpbench.yaml"
    params:
        uri=config["tracking"]["uri"],
        experiment=tracking_experiment(),
        artifact_dir=str(LAYOUT.artifacts_dir),
    shell:
        "LDPBENCH_JOB=1 python -P -m ldpbench tracking-init --uri {params.uri:q} --experiment {params.experiment:q} "
        "--artifact-dir {params.artifact_dir:q} --marker {output:q} 2> {log:q}"


rule campaign_file:
    """The campaign's resolved configuration (rewritten when it changes), attached to its MLflow run."""
    output:
        str(LAYOUT.campaign_file),
    log:
        str(LAYOUT.log("campaign_file")),
    params:
        content=config,
    run:
        save_campaign_file(output[0])


rule track:
    """Log the campaign to MLflow (campaign, configurations, runs and a tuning's trials under them);
    idempotent by run key. The report is drawn meanwhile, on the other core: track_report attaches it."""
    input:
        store=rules.tracking_store.output,
        # Every table it logs or attaches: the configurations carry the verdicts, rankings and audit.
        tables=campaign_tables(),
        # A tuned campaign's sweep: trials.json names the trial runs it shows.
        trials=[str(LAYOUT.trials_manifest)] if TUNED else [],
        campaign_file=rules.campaign_file.output,
        datasets=list(dataset_metas().values()),
    output:
        str(LAYOUT.tracking_marker),
    log:
        str(LAYOUT.log("track")),
    conda:
        "../envs/ldpbench.yaml"
    params:
        uri=config["tracking"]["uri"],
        experiment=tracking_experiment(),
        tables_dir=lambda wildcards, input: parent_dir(input.tables[0]),
        artifact_dir=str(LAYOUT.artifacts_dir),
        datasets=dataset_track_args(),
    shell:
        "LDPBENCH_JOB=1 python -P -m ldpbench track --tables-dir {params.tables_dir:q} "
        "--uri {params.uri:q} --experiment {params.experiment:q} {params.datasets} "
        "--campaign-file {input.campaign_file:q} "
        "--artifact-dir {params.artifact_dir:q} --marker {output:q} 2> {log:q}"


rule track_report:
    """Attach the report to the campaign's MLflow run, once both are there."""
    input:
        report=rules.report.output.html,
        tracked=rules.track.output,
    output:
        str(LAYOUT.tracking_report_marker),
    log:
        str(LAYOUT.log("track_report")),
    conda:
        "../envs/ldpbench.yaml"
    params:
        uri=config["tracking"]["uri"],
        experiment=tracking_experiment(),
        report_dir=lambda wildcards, input: parent_dir(input.report),
    shell:
        "LDPBENCH_JOB=1 python -P -m ldpbench track-report --report-dir {params.report_dir:q} "
        "--uri {params.uri:q} --experiment {params.experiment:q} --tracking-marker {input.tracked:q} "
        "--marker {output:q} 2> {log:q}"
