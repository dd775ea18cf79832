import sys

from ldpbench.worker import delegate

# Under a local Snakemake, the campaign's warm worker runs the command (ldpbench/worker.py).
status = delegate(sys.argv[1:])
if status is None:
    from ldpbench.cli import main

    status = main()
raise SystemExit(status)
