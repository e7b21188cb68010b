"""What a cluster knows of its elastic part (``cluster.elastic``: ``scaling.Elastic``, its worker
jobs and its adapt loop): named here, in low-level types, so the cluster never imports it.

The cluster is handed its elastic part from above: ``SlurmRayCluster(elastic=…)`` makes it with
the maker it is given, else with the one the package sets when it is imported (``__init__.py``
sets ``scaling.Elastic``, as it sets ``display.py``'s hooks), so a cluster made anywhere (a
kernel's session, the server, a script, a test) has one. ``host.py`` names the other way: what
the elastic part reads of its cluster.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..scheduler.interface import Scheduler
    from ..slurm.watch import JobWatcher
    from ..states import Status, WorkerJobStatus
    from .host import ClusterHost
    from .policy import AdaptSettings
    from .workerjob import WorkerJob


class ElasticWorkers(Protocol):
    """The worker jobs, as the cluster follows, shows, records and cancels them
    (``workerjobs.WorkerJobs``)."""

    @property
    def jobs(self) -> Mapping[str, WorkerJob]: ...

    @property
    def wanted(self) -> int:
        """Worker jobs that count toward the nodes wanted."""

    def views(self) -> tuple[WorkerJobStatus, ...]: ...
    def to_record(self) -> list[dict[str, Any]]: ...
    def load_record(self, items: Iterable[Any]) -> None: ...
    def follow(self, watcher: JobWatcher, on_change: Callable[[], None], pace: float) -> None: ...
    def unfollow(self, watcher: JobWatcher) -> None: ...
    def set_paces(self, watcher: JobWatcher, fast: float, steady: float) -> None: ...
    def in_transition(self) -> bool: ...
    def draining(self) -> list[str]: ...
    async def cancel_all(self) -> None: ...


class AdaptLoop(Protocol):
    """The running adaptive loop as a cluster shows it (``adapt.Adapter``)."""

    @property
    def settings(self) -> AdaptSettings: ...

    @property
    def decisions(self) -> Sequence[str]:
        """Its last decisions, newest last."""

    @property
    def error(self) -> str | None:
        """Why its last step failed, while it does."""


class ElasticPart(Protocol):
    """What the cluster calls on its elastic part."""

    @property
    def workers(self) -> ElasticWorkers: ...

    @property
    def adapting(self) -> AdaptLoop | None: ...

    def own(self) -> None:
        """This process owns the cluster from now."""

    def displaced(self) -> None:
        """Another process took the cluster over."""

    def note_new_events(self) -> None:
        """The cluster read new events (its worker jobs', other processes' requests)."""

    def stop_rotating(self) -> None: ...
    def scaling_lines(self) -> tuple[str, ...]: ...
    def adapting_settings(self) -> dict[str, Any] | None: ...
    async def scale(
        self,
        nodes: int,
        *,
        group: str | None = ...,
        drain_timeout: float = ...,
        cause: str = ...,
        wait: bool = ...,
    ) -> Status: ...
    async def request_scale(self, nodes: int, group: str | None = ...) -> None: ...
    async def adapt(
        self,
        minimum: int | bool | None = ...,
        maximum: int | None = ...,
        *,
        idle_timeout: float | None = ...,
        max_pending: int | None = ...,
        group: str | None = ...,
        interval: float = ...,
    ) -> AdaptSettings | None: ...
    async def request_adapt(
        self,
        minimum: int | None = ...,
        maximum: int | None = ...,
        *,
        off: bool = ...,
        idle_timeout: float | None = ...,
        max_pending: int | None = ...,
    ) -> AdaptSettings | None: ...
    async def stop_adapting(self) -> None: ...
    async def scale_or_ask(
        self, nodes: int, group: str | None = ..., *, wait: bool = ...
    ) -> bool: ...
    async def adapt_or_ask(
        self,
        minimum: int | None = ...,
        maximum: int | None = ...,
        *,
        off: bool = ...,
        idle_timeout: float | None = ...,
        max_pending: int | None = ...,
        group: str | None = ...,
    ) -> tuple[AdaptSettings | None, bool]: ...


class MakeElastic(Protocol):
    """Makes a cluster's elastic part: for ``host`` (the cluster), whose jobs ``slurm``
    schedules, calling ``on_change`` when what it shows changed."""

    def __call__(
        self, host: ClusterHost, slurm: Scheduler, on_change: Callable[[], None]
    ) -> ElasticPart: ...
