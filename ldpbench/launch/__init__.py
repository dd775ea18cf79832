"""How a job's process starts and ends.

- fork_server: the warm process of a local campaign (`ldpbench worker`) that forks each job's command;
- client: `python -m ldpbench` hands its command to that server, or runs it itself;
- parent_watch: a run ends when its Snakemake or its job's shell wrapper ends;
- parent_death: Linux's parent-death signal, which the client asks for too;
- processes: processes told apart by pid and start time, read from /proc.

Nothing here imports the CLI (the fork server is handed its `run`), and the client's path imports only
the standard library: every job pays for it.
"""
