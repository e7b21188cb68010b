"""The scheduler interface: what the package asks of the system that runs a cluster's jobs
(``interface.py``), and what any scheduler says of its jobs and its site (``records.py``). The
implementations live with their system (Slurm's and the ``--here`` steps in ``slurm/``, local
mode's processes too)."""
