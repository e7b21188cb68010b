"""Who owns a cluster: one owner, any number of observers, and taking over.

The owner is the process that started the cluster, or attached it while no live process owned
it: it keeps the lease (the job stops without it), cancels the cluster at exit unless
detached, and alone scales, adapts and rotates it. Any other process that attaches or connects
*observes*: it watches, connects, reads logs and usage, and may stop the cluster on purpose
(``down``), but it never renews the lease and never cancels at exit. Taking over is explicit
(``attach(takeover=True)``, ``%slurm_ray attach --takeover``, ``POST clusters/<id>/takeover``).

An owner is alive while its lease is fresh and, on its own host, its process runs. The owner
is named in two places, each written by the owner only: the lease in the job dir (what the job
follows) and the cluster's record (what the processes of this machine read, under the
registry's lock). Both carry its *term*, one more at every change of owner: a displaced owner
finds a newer term there at its next renewal (or record write) and steps down; its late writes
never win, so two processes never take turns at the owner's field. Observers write only their
own entry in the record's ``observers``.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import enum
import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from .errors import SlurmRayError
from .job.directory import JobDir
from .lease import Lease, LeaseSeen
from .owner import ProcessIdentity, this_process
from .registry import ClusterRecord, Registry
from .states import FINAL, State, Status, record_fields

log = logging.getLogger(__name__)

__all__ = ["Claim", "Ownership", "Standing"]

JobDirOf = Callable[[], JobDir]

_observing: weakref.WeakSet[Ownership] = weakref.WeakSet()  # leave the records' observers at exit


class Standing(str, enum.Enum):
    """How this process stands toward a cluster (not the bootstrap's ``Role`` of a node)."""

    OWNER = "owner"
    OBSERVER = "observer"
    NONE = "none"  # a cluster object that only reads or stops (the CLI, the server's handles)


@dataclass(frozen=True)
class Claim:
    """Who the lease or the record says owns the cluster, in which term."""

    process: ProcessIdentity
    term: int
    lease: LeaseSeen | None = None  # the lease that makes this claim, if it is the lease's

    def beats(self, other: Claim) -> bool:
        """The newer claim: the higher term; between equal terms (two processes that took
        a gone owner's cluster at once) the same one for every reader."""
        mine = (self.term, self.process.host, self.process.pid)
        return mine > (other.term, other.process.host, other.process.pid)


def newest_claim(lease: LeaseSeen | None, record: ClusterRecord | None) -> Claim | None:
    """The claim that holds now: the newest of the lease's and the record's (the lease's
    when they name the same process)."""
    claims = []
    if lease is not None:
        claims.append(Claim(lease.owner, lease.term, lease))
    if record is not None and record.owner_host:
        claims.append(Claim(record.owner_process, record.owner_term))
    newest: Claim | None = None
    for claim in claims:
        same = newest is not None and claim.process.same_as(newest.process)
        if newest is None or (not same and claim.beats(newest)):
            newest = claim
    return newest


async def read_lease(job_dir: JobDir) -> LeaseSeen | None:
    """What the cluster's lease says now; None when it cannot be read or names nobody."""
    try:
        return LeaseSeen.parse(await job_dir.read_lease())
    except (SlurmRayError, OSError):
        return None


async def live_owner(
    job_dir: JobDir, record: ClusterRecord, owner_timeout: float
) -> ProcessIdentity | None:
    """The process that owns the cluster now (by its lease and its record), if it lives."""
    claim = newest_claim(await read_lease(job_dir), record)
    return claim.process if claim is not None and claim_alive(claim, owner_timeout) else None


def claim_alive(claim: Claim, owner_timeout: float) -> bool:
    """The claimant still owns the cluster: its lease is fresh and, on its own host, its
    process runs. A claim only the record makes (the lease unreadable, or older) is judged
    by its process; one that cannot be judged from here counts as alive."""
    alive = claim.process.alive is not False
    if claim.lease is not None:
        return alive and claim.lease.fresh(owner_timeout)
    return alive


class Ownership:
    """This process's part in one cluster (owner, observer or none) and who owns it.

    ``on_displaced(owner)`` is called once another process took over from this owner;
    ``on_change()`` when an observer sees its owner change or go.
    """

    def __init__(
        self,
        cluster_id: str,
        registry: Registry,
        owner_timeout: float,
        *,
        process: ProcessIdentity | None = None,
    ) -> None:
        self.cluster_id = cluster_id
        self.registry = registry
        self.owner_timeout = owner_timeout
        self.me = process or this_process()
        self.lease = Lease(owner_timeout, self.me)
        self.role = Standing.NONE
        self.owner: ProcessIdentity | None = None  # who owns the cluster, as last seen
        self.owner_alive = True
        self.taken_over = False  # this process owned the cluster until another took it over
        self.on_displaced: Callable[[ProcessIdentity], None] = lambda owner: None
        self.on_change: Callable[[], None] = lambda: None
        self._watching: asyncio.Task[None] | None = None

    @property
    def term(self) -> int:
        return self.lease.term

    @property
    def owned(self) -> bool:
        return self.role is Standing.OWNER

    # -- what the views say --------------------------------------------------------------------
    def note(self) -> str | None:
        """The status' word on ownership: None for the owner; ``observing; owned by pid N on
        host`` for an observer; ``taken over; owned by …`` for a displaced owner; for a cluster
        object that neither owns nor observes, ``owned by …``."""
        if self.role is Standing.OWNER or self.owner is None:
            return None
        owned = f"owned by {self.owner.describe()}"
        if not self.owner_alive:
            owned = (
                f"its owner ({self.owner.describe()}) is gone: it stops by itself unless "
                "taken over (attach --takeover)"
            )
        if self.role is Standing.OBSERVER:
            return f"{'taken over' if self.taken_over else 'observing'}; {owned}"
        return owned

    def require(self, what: str, name: str) -> None:
        """SlurmRayError unless this process owns the cluster: only the owner may ``what``."""
        if self.role is Standing.OWNER:
            return
        by = f"{self.owner.describe()} owns it" if self.owner else "another process owns it"
        raise SlurmRayError(
            f"only the owner can {what}: {by}; take it over first "
            f"(%slurm_ray attach {name} --takeover)"
        )

    def describe(self) -> str:
        """Who owns it, for the repr's ``owner`` row."""
        if self.role is Standing.OWNER:
            return f"this process ({self.me.describe()})"
        if self.owner is None:
            return "unknown"
        alive = "" if self.owner_alive else " (gone)"
        if self.role is Standing.OBSERVER:
            return (
                f"{self.owner.describe()}{alive}; this process observes "
                "(its exit leaves the cluster running)"
            )
        return f"{self.owner.describe()}{alive}"

    def know_record(self, record: ClusterRecord) -> None:
        """Who owns the cluster, as its record says (a cluster object made from a record)."""
        if record.owner_host:
            self.owner = record.owner_process
            self.owner_alive = record.owner_process.alive is not False
        self.lease.term = record.owner_term

    # -- judging -------------------------------------------------------------------------------
    async def read_claims(self, job_dir: JobDir) -> tuple[LeaseSeen | None, ClusterRecord | None]:
        """What the lease and the record say now (None for one that cannot be read)."""
        return await read_lease(job_dir), self._load_record()

    def _load_record(self) -> ClusterRecord | None:
        try:
            return self.registry.load(self.cluster_id)
        except (SlurmRayError, OSError):
            return None

    # -- becoming owner or observer ------------------------------------------------------------
    async def settle(self, job_dir: JobDir, *, takeover: bool = False) -> Standing:
        """Owner or observer, as attaching finds the cluster: the owner when no live process
        owns it (or this one does), or with ``takeover``; else an observer."""
        lease, record = await self.read_claims(job_dir)
        claim = newest_claim(lease, record)
        if claim is not None and claim.process.same_as(self.me):
            self.become_owner(claim.term)
        elif claim is None or takeover or not claim_alive(claim, self.owner_timeout):
            term = max(lease.term if lease else 0, record.owner_term if record else 0) + 1
            self.become_owner(term)
            if claim is not None:
                was = "taken over from" if takeover else "its owner was gone:"
                who = claim.process.describe()
                log.info("%s is owned by this process now (%s %s)", self.cluster_id, was, who)
        else:
            self.observe(claim.process)
            return self.role
        self._record_owner()
        try:  # the job, and the previous owner, see it now (else at the first renewal)
            await job_dir.write_lease(self.lease.text())
        except SlurmRayError as exc:
            log.warning("could not write the lease of %s yet: %s", self.cluster_id, exc)
        return self.role

    def become_owner(self, term: int) -> None:
        self.role, self.owner, self.owner_alive, self.taken_over = (
            Standing.OWNER,
            self.me,
            True,
            False,
        )
        self.lease.term = term
        self._stop_watching()
        _observing.discard(self)

    def _record_owner(self) -> None:
        """Name this process the owner in the record (a newer term if another claimed it
        meanwhile, under the registry's lock)."""

        def change(record: ClusterRecord | None) -> ClusterRecord | None:
            if record is None:
                return None
            if not record.owner_process.same_as(self.me) and record.owner_term >= self.term:
                self.lease.term = record.owner_term + 1
            record.set_owner(self.me, self.term)
            return record

        self._update_record(change)

    def observe(self, owner: ProcessIdentity, *, newer: Claim | None = None) -> None:
        """Watch the cluster without owning it (named among the record's observers); with
        ``newer``, the claim that displaced this owner, which the record learns too when it
        does not know it (a takeover from a host with another registry)."""
        self.role, self.owner, self.owner_alive = Standing.OBSERVER, owner, True
        self.taken_over = newer is not None

        def change(record: ClusterRecord | None) -> ClusterRecord | None:
            if record is None:
                return None
            held = newest_claim(None, record)
            if newer is not None and (held is None or newer.beats(held)):
                record.set_owner(newer.process, newer.term)
            record.set_observer(self.me, True)
            return record

        self._update_record(change)
        _observing.add(self)

    def leave(self) -> None:
        """This process no longer watches the cluster (closed, or exiting)."""
        self._stop_watching()
        self.lease.release()
        if self.role is Standing.OBSERVER:
            self._set_observer(False)
        _observing.discard(self)

    def _set_observer(self, observing: bool) -> None:
        def change(record: ClusterRecord | None) -> ClusterRecord | None:
            if record is None:
                return None
            record.set_observer(self.me, observing)
            return record

        self._update_record(change)

    def _update_record(
        self, change: Callable[[ClusterRecord | None], ClusterRecord | None]
    ) -> None:
        try:
            self.registry.update(self.cluster_id, change)
        except (OSError, SlurmRayError) as exc:
            log.warning("could not update the record of %s: %s", self.cluster_id, exc)

    # -- the owner's record, and its renewals ------------------------------------------------
    def save(self, fresh: ClusterRecord, *, create: bool) -> bool:
        """Write what this process knows of the cluster into its record: the owner writes it
        all (the observers kept as they are on disk); anyone else only an end it saw, into a
        record that does not say so yet. A newer owner found in the record displaces this one.
        True when something was written."""
        displaced_by: list[Claim] = []

        def change(current: ClusterRecord | None) -> ClusterRecord | None:
            if self.role is not Standing.OWNER:
                return _settled(current, fresh)
            newer = self._newer_claim(None, current)
            if newer is not None:
                displaced_by.append(newer)
                return None
            fresh.set_owner(self.me, self.term)
            fresh.observers = list(current.observers) if current is not None else []
            fresh.set_observer(self.me, False)  # prunes the observers known gone
            return fresh

        written = self.registry.update(
            self.cluster_id, change, create=create and self.role is Standing.OWNER
        )
        if displaced_by:  # told once this write (within a status change) is over
            by = displaced_by[0]
            try:
                asyncio.get_running_loop().call_soon(self.displaced, by)
            except RuntimeError:  # no loop in this thread
                self.displaced(by)
        return written is not None

    def _newer_claim(self, lease: LeaseSeen | None, record: ClusterRecord | None) -> Claim | None:
        """Another process's claim that beats this owner's, in the lease or the record."""
        mine = Claim(self.me, self.term)
        for claim in (newest_claim(lease, None), newest_claim(None, record)):
            if claim is not None and not claim.process.same_as(self.me) and claim.beats(mine):
                return claim
        return None

    async def still_owner(self, job_dir: JobDir) -> bool:
        """Before each renewal: no newer owner in the lease or the record (else stand down)."""
        if self.role is not Standing.OWNER:
            return False
        newer = self._newer_claim(*await self.read_claims(job_dir))
        if newer is None:
            return True
        self.displaced(newer)
        return False

    def displaced(self, by: Claim) -> None:
        """Another process took the cluster over: observe it from now on, and say so."""
        if self.role is not Standing.OWNER:
            return
        self.lease.release()
        self.observe(by.process, newer=by)
        log.warning(
            "cluster %s is owned by %s now (taken over): this process no longer renews its "
            "lease, scales it or cancels it at exit",
            self.cluster_id,
            by.process.describe(),
        )
        self.on_displaced(by.process)

    # -- an observer's eye on its owner ----------------------------------------------------
    def watch(self, job_dir: JobDirOf) -> None:
        """As an observer, look at the lease and record every renewal interval: who owns the
        cluster now, and whether that owner still lives (``on_change`` when either changes)."""
        if self._watching is None or self._watching.done():
            loop = asyncio.get_running_loop()
            self._watching = loop.create_task(self._watch_forever(job_dir))

    async def _watch_forever(self, job_dir: JobDirOf) -> None:
        while self.role is Standing.OBSERVER:
            await asyncio.sleep(self.lease.interval)
            try:
                claim = newest_claim(*await self.read_claims(job_dir()))
            except Exception as exc:  # the watch outlives any one failure
                log.debug("watching the owner of %s: %s", self.cluster_id, exc)
                continue
            if claim is None or self.role is not Standing.OBSERVER:
                continue
            alive = claim_alive(claim, self.owner_timeout)
            if not claim.process.same_as(self.owner) or alive != self.owner_alive:
                self.owner, self.owner_alive = claim.process, alive
                self.on_change()

    def _stop_watching(self) -> None:
        if self._watching is not None:
            self._watching.cancel()
            self._watching = None


@atexit.register
def _leave_observed() -> None:
    """On interpreter exit, this process leaves the observers of the clusters it watched."""
    for ownership in list(_observing):
        with contextlib.suppress(Exception):
            ownership.leave()


def _settled(current: ClusterRecord | None, fresh: ClusterRecord) -> ClusterRecord | None:
    """The record with the end a non-owner saw (a stop it asked for, say); None when there is
    nothing to write (no record, already ended, or not an end). Owner fields stay."""
    if current is None or current.is_final or fresh.state not in _FINAL_STATES:
        return None
    for name in _STATUS_FIELDS:
        setattr(current, name, getattr(fresh, name))
    return current


_FINAL_STATES = frozenset(state.value for state in FINAL)
_STATUS_FIELDS = tuple(record_fields(Status(State.SUBMITTING)))  # what a status sets
