"""The options of a Slurm job the package writes itself, or refuses, as a request's extra
options (``ClusterSpec.extra_sbatch``) would give them: what ``SlurmClient.option_refusal``
answers, each with what to use instead."""

from __future__ import annotations

__all__ = ["option_refusal"]

# Options this package writes itself, with what to use instead. sbatch (getopt_long) also
# accepts any unambiguous abbreviation, so a prefix of one of these is refused too.
SBATCH_OWN = {
    "--job-name": "use the name setting",
    "--comment": "it marks the job as this package's",
    "--nodes": "use the nodes setting",
    "--ntasks-per-node": "the bootstrap runs one task per node",
    "--cpus-per-task": "use the cpus_per_node setting",
    "--time": "use the time setting",
    "--partition": "use the partition setting",
    "--account": "use the account setting",
    "--qos": "use the qos setting",
    "--constraint": "use the constraint setting",
    "--reservation": "use the reservation setting",
    "--mem": "use the mem_per_node setting",
    "--gpus-per-node": "use the gpus_per_node setting",
    "--exclusive": "use the exclusive setting",
    "--chdir": "the job runs in its job dir, where the bootstrap and its files are",
    "--output": (
        "the job writes slurm-<job>.out in its own job dir (%slurm_ray logs shows it); "
        "no other place is allowed: it could be another user's"
    ),
    "--error": (
        "the job writes slurm-<job>.err in its own job dir (%slurm_ray logs shows it); "
        "no other place is allowed: it could be another user's"
    ),
    "--signal": "use the walltime_warning setting (the bootstrap's warning and clean stop)",
    "--export": (
        "the job's environment is an allow-list (script() shows it): name more variables "
        "in export_env, or set them with env"
    ),
    "--wrap": "the job script is generated",
    "--parsable": "the package reads sbatch's output itself",
}
SBATCH_REFUSED = {
    "--ntasks": "the bootstrap runs one task per node",
    "--tasks": "the bootstrap runs one task per node",
    "--gpus": "use the gpus_per_node setting",
    "--workdir": "the job runs in its job directory",
    "--array": "one cluster is one job, not an array",
    "--wait": "sbatch must return once the job is queued",
    "--test-only": "the job must really be submitted",
    "--help": "sbatch would not submit the job",
    "--usage": "sbatch would not submit the job",
    "--version": "sbatch would not submit the job",
    "--quiet": "sbatch would not print the job's id, which the package reads",
    "--requeue": (
        "a requeued job would start a second Ray cluster the kernel is not connected to "
        "(the cluster's jobs are --no-requeue)"
    ),
    "--export-file": (
        "the job's environment is an allow-list: name variables in export_env, or set them with env"
    ),
    "--get-user-env": (
        "it would load your whole login environment into the job: name variables in "
        "export_env, or set them with env"
    ),
    "--uid": "the job runs as you",
    "--gid": "the job runs with your groups",
    "--clusters": "the package follows its jobs on this cluster only (squeue, scancel)",
    "--cluster": "the package follows its jobs on this cluster only (squeue, scancel)",
    "--container": (
        "Slurm's OCI container would run the bootstrap in it; use the container setting "
        "(Ray in the image, the bootstrap on the node)"
    ),
}


def option_refusal(name: str) -> str | None:
    """Why the long option ``name`` may not be given (None: it may)."""
    if name in SBATCH_OWN:
        return f"{name} is set by jupyter_slurm_ray: {SBATCH_OWN[name]}"
    if name in SBATCH_REFUSED:
        return f"{name} is refused: {SBATCH_REFUSED[name]}"
    for option, reason in SBATCH_OWN.items():
        if option.startswith(name):
            return f"{name} abbreviates {option}, which is set by jupyter_slurm_ray: {reason}"
    for option, reason in SBATCH_REFUSED.items():
        if option.startswith(name):
            return f"{name} abbreviates {option}, which is refused: {reason}"
    return None
