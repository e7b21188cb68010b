"""The owner's lease: rewritten on its own timer while the owning process lives and owns.

The lease is about the owner, not about Slurm: it is renewed whatever Slurm answers (a paused
or restarting controller never ends a cluster whose owner is alive), and it stops being
renewed when the owner is gone, asks the cluster to stop, or finds that another process took
the cluster over (a newer ``term`` in the lease or the record; see ``ownership.py``). The
bootstrap stops Ray once the lease has not changed for ``owner_timeout`` seconds (by its own
clock), and refuses to start Ray at all when the lease is already stale when the job begins.

The file names its owner: ``{"pid", "host", "started", "term", "seq", "t", "renew_every"}``
(the bootstrap reads ``t`` and ``renew_every`` only).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from .owner import ProcessIdentity, this_process

log = logging.getLogger(__name__)

Writer = Callable[[str], Awaitable[None]]
StillOwner = Callable[[], Awaitable[bool]]

#: A lease is fresh while renewed within this many renewals (plus a few seconds of slack for
#: a slow filesystem): its owner then keeps it, wherever it runs.
FRESH_RENEWALS = 3
FRESH_SLACK = 5.0


def renew_interval(owner_timeout: float) -> float:
    """Seconds between renewals: several per owner_timeout, between 1 and 10 s."""
    return max(1.0, min(10.0, owner_timeout / 4))


@dataclass(frozen=True)
class LeaseSeen:
    """What a lease file says: who owns the cluster, in which term, when it last renewed."""

    owner: ProcessIdentity
    term: int = 0
    t: float | None = None  # the owner's time.time() at its last renewal
    renew_every: float | None = None

    def age(self, now: float | None = None) -> float | None:
        return None if self.t is None else max(0.0, (time.time() if now is None else now) - self.t)

    def fresh(self, owner_timeout: float, now: float | None = None) -> bool:
        """Renewed recently enough that its owner still keeps it: within a few renewals (and
        never longer than ``owner_timeout``, after which the job stops anyway). Judged on this
        host's clock against the owner's: a few seconds of skew between hosts are tolerated."""
        age = self.age(now)
        if age is None:
            return False
        every = self.renew_every or renew_interval(owner_timeout)
        return age <= min(owner_timeout, FRESH_RENEWALS * every + FRESH_SLACK)

    @classmethod
    def parse(cls, text: str | None) -> LeaseSeen | None:
        """The lease's content; None when missing, of the old ``"PID COUNTER"`` form, or
        without an owner's identity."""
        try:
            data = json.loads(text or "")
        except ValueError:
            return None
        owner = ProcessIdentity.from_dict(data) if isinstance(data, dict) else None
        if owner is None:
            return None
        term, t, every = data.get("term", 0), data.get("t"), data.get("renew_every")
        return cls(owner, term if _is_int(term) else 0, _number(t), _number(every))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: object) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and value == value
    return float(value) if ok else None  # type: ignore[arg-type]


class Lease:
    """The lease of one cluster as its owner writes it; :meth:`keep` renews it until
    :meth:`release` (or until ``still_owner`` says another process owns the cluster)."""

    def __init__(self, owner_timeout: float, owner: ProcessIdentity | None = None) -> None:
        self.interval = renew_interval(owner_timeout)
        self.owner = owner or this_process()
        self.term = 0  # one more at every change of owner (ownership.py)
        self.seq = 0
        self.renewed_at: float | None = None  # time.time() of the last successful write
        self.failures = 0
        self._task: asyncio.Task[None] | None = None

    def text(self) -> str:
        """The next lease content (one JSON object; the bootstrap reads ``t``)."""
        self.seq += 1
        content = {
            **self.owner.to_dict(),
            "term": self.term,
            "seq": self.seq,
            "t": time.time(),
            "renew_every": self.interval,
        }
        return json.dumps(content) + "\n"

    def keep(self, write: Writer, still_owner: StillOwner | None = None) -> None:
        """Renew every ``interval`` seconds on the running loop (idempotent); before each
        renewal ``still_owner()`` is asked, and renewing stops for good when it says no."""
        if self._task is None or self._task.done():
            loop = asyncio.get_running_loop()
            self._task = loop.create_task(self._renew_forever(write, still_owner))

    def release(self) -> None:
        """Stop renewing: the cluster stops itself once the lease is stale."""
        if self._task is not None:
            self._task.cancel()
            self._task = None

    @property
    def kept(self) -> bool:
        return self._task is not None and not self._task.done()

    async def _renew_forever(self, write: Writer, still_owner: StillOwner | None) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                if still_owner is not None and not await still_owner():
                    return
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
