"""Helpers shared by the tests, one name for one thing.

For the fast tier: ``fakeslurm`` (a scripted Slurm behind a real local transport) and
``jp_fixtures`` (pytest-jupyter's ``jp_fetch`` on pytest-asyncio's loop).
For the real tier: ``testbed`` (its users, ``runuser``, SSH logins), ``jobs`` (submitting, and
asking Slurm about a job), ``clusters`` (test clusters, their processes, Ray Client in a
subprocess), ``site`` (profiles and JUPYTER_SLURM_RAY_* settings), ``server`` (a Jupyter server
subprocess), ``bootstrap`` (job dirs for the bootstrap tests), ``faults`` (faults injected into
the testbed), ``kernel`` (a stand-in kernel to kill). ``laptop_session`` and ``laptop_drop``
are programs run as ``python -m tests.helpers.NAME`` in the laptop's network namespace.
Both tiers: ``paths`` (the checkout, the venv, artifacts) and ``waiting`` (bounded waits).
"""
