"""A Slurm job script's ``#SBATCH`` lines: a ``JobRequest`` in sbatch's words
(``SlurmClient.header``; local mode and the ``--here`` steps read the same lines)."""

from __future__ import annotations

import shlex

from ..scheduler.kind import JobRequest

__all__ = ["sbatch_directives", "sbatch_header"]


def sbatch_header(request: JobRequest) -> list[str]:
    return [f"#SBATCH {directive}" for directive in sbatch_directives(request)]


def sbatch_directives(request: JobRequest) -> list[str]:
    """The options of the #SBATCH lines, in order, each one shell-quoted word `--name=value`."""
    job_dir = request.job_dir
    options = [
        ("--job-name", request.name),
        ("--comment", request.tag),
        ("--nodes", str(request.nodes)),
        ("--ntasks-per-node", "1"),
        *_resource_options(request),
        ("--chdir", job_dir),
        ("--output", f"{job_dir}/slurm-%j.out"),
        ("--error", f"{job_dir}/slurm-%j.err"),
        # B: signals only the batch shell, which `exec` turns into the bootstrap.
        ("--signal", f"B:USR1@{request.walltime_warning}"),
        # A requeued job would start a second Ray cluster the kernel is not connected to.
        ("--no-requeue", None),
        # The submitting environment's variables by name: an allow-list (PATH, HOME, LANG, the
        # module systems' state, which the setup lines build on, and export_env):
        # spec/environment.py.
        ("--export", ",".join(request.exported) or "NONE"),
    ]
    return [_directive(name, value) for name, value in options] + [
        _extra_directive(entry) for entry in request.extra
    ]


def _resource_options(request: JobRequest) -> list[tuple[str, str | None]]:
    """The time and the resource options the request sets (the others are left out); None is
    a flag."""
    mem = request.mem_per_node
    candidates: list[tuple[str, object]] = [
        ("--cpus-per-task", request.cpus_per_node),
        ("--time", request.time),
        ("--partition", request.partition),
        ("--account", request.account),
        ("--qos", request.qos),
        ("--constraint", request.constraint),
        ("--reservation", request.reservation),
        ("--mem", None if mem is None else f"{mem}M"),
        ("--gpus-per-node", request.gpus_per_node or None),
    ]
    present: list[tuple[str, str | None]] = [
        (name, str(value)) for name, value in candidates if value is not None
    ]
    return present + ([("--exclusive", None)] if request.exclusive else [])


def _directive(name: str, value: str | None) -> str:
    return name if value is None else f"{name}={shlex.quote(value)}"


def _extra_directive(entry: str) -> str:
    name, equals, value = entry.partition("=")
    return _directive(name, value if equals else None)
