"""What the package asks of the system that runs a cluster's jobs: :class:`Scheduler`.

Its implementations are siblings, none a kind of another: Slurm's command lines
(``slurm/client.py``), local mode's processes of this machine (``slurm/localjobs.py``), and the
steps of a kernel's own allocation (``slurm/heresteps.py``, which runs its other jobs through
Slurm's). The contract each keeps is tested once for all of them
(``tests/fast/test_scheduler_conformance.py``): ``submit`` gives an id that ``query`` answers
for; a job that ends is final with its exit status; ``cancel`` ends a job as CANCELLED; an id
a scheduler does not know is left out of its answers.

What a system does not have is answered as the defaults below do: no partitions, no node
reasons, no tagged jobs, no memory policy; accounting, usage and a longer walltime refused in
words that name the system.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar, TypeVar

from ..errors import ExtendRefused, SlurmError, SlurmUnavailable
from ..transport import CommandResult, Transport
from .kind import SchedulerKind
from .records import Association, JobInfo, Partition, Qos, UsageRow

__all__ = ["RequestT", "Scheduler"]

#: what a cluster asks of a scheduler (a ``ClusterSpec``, which this interface stands under)
RequestT = TypeVar("RequestT")


class Scheduler(SchedulerKind, ABC):
    """Submits, watches and cancels one kind of job through a Transport (where its commands
    run). Queries answer for every job asked about that the system knows, or raise
    ``SlurmUnavailable`` when the system could not be asked. What the kind is, without a
    transport (its mode, its words, what it decides of a request): ``kind.py``."""

    @classmethod
    def create(
        cls, transport: Transport, *, timeout: float = 30.0, shared: Any = None
    ) -> Scheduler:
        """A scheduler of this kind on ``transport``. ``shared``: the user's queue shared with
        their other processes on this host, for the kinds that read one."""
        return cls(transport, timeout=timeout)

    def __init__(self, transport: Transport, *, timeout: float = 30.0) -> None:
        self.transport = transport
        self.timeout = timeout
        self.commands_run = 0  # the commands it ran, so tests can hold it to "one per poll"

    # -- what every scheduler does ----------------------------------------------------------
    @abstractmethod
    async def submit(self, script: str, *, timeout: float = 60.0) -> str:
        """Start a job script (its text, ``#!…``; or a path): the job's id."""

    @abstractmethod
    async def cancel(
        self, job_id: str, *, signal: str | None = None, batch_only: bool = False
    ) -> None:
        """End a job (or only signal it, or its batch step only, where the system can)."""

    @abstractmethod
    async def query(self, job_ids: Iterable[str], *, max_age: float = 0.0) -> dict[str, JobInfo]:
        """The state of each job of ``job_ids`` the system knows (an answer up to ``max_age``
        seconds old may be shared with the user's other processes)."""

    async def history(
        self, job_ids: Sequence[str], *, remembered: Sequence[str] | None = None
    ) -> dict[str, JobInfo]:
        """The final state of ended jobs (``remembered``: those the system is known to keep)."""
        return await self.query(job_ids)

    def unreachable(self, silence: SlurmUnavailable) -> SlurmUnavailable:
        """What the user is told when the system did not answer (and what to do)."""
        return silence

    async def for_request(self, request: RequestT) -> tuple[RequestT, Scheduler]:
        """The request (a ``ClusterSpec``) as it will run, and the scheduler that submits it:
        most take it as it is and submit it themselves; the ``--here`` steps plan it in the
        kernel's allocation first (SpecError naming the setting that does not fit)."""
        return request, self

    # -- what only some systems have --------------------------------------------------------
    async def partitions(self) -> list[Partition]:
        return []

    async def memory_settings(self) -> tuple[str, str]:
        """The system's memory policy, as ``slurm/memorypolicy.py`` reads it ("": none)."""
        return "", ""

    async def associations(self) -> list[Association]:
        raise SlurmError(f"{self.system} has no Slurm accounting")

    async def qos(self) -> dict[str, Qos]:
        raise SlurmError(f"{self.system} has no Slurm accounting")

    async def usage(self, job_ids: Sequence[str]) -> list[UsageRow]:
        raise SlurmError(f"{self.system} has no Slurm accounting")

    async def extend(self, job_id: str, minutes: int) -> None:
        raise ExtendRefused(f"{self.system} cannot extend a running job's walltime")

    #: the command ``run_on_nodes`` runs, as a message names it ("": none)
    node_runner: ClassVar[str] = ""

    async def run_on_nodes(
        self,
        job_id: str,
        argv: Sequence[str],
        *,
        nodes: int,
        hosts: str | None = None,
        timeout: float = 30.0,
    ) -> CommandResult:
        """Run ``argv`` once on each of ``nodes`` nodes of the running job ``job_id`` (or on
        ``hosts`` of them, a host list), beside the job's own work; each run finds its node's
        name in ``JSR_NODE``. The command's result, whatever its exit status; SlurmUnavailable
        when it did not run."""
        raise SlurmError(f"{self.system} cannot run a command on a job's nodes")

    async def node_reasons(self, nodes: Sequence[str]) -> dict[str, str]:
        """Why each of ``nodes`` that is down, drained or failing is so."""
        return {}

    async def tagged_jobs(self) -> dict[str, str]:
        """This user's active jobs that carry a cluster's tag: job id -> cluster id."""
        return {}

    async def tagged_worker_jobs(self) -> dict[str, str]:
        """This user's active worker jobs: job id -> the cluster id of their tag."""
        return {}

    async def work_dirs(self) -> dict[str, str]:
        """This user's active jobs' working directories: job id -> directory."""
        return {}

    async def find_tagged(self, cluster_id: str) -> str | None:
        """The newest active job tagged for ``cluster_id``, if any."""
        return None
