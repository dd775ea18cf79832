import sys

from ldpbench.launch.client import delegate

# Under a local Snakemake, the campaign's fork server runs the command (ldpbench/launch/).
status = delegate(sys.argv[1:])
if status is None:
    from ldpbench.cli import main

    status = main()
raise SystemExit(status)
