"""What a kind of scheduler is, before any transport: :class:`SchedulerKind`, the class-level
facts every scheduler (``interface.py``) declares. The spec, the panel and the elastic part ask
these of the kind their mode names (``kinds.py``) and never which kind it is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

__all__ = ["EnclosingJob", "JobRequest", "SchedulerKind"]


@dataclass(frozen=True)
class EnclosingJob:
    """The job a process runs in (a kernel started in an allocation), as its environment says."""

    job_id: str
    nodes: int


@dataclass(frozen=True)
class JobRequest:
    """What a cluster's job asks of its scheduler, in no scheduler's words (checked already):
    the header of its job script says it in the scheduler's own (``SchedulerKind.header``)."""

    name: str
    tag: str  # the job's comment, by which the package finds it again
    nodes: int
    job_dir: str  # where it runs; its output and error files go there
    walltime_warning: int  # seconds before its end the batch shell is sent USR1
    exported: tuple[str, ...] = ()  # the submitting environment's variables it gets, by name
    time: str | None = None
    cpus_per_node: int | None = None
    mem_per_node: int | None = None  # MiB
    gpus_per_node: int = 0
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    reservation: str | None = None
    exclusive: bool = False
    extra: tuple[str, ...] = ()  # more of the scheduler's own options (--name or --name=value)


class SchedulerKind:
    """A kind of scheduler as the rest of the package knows it: its mode, its words, the ids it
    owns, what it decides of a request, and how far its clusters can grow."""

    #: the kind of job, as ``JobInfo.source`` names it
    source: ClassVar[str]
    #: the system in a sentence's words ("Slurm", "local mode", "--here")
    system: ClassVar[str]
    #: the ``ClusterSpec.mode`` that picks it for a new cluster (its entry point's name,
    #: ``scheduler/kinds.py``)
    mode: ClassVar[str]
    #: the modes whose jobs it answers for as well (a --here cluster's knows Slurm's jobs: its
    #: worker jobs, its allocation), in the same command
    also_answers: ClassVar[frozenset[str]] = frozenset()
    #: its jobs are processes of the machine that starts them (local mode): they run where the
    #: kernel does whatever transport is configured, and share its environment as it is
    on_this_machine: ClassVar[bool] = False
    #: its clusters run in the allocation the kernel runs in: their size and walltime are that
    #: allocation's (none is requested)
    in_allocation: ClassVar[bool] = False
    #: the request's settings it decides itself, each with why: ``resolve`` leaves them out of
    #: the configuration and says so; a spec asking for one is refused (``refusal``)
    decided: ClassVar[Mapping[str, str]] = {}

    @classmethod
    def refusal(cls, name: str, value: object, settings: Mapping[str, object]) -> str | None:
        """What is allowed for the setting ``name`` it decides, when ``value`` asks for what it
        does not give (None: ``value`` may stand). ``settings``: the spec's others."""
        return None

    @classmethod
    def header(cls, request: JobRequest) -> list[str]:
        """The job script's first lines after ``#!``: ``request`` in this system's words."""
        raise NotImplementedError(f"{cls.__name__} writes no job script header")

    @classmethod
    def option_refusal(cls, name: str) -> str | None:
        """Why its job may not be given the extra long option ``name`` (``extra_sbatch``'s;
        None: it may): an option the package writes itself, or one that breaks its job."""
        return None

    @classmethod
    def owns(cls, job_id: str) -> bool:
        """Whether ``job_id`` has the form of this system's job ids."""
        return False

    @classmethod
    def enclosing(cls, environ: Mapping[str, str]) -> EnclosingJob | None:
        """The job of this kind that a process with ``environ`` runs in (None: none)."""
        return None

    @classmethod
    def fixed_size(cls, least: int) -> str | None:
        """What a cluster of this kind may be scaled to, in words, when only ``least`` nodes
        (its own): None when worker jobs can be added."""
        return None

    @classmethod
    def no_usage(cls, job_ids: Sequence[str]) -> str:
        """Why the system's accounting has no usage for these jobs of a cluster ("": it has)."""
        return ""
