#!/usr/bin/env bash
# Runs once, in the new conda environment of workflow/envs/ldpbench.yaml (Python and pip alone):
# installs ldpbench and every dependency pyproject.toml lists from the checkout the workflow runs
# from, whose path workflow/rules/common.smk exports as LDPBENCH_SOURCE.
set -euo pipefail
python -m pip install --no-input -e "${LDPBENCH_SOURCE:?LDPBENCH_SOURCE is not set (workflow/rules/common.smk sets it)}"
