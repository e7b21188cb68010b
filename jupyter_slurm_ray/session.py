"""This kernel's clusters: the current one, those it started or attached, and its transports."""

from __future__ import annotations

import logging
from typing import Any

from .client.rayinit import guard_ray_init
from .cluster import SlurmRayCluster
from .config import SlurmRay, adapt_defaults, effective_setting, make_transport
from .errors import SlurmRayError
from .inventory import Inventory
from .registry import Registry
from .spec import ClusterSpec
from .states import State
from .targets import Transports
from .transport import Transport

log = logging.getLogger(__name__)

__all__ = ["Session", "get_session"]


class Session:
    """What the magics, the panel and ``jupyter_slurm_ray.current()`` share in one process."""

    def __init__(self, config: SlurmRay | None = None) -> None:
        self.config = config if config is not None else SlurmRay()
        self.clusters: dict[str, SlurmRayCluster] = {}
        self.current: SlurmRayCluster | None = None
        self.transports = Transports(lambda: make_transport(self.config))
        guard_ray_init(self.local_ray_allowed)

    def local_ray_allowed(self) -> bool:
        """``SlurmRay.allow_local_ray`` (env over config): may ray.init() start a Ray here."""
        return bool(effective_setting("allow_local_ray", self.config)[0])

    # -- building blocks ------------------------------------------------------------------
    def transport(self, target: str | None = None) -> Transport:
        """The configured transport; with ``target`` (a record's), UnknownTarget unless the
        record was made through the same configuration."""
        if target is None:
            return self.transports.configured()
        return self.transports.for_target(target)

    def registry(self) -> Registry:
        return Registry()

    def inventory(self) -> Inventory:
        """Every record of the registry, reconciled with Slurm (see ``inventory.py``)."""
        return Inventory(self.registry(), self.transports)

    def setting(self, name: str, default: Any) -> Any:
        value, _ = effective_setting(name, self.config)
        return default if value is None else value

    def new_cluster(self, spec: ClusterSpec) -> SlurmRayCluster:
        """A cluster object for ``spec`` on the configured transport (nothing submitted yet)."""
        return SlurmRayCluster(
            spec,
            self.transport(),
            registry=self.registry(),
            poll_interval=float(self.setting("poll_interval", 1.0)),
            steady_poll_interval=float(self.setting("steady_poll_interval", 15.0)),
            submit_timeout=float(self.setting("submit_timeout", 60.0)),
            driver_hosts=self.setting("driver_hosts", None),
            adapt_defaults=lambda: adapt_defaults(self.config),
        )

    def adopt(self, cluster: SlurmRayCluster) -> SlurmRayCluster:
        """Make ``cluster`` this kernel's current cluster."""
        self.clusters[cluster.id] = cluster
        self.current = cluster
        return cluster

    # -- lookups --------------------------------------------------------------------------
    def connected(self) -> SlurmRayCluster | None:
        """The cluster this process's Ray Client is connected to (there is at most one)."""
        for cluster in self.clusters.values():
            if cluster.state is State.CONNECTED:
                return cluster
        return None

    def find(self, key: str | None) -> SlurmRayCluster:
        """This kernel's cluster by name, id or job id (the current one for None), else the
        registry's record of that name, id or job id as a cluster object."""
        if key is None:
            if self.current is None:
                raise SlurmRayError("no cluster in this kernel yet: start one with up or attach")
            return self.current
        mine = [c for c in self.clusters.values() if key in (c.id, c.spec.name, c.job_id)]
        if mine:
            return mine[-1]
        registry = self.registry()
        record = registry.find(key)
        if record is None:
            known = ", ".join(f"{r.name} ({r.id}, job {r.job_id})" for r in registry.all())
            raise SlurmRayError(f"no cluster {key!r} in {registry.path}; known: {known or 'none'}")
        return SlurmRayCluster.from_record(
            record,
            self.transport(record.target),
            registry=registry,
            driver_hosts=self.setting("driver_hosts", None),
            adapt_defaults=lambda: adapt_defaults(self.config),
        )

    def forget(self, cluster: SlurmRayCluster) -> None:
        self.clusters.pop(cluster.id, None)
        if self.current is cluster:
            self.current = None


_session: Session | None = None


def get_session(config: SlurmRay | None = None) -> Session:
    """The process's session; ``config`` (e.g. the IPython shell's SlurmRay) replaces its own."""
    global _session
    if _session is None:
        _session = Session(config)
    elif config is not None:
        _session.config = config
    return _session
