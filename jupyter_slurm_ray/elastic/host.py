"""What a cluster's elastic part reads of the cluster that holds it (``cluster.SlurmRayCluster``):
named here, so the elastic part never imports the cluster."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..job.directory import JobDir
    from ..registry import Registry
    from ..spec import ClusterSpec
    from ..states import Status
    from ..transport import Transport


class ClusterHost(Protocol):
    id: str
    spec: ClusterSpec
    transport: Transport
    registry: Registry
    poll_interval: float

    @property
    def status(self) -> Status: ...

    @property
    def owned_here(self) -> bool: ...

    @property
    def stopping(self) -> bool:
        """``down`` began: no change of worker jobs starts any more."""

    @property
    def head_ready(self) -> bool:
        """The head answers (its event), before Slurm's answer says RUNNING."""

    @property
    def events(self) -> list[dict[str, Any]]: ...

    def job_directory(self) -> JobDir: ...

    def poll_soon(self) -> None:
        """Ask Slurm about the cluster's jobs at once (the transport's watcher's next query)."""

    def adapt_defaults(self) -> Mapping[str, float]:
        """adapt's settings where a request leaves them out (``config.adapt_defaults``)."""

    def require_owner(self, what: str) -> None:
        """Refused (naming the owner) unless this process owns the cluster."""

    async def dashboard_endpoint(self) -> tuple[str, int, str | None]:
        """Where this process reaches the head's dashboard (through its forward), and the
        cluster's CA when that is the head's relay (https), else None."""
