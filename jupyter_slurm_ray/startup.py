"""Waiting for a cluster to come up: its job through the queue, then Ray through its start.

The queue and the start-up have limits of their own (a long queue is not Ray's fault), and
time while Slurm does not answer counts against neither. Past a limit the job is cancelled and
the error says where it was and why.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from .errors import ClusterTimeout, RayStartError
from .states import State, Status

if TYPE_CHECKING:
    from .spec import ClusterSpec


class Starting(Protocol):
    """What waiting reads of a cluster (``cluster.SlurmRayCluster``)."""

    spec: ClusterSpec
    _changed: asyncio.Event | None

    @property
    def status(self) -> Status: ...
    async def down_async(self, timeout: float = 60.0) -> Status: ...
    async def logs_async(self, node: str | None = None, tail: int = 100) -> str: ...


async def wait_until(
    cluster: Starting,
    reached: Callable[[Status], bool],
    *,
    queue_timeout: float | None = None,
    start_timeout: float | None = None,
) -> Status:
    """The first status that ``reached`` accepts; RayStartError when the cluster ends before,
    ClusterTimeout (after cancelling the job) when a limit is exceeded."""
    start_limit = start_timeout if start_timeout is not None else cluster.spec.start_timeout + 30
    changed = cluster._changed
    assert changed is not None, "call up() first"
    queued_since = started_since = None
    while True:
        status = cluster.status
        if reached(status):
            return status
        if status.state.is_final:
            raise RayStartError(
                f"cluster {cluster.spec.name} is {status.state}: {status.reason}", status.log_tail
            )
        now = time.monotonic()
        if status.state in (State.SUBMITTING, State.PENDING):
            queued_since = queued_since or now
            if queue_timeout is not None and now - queued_since > queue_timeout:
                await cluster.down_async()
                raise ClusterTimeout(
                    f"job {status.job_id} waited {queue_timeout:g} s in the queue "
                    f"({status.reason or 'no reason given'}); it was cancelled"
                )
        elif status.slurm_unreachable_since is None:
            started_since = started_since or now
            if now - started_since > start_limit:
                tail = await cluster.logs_async(tail=30)
                await cluster.down_async()
                raise ClusterTimeout(
                    f"Ray did not come up within {start_limit:g} s of the job starting "
                    f"(phase: {status.phase}, {status.nodes_joined}/{status.nodes_wanted} "
                    f"nodes); the job was cancelled.\n{tail}"
                )
        changed.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(changed.wait(), 1.0)
