"""The exceptions jupyter_slurm_ray raises: few, precise, each carrying what the user needs."""

from __future__ import annotations


class SlurmRayError(Exception):
    """Base class of every error this package raises on purpose."""


class SpecError(SlurmRayError, ValueError):
    """A cluster specification field has a value that is not allowed.

    The message names the field, the value given and what is allowed.
    """

    def __init__(self, field: str, value: object, allowed: str) -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(f"{field}: {value!r} is not allowed; {allowed}")


class LimitError(SpecError):
    """The request is over a limit Slurm enforces (a QOS, an association, a partition).

    The message names the limit the way Slurm does, e.g. ``qos: 'short' allows at most 1 node
    per job (MaxTRESPerJob=node=1); you asked for 2``.
    """

    def __init__(self, field: str, value: object, message: str) -> None:
        super().__init__(field, value, message)
        self.args = (f"{field}: {message}",)


class TransportError(SlurmRayError):
    """Running a command or moving a file on the cluster side failed (SSH, subprocess)."""


class CommandError(TransportError):
    """A command ran but exited with a non-zero status."""

    def __init__(self, argv: list[str], returncode: int, stdout: str, stderr: str) -> None:
        self.argv = argv
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        detail = (stderr or stdout).strip() or "(no output)"
        super().__init__(f"{argv[0]} exited with status {returncode}: {detail}")


class SlurmError(SlurmRayError):
    """Slurm refused or failed a request; the message is Slurm's own."""


class SlurmUnavailable(SlurmError):
    """Slurm gave no answer (controller down, restarting, paused or overloaded; login node
    unreachable): nothing can be concluded about any job from it."""


class ExtendRefused(SlurmError):
    """Slurm refused to change a job's time limit; the message is Slurm's, then what to do."""


class UnknownTarget(SlurmRayError):
    """A record names a place to run Slurm commands that this process is not configured for.

    Records are data: a transport is only ever built from this process's own configuration.
    """


class RegistryError(SlurmRayError):
    """The registry directory or a record in it cannot be trusted or read."""


class RayStartError(SlurmRayError):
    """Ray could not be started in the allocation; carries the relevant log lines."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        self.log_tail = log_tail
        super().__init__(message + (f"\n--- log tail ---\n{log_tail}" if log_tail else ""))


class ConnectError(SlurmRayError):
    """The notebook could not connect to the Ray cluster (versions, token, network)."""


class ClusterTimeout(SlurmRayError, TimeoutError):
    """The cluster did not get through the queue, or Ray did not start, in the allowed time."""


class NotFound(SlurmRayError):
    """No cluster of that name or id in the registry (the API and the proxy answer 404)."""


class Conflict(SlurmRayError):
    """The request does not fit the cluster's state (e.g. forgetting an active cluster)."""


class SubmitOutcomeUnknown(SlurmRayError):
    """sbatch gave no answer and Slurm could not be asked whether the job exists."""


class DashboardUnavailable(SlurmRayError):
    """The cluster exists but its dashboard cannot be reached now (the proxy answers 503)."""


class ArgumentError(SlurmRayError):
    """The magic's line is not valid; the message is one line for the user."""


class HelpRequested(Exception):
    """``--help`` was given; the message is the help text."""


class NoClusterError(SlurmRayError, RuntimeError):
    """``ray.init()``, or a Ray call that would start Ray (a task's ``.remote()``, Ray Data),
    in a kernel with no cluster connected: ``%slurm_ray up`` first (``SlurmRay.allow_local_ray``
    lets Ray start on this host instead)."""

    def _render_traceback_(self) -> list[str]:  # IPython shows this line, not a traceback
        return [f"{type(self).__name__}: {self}"]
