# Every claim checked: the black-box privacy audit (ldpbench.audit) of every private (mechanism,
# parameters, ε of one report) the campaign's final runs ran, each computed once by the first final cell
# that ran it (beside the other cells) and gathered here; and the reproduction scorecard of the papers'
# claims (ldpbench.scorecard). Both run on the submit host: they gather what the cells' jobs wrote.
localrules:
    audit_table,
    scorecard,


rule audit_table:
    """tables/audit.parquet: the audits of what the final cells ran, at the campaign's audit settings
    (computed here where no cell computed them: settings changed since, or a cell's job was stopped)."""
    input:
        cells=final_cell_markers(),
    output:
        str(LAYOUT.table("audit")),
    log:
        str(LAYOUT.log("audit_table")),
    # Ahead of waiting cells, behind the tail's own jobs (aggregate, compare: priority 20).
    priority: 10
    conda:
        "../envs/ldpbench.yaml"
    threads: 1
    params:
        audits=str(LAYOUT.audits_dir),
        flags=audit_flags(),
    shell:
        "LDPBENCH_JOB=1 python -P -m ldpbench audit-table --cells {input.cells:q} --audits {params.audits:q} --out {output:q} "
        "{params.flags} > {log:q} 2>&1"


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
        "LDPBENCH_JOB=1 python -P -m ldpbench scorecard --tables-dir {params.tables_dir:q} --claims {input.claims:q} "
        "--out {output:q} 2> {log:q}"
