# Every claim checked: the black-box privacy audit (ldpbench.audit) of every private (mechanism,
# parameters, ε) the campaign ran, one job each, started as soon as its cells are done so that it
# runs beside the others; and the reproduction scorecard of the papers' claims (ldpbench.scorecard).
localrules:
    audit_table,
    scorecard,


rule audit:
    """An empirical lower bound on ε of one report of one (mechanism, parameters, ε), from what its cells ran."""
    input:
        cells=audit_cells,
    output:
        str(LAYOUT.audit("{audit_id}")),
    log:
        str(LAYOUT.log("audit/{audit_id}")),
    # Ahead of waiting cells (an audit left to the end would lengthen the campaign's tail), behind
    # the tail's own jobs (aggregate, compare: priority 20).
    priority: 10
    conda:
        "../envs/ldpbench.yaml"
    threads: 1
    resources:
        mem_mb=4000,
    params:
        flags=audit_flags(),
    shell:
        "python -P -m ldpbench audit --cells {input.cells:q} --out {output:q} --threads {threads} "
        "{params.flags} > {log:q} 2>&1"


rule audit_table:
    """tables/audit.parquet: the audits of the campaign, one row per (mechanism, parameters, ε of one report)."""
    input:
        audit_parts,
    output:
        str(LAYOUT.table("audit")),
    log:
        str(LAYOUT.log("audit_table")),
    run:
        merge_audit_tables(input, output[0])


rule scorecard:
    """The papers' claims the campaign covers (config/paper_claims/), read against its tables."""
    input:
        tables=rules.aggregate.output,
        comparisons=rules.compare.output,
        claims=config["scorecard"]["claims"],
    output:
        str(LAYOUT.table("scorecard")),
    log:
        str(LAYOUT.log("scorecard")),
    conda:
        "../envs/ldpbench.yaml"
    params:
        tables_dir=lambda wildcards, output: parent_dir(output[0]),
    shell:
        "python -P -m ldpbench scorecard --tables-dir {params.tables_dir:q} --claims {input.claims:q} "
        "--out {output:q} 2> {log:q}"
