"""The owner's lease: rewritten on its own timer while the owning process lives.

The lease is about the owner, not about Slurm: it is renewed whatever Slurm answers (a paused
or restarting controller never ends a cluster whose owner is alive), and it stops being
renewed when the owner is gone or asks the cluster to stop. The bootstrap stops Ray once the
lease has not changed for ``idle_timeout`` seconds (by its own clock), and refuses to start
Ray at all when the lease is already stale when the job begins.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)

Writer = Callable[[str], Awaitable[None]]


def renew_interval(idle_timeout: float) -> float:
    """Seconds between renewals: several per idle_timeout, between 1 and 10 s."""
    return max(1.0, min(10.0, idle_timeout / 4))


class Lease:
    """The lease of one cluster; :meth:`keep` renews it until :meth:`release`."""

    def __init__(self, idle_timeout: float) -> None:
        self.interval = renew_interval(idle_timeout)
        self.seq = 0
        self.renewed_at: float | None = None  # time.time() of the last successful write
        self.failures = 0
        self._task: asyncio.Task[None] | None = None

    def text(self) -> str:
        """The next lease content (one JSON object; the bootstrap reads ``t``)."""
        self.seq += 1
        content = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "seq": self.seq,
            "t": time.time(),
            "renew_every": self.interval,
        }
        return json.dumps(content) + "\n"

    def keep(self, write: Writer) -> None:
        """Renew every ``interval`` seconds on the running loop (idempotent)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._renew_forever(write))

    def release(self) -> None:
        """Stop renewing: the cluster stops itself once the lease is stale."""
        if self._task is not None:
            self._task.cancel()
            self._task = None

    @property
    def kept(self) -> bool:
        return self._task is not None and not self._task.done()

    async def _renew_forever(self, write: Writer) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await write(self.text())
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the lease outlives any one failure
                self.failures += 1
                if self.failures in (1, 10) or self.failures % 100 == 0:
                    log.warning(
                        "could not renew a cluster lease (%d failures): %s", self.failures, exc
                    )
            else:
                self.failures = 0
                self.renewed_at = time.time()
