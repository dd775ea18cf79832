# ldpbench: benchmark campaigns for LDP mechanisms in federated learning.
# Thin entry point; all workflow Python lives in workflow/rules/common.smk.
from snakemake.utils import min_version

min_version("9.27.1")


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/features.smk"
include: "workflow/rules/runs.smk"
include: "workflow/rules/tuning.smk"
include: "workflow/rules/results.smk"
include: "workflow/rules/audit.smk"


rule all:
    default_target: True
    input:
        final_targets(),


onstart:
    campaign_starts(log)


onsuccess:
    campaign_ends(True, log)


onerror:
    campaign_ends(False, log)
