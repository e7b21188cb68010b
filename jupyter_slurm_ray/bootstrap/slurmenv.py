"""The environment of the Slurm commands the package runs: without another job's variables.

sbatch, srun, salloc, squeue, scontrol, sacct, scancel, sinfo and sacctmgr take options from
their environment (their man pages' "INPUT ENVIRONMENT VARIABLES"), and sbatch copies every
``SLURM_*`` variable of its environment into the job, whatever ``--export`` says. A kernel
that runs inside a Slurm job (JupyterHub's batchspawner, Open OnDemand) has that job's
variables: its memory per node, CPUs per task, CPU binding, job id… Passed on, they change the
cluster's request, leak into its job and break its steps (``srun: fatal: SLURM_MEM_PER_CPU,
SLURM_MEM_PER_GPU, and SLURM_MEM_PER_NODE are mutually exclusive``). So:

- *outside a job of ours* (the kernel's side, the login node's shell over SSH): every Slurm
  variable is removed but ``SLURM_CONF``, which says which Slurm, not what to ask for;
- *inside the cluster's own job* (the bootstrap's ``srun`` step, ``scontrol``, ``scancel``):
  the job's own ``SLURM_*`` are what ``srun --overlap`` needs (``SLURM_JOB_ID``, …), so only
  the input variables Slurm never sets in a batch job are removed: they came from outside (a
  site profile, a module, a setup line). The Ray processes of the head keep them; those of
  the workers, started by that step, do not.

Standard library only: shipped in the job dir with the bootstrap, imported by the package too.
The lists are the man pages of Slurm 22.05, 24.11 and 26.05 (tests/resources/slurm-output/;
checked against them by a fast test): an input variable any of them sets for a batch job is
the job's own in every release.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = [
    "FOREIGN_IN_A_JOB",
    "INPUT_NAMES",
    "INPUT_PREFIXES",
    "KEPT",
    "command_environment",
    "is_slurm_input",
    "is_slurm_variable",
    "own_job_environment",
]

#: Families of input variables, each named after its command; SLURM_* are read by all.
INPUT_PREFIXES = (
    "SLURM_",
    "SBATCH_",
    "SALLOC_",
    "SRUN_",
    "SQUEUE_",
    "SINFO_",
    "SACCT_",
    "SCANCEL_",
    "SCONTROL_",
)
#: Input variables outside those families (srun's).
INPUT_NAMES = frozenset({"PMI_FANOUT", "PMI_FANOUT_OFF_HOST", "PMI_TIME", "SLURMD_DEBUG"})
#: Which Slurm, not what to ask for: kept everywhere.
KEPT = frozenset({"SLURM_CONF"})
#: The SLURM_* input variables that Slurm never sets in a batch job's environment (the others,
#: such as SLURM_JOB_ID or SLURM_MEM_PER_NODE, are listed by sbatch's man page as the job's
#: own "OUTPUT ENVIRONMENT VARIABLES", in 22.05, 24.11 or 26.05): inside the cluster's job they
#: came from outside: SLURM_JSON and SLURM_YAML (26.05: how --json/--yaml output is laid out),
#: SLURM_TRES_BIND (24.11: binds a step's tasks). SLURM_NETWORK is a 26.05 job's own.
FOREIGN_IN_A_JOB = frozenset(
    {
        "SLURM_ACCOUNT", "SLURM_ACCTG_FREQ", "SLURM_BCAST", "SLURM_BCAST_EXCLUDE",
        "SLURM_BITSTR_LEN", "SLURM_BURST_BUFFER", "SLURM_CLUSTERS", "SLURM_COMPRESS",
        "SLURM_CONF_OUT", "SLURM_CONSTRAINT", "SLURM_CORE_SPEC", "SLURM_CPU_BIND",
        "SLURM_CPU_FREQ_REQ", "SLURM_DEBUG", "SLURM_DEBUG_FLAGS", "SLURM_DELAY_BOOT",
        "SLURM_DEPENDENCY", "SLURM_DISABLE_STATUS", "SLURM_EPILOG", "SLURM_EXACT",
        "SLURM_EXCLUSIVE", "SLURM_EXIT_ERROR", "SLURM_EXIT_IMMEDIATE", "SLURM_GRES",
        "SLURM_GRES_FLAGS", "SLURM_HINT", "SLURM_IMMEDIATE", "SLURM_JSON", "SLURM_KILL_BAD_EXIT",
        "SLURM_LABELIO", "SLURM_MEM_BIND", "SLURM_MPI_TYPE", "SLURM_NO_KILL",
        "SLURM_OPEN_MODE", "SLURM_OVERLAP", "SLURM_PARTITION", "SLURM_PMI_KVS_NO_DUP_KEYS",
        "SLURM_POWER", "SLURM_PROLOG", "SLURM_QOS", "SLURM_REMOTE_CWD", "SLURM_REQ_SWITCH",
        "SLURM_RESERVATION", "SLURM_RESV_PORTS", "SLURM_SEND_LIBS", "SLURM_SIGNAL",
        "SLURM_SPREAD_JOB", "SLURM_SRUN_REDUCE_TASK_EXIT_MSG", "SLURM_STDERRMODE",
        "SLURM_STDINMODE", "SLURM_STDOUTMODE", "SLURM_STEP_GRES",
        "SLURM_STEP_KILLED_MSG_NODE_ID", "SLURM_TASK_EPILOG", "SLURM_TASK_PROLOG",
        "SLURM_TEST_EXEC", "SLURM_THREADS", "SLURM_THREAD_SPEC", "SLURM_TIMELIMIT",
        "SLURM_TIME_FORMAT", "SLURM_TOPO_LEN", "SLURM_TRES_BIND", "SLURM_UMASK",
        "SLURM_UNBUFFEREDIO",
        "SLURM_USE_MIN_NODES", "SLURM_WAIT", "SLURM_WAIT4SWITCH", "SLURM_WCKEY",
        "SLURM_WORKING_DIR", "SLURM_YAML",
    }
)  # fmt: skip


def is_slurm_variable(name: str) -> bool:
    """True for a variable Slurm's commands may read: a family's prefix or a listed name."""
    return name.startswith(INPUT_PREFIXES) or name in INPUT_NAMES


def is_slurm_input(name: str, *, in_own_job: bool) -> bool:
    """True for a variable removed from the environment of Slurm's commands (see the module)."""
    if name in KEPT or not is_slurm_variable(name):
        return False
    if in_own_job and name.startswith("SLURM_"):
        return name in FOREIGN_IN_A_JOB
    return True


def command_environment(environ: Mapping[str, str], *, in_own_job: bool) -> dict[str, str]:
    """``environ`` without the Slurm variables that must not reach a Slurm command run from
    there: ``in_own_job`` inside the cluster's own job, else outside any job of ours."""
    return {
        name: value
        for name, value in environ.items()
        if not is_slurm_input(name, in_own_job=in_own_job)
    }


def own_job_environment() -> dict[str, str]:
    """This process's environment for a Slurm command run inside the cluster's own job."""
    return command_environment(os.environ, in_own_job=True)
