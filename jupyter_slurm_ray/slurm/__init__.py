"""Slurm: its command lines and their output, the shared queue and job watching, the local and
in-allocation schedulers, accounting, usage, limits, queue insight, site checks and walltime."""
