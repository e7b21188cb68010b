"""One owner per cluster (ownership.py), on a scripted Slurm.

Attaching a cluster that a live process owns observes it (its exit leaves the cluster
running); attaching one whose owner is gone, or taking over, makes the attaching process the
owner, and a previous owner that still runs stands down at its next renewal and says who owns
the cluster now. Records and leases name owner and observers without two processes taking
turns at them. Two cluster objects in this process model two kernels: the second acts for a
real child process (``sleep``), so whether it lives is judged as for a kernel.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from pathlib import Path

import pytest

from jupyter_slurm_ray import cluster as cluster_module
from jupyter_slurm_ray import ownership as ownership_module
from jupyter_slurm_ray.clientevents import request_scale
from jupyter_slurm_ray.cluster import SlurmRayCluster
from jupyter_slurm_ray.errors import SlurmRayError
from jupyter_slurm_ray.lease import Lease, LeaseSeen
from jupyter_slurm_ray.owner import ProcessIdentity, this_process
from jupyter_slurm_ray.ownership import Claim, claim_alive, newest_claim
from jupyter_slurm_ray.registry import ClusterRecord
from jupyter_slurm_ray.states import State
from jupyter_slurm_ray.ui.formatting import status_line
from jupyter_slurm_ray.ui.magic_args import parse

from ..helpers.processes import StandIn, dead_process
from ..helpers.waiting import until
from .test_cluster_logic import ready


@pytest.fixture
def kernel(stand_ins) -> StandIn:
    """Another kernel (a live process), for the cluster objects acting for it."""
    return stand_ins()


@pytest.fixture
async def attach(transport, registry):
    """``await attach(cluster, process, takeover=False)``: the cluster attached by another
    kernel (a cluster object made from the record, acting for ``process``)."""
    made: list[SlurmRayCluster] = []

    async def attach_as(
        cluster: SlurmRayCluster, process: ProcessIdentity, takeover: bool = False
    ) -> SlurmRayCluster:
        record = registry.load(cluster.id)
        other = SlurmRayCluster.from_record(record, transport, registry=registry, process=process)
        other.poll_interval = other.steady_poll_interval = 0.05
        made.append(other)
        await other.attach_async(takeover=takeover)
        return other

    yield attach_as
    for other in made:
        await other.close_async()


def lease_of(cluster: SlurmRayCluster) -> LeaseSeen:
    seen = LeaseSeen.parse((Path(cluster.job_dir) / "lease").read_text())
    assert seen is not None
    return seen


# -- attaching ----------------------------------------------------------------------------------
async def test_attaching_a_cluster_a_live_process_owns_observes_it(
    make_cluster, slurm, registry, attach, kernel
):
    owner = await ready(make_cluster, slurm, owner_timeout=5)
    observer = await attach(owner, kernel.identity)
    assert observer.observing and not observer.owned_here and owner.owned_here
    me = this_process().describe()
    assert observer.status.ownership == f"observing; owned by {me}"
    assert repr(observer).endswith(f"left · observing; owned by {me}>")
    assert f"owner      {me}; this process observes" in observer._repr_mimebundle_()["text/plain"]
    record = registry.load(owner.id)
    assert record.owner_process.same_as(this_process()) and record.owner_term == 0
    assert [p.pid for p in record.observer_processes] == [kernel.identity.pid]
    assert lease_of(owner).owner.same_as(this_process())
    assert observer not in cluster_module._owned  # nothing to cancel at its exit
    assert not observer.lease.kept and owner.lease.kept


async def test_records_and_the_lease_name_the_owner_whatever_the_observer_sees(
    make_cluster, slurm, registry, attach, kernel
):
    owner = await ready(make_cluster, slurm, owner_timeout=5)
    observer = await attach(owner, kernel.identity)
    me = this_process()
    for joined in range(1, 21):  # status changes both see (and both would have saved before)
        (Path(owner.job_dir) / "events.jsonl").open("a").write(
            json.dumps({"event": "nodes", "joined": joined % 2}) + "\n"
        )
        await observer.refresh_async()
        await asyncio.sleep(0.05)
        record = registry.load(owner.id)
        assert record.owner_process.same_as(me) and record.owner_term == 0, joined
        assert lease_of(owner).owner.same_as(me)
    await until(lambda: registry.load(owner.id).nodes_joined == 0, 5, "the owner's last write")
    assert [p.pid for p in registry.load(owner.id).observer_processes] == [kernel.identity.pid]


async def test_an_observer_that_exits_or_is_killed_leaves_the_cluster_running(
    make_cluster, slurm, registry, attach, stand_ins
):
    owner = await ready(make_cluster, slurm, owner_timeout=5)
    exits, killed = stand_ins(), stand_ins()
    await attach(owner, exits.identity)
    await attach(owner, killed.identity)
    assert len(registry.load(owner.id).observer_processes) == 2
    ownership_module._leave_observed()  # what an observer's interpreter does at exit
    killed.kill()  # no goodbye at all
    assert registry.load(owner.id).observer_processes == []
    await asyncio.sleep(2 * owner.lease.interval)
    assert slurm.jobs[owner.job_id].state == "RUNNING" and owner.state is State.READY
    assert owner.owned_here and owner.lease.kept


async def test_attaching_a_cluster_whose_owner_is_gone_makes_this_process_the_owner(
    make_cluster, slurm, registry, attach, kernel
):
    gone = dead_process()  # it still renews below: only its process is known gone
    first = await ready(make_cluster, slurm, owner_timeout=5, process=gone)
    second = await attach(first, kernel.identity)
    assert second.owned_here and not second.observing and second.status.ownership is None
    record = registry.load(first.id)
    assert record.owner_process.same_as(kernel.identity) and record.owner_term == 1
    assert lease_of(first).owner.same_as(kernel.identity) and lease_of(first).term == 1
    await until(lambda: not first.owned_here, 10, "the old owner standing down")
    assert lease_of(first).owner.same_as(kernel.identity)  # its late renewals never won


async def test_an_observer_is_told_when_its_owner_is_gone(make_cluster, slurm, attach, stand_ins):
    owning, watching = stand_ins(), stand_ins()
    owner = await ready(make_cluster, slurm, owner_timeout=5, process=owning.identity)
    observer = await attach(owner, watching.identity)
    assert observer.observing
    owning.kill()
    await until(lambda: "is gone" in (observer.status.ownership or ""), 10, "told it is gone")
    assert "unless taken over (attach --takeover)" in status_line(observer.status)
    assert slurm.jobs[owner.job_id].state == "RUNNING"  # an observer never reaps


# -- taking over --------------------------------------------------------------------------------
async def test_takeover_moves_ownership_and_the_previous_owner_is_told(
    make_cluster, slurm, registry, attach, kernel, caplog
):
    caplog.set_level(logging.WARNING, logger="jupyter_slurm_ray")
    previous = await ready(make_cluster, slurm, owner_timeout=5)
    new = await attach(previous, kernel.identity, takeover=True)
    assert new.owned_here and new.lease.kept
    record = registry.load(previous.id)
    assert record.owner_process.same_as(kernel.identity) and record.owner_term == 1
    assert lease_of(previous).owner.same_as(kernel.identity)
    await until(lambda: not previous.owned_here, 10, "the previous owner standing down")
    told = f"owned by {kernel.identity.describe()}"
    assert previous.status.ownership == f"taken over; {told}"
    assert told in repr(previous) and previous.observing
    assert previous not in cluster_module._owned and not previous.lease.kept  # no cancel at exit
    assert any(told in r.getMessage() and "taken over" in r.getMessage() for r in caplog.records)
    with pytest.raises(SlurmRayError, match="only the owner can scale it"):
        await previous.scale_async(2)
    with pytest.raises(SlurmRayError, match="--takeover"):
        await previous.detach_async()
    record = registry.load(previous.id)
    assert [p.pid for p in record.observer_processes] == [os.getpid()]
    assert record.owner_process.same_as(kernel.identity)  # the observer wrote no owner


async def test_a_displaced_owners_late_lease_write_never_wins(
    make_cluster, slurm, registry, attach, kernel
):
    previous = await ready(make_cluster, slurm, owner_timeout=5)
    await attach(previous, kernel.identity, takeover=True)
    await until(lambda: not previous.owned_here, 10, "the previous owner standing down")
    late = Lease(5, this_process())  # a renewal that was on its way when the takeover came
    (Path(previous.job_dir) / "lease").write_text(late.text())
    await until(lambda: lease_of(previous).owner.same_as(kernel.identity), 10, "the new owner")
    assert lease_of(previous).term == 1 and not previous.owned_here
    assert registry.load(previous.id).owner_process.same_as(kernel.identity)


async def test_an_owner_that_finds_a_newer_owner_in_the_record_stands_down_before_writing(
    make_cluster, slurm, registry, kernel
):
    owner = await ready(make_cluster, slurm, owner_timeout=300)  # renewals 10 s apart
    registry.update(owner.id, lambda r: (r.set_owner(kernel.identity, 1), r)[1])  # took it
    (Path(owner.job_dir) / "events.jsonl").open("a").write('{"event": "nodes", "joined": 0}\n')
    await until(lambda: not owner.owned_here, 2, "the owner standing down at its next write")
    assert owner.status.ownership == f"taken over; owned by {kernel.identity.describe()}"
    record = registry.load(owner.id)
    assert record.owner_process.same_as(kernel.identity) and record.nodes_joined == 1


async def test_a_takeover_seen_only_in_the_lease_reaches_this_hosts_record(
    make_cluster, slurm, registry
):
    """Taken over from a host whose registry is another: only the lease says so."""
    owner = await ready(make_cluster, slurm, owner_timeout=5)
    elsewhere = ProcessIdentity("login2", 4242, "boot:1")
    taker = Lease(5, elsewhere)
    taker.term = 1
    (Path(owner.job_dir) / "lease").write_text(taker.text())
    await until(lambda: not owner.owned_here, 10, "the owner standing down at its renewal")
    assert owner.status.ownership == "taken over; owned by pid 4242 on login2"
    record = registry.load(owner.id)
    assert (record.owner_host, record.owner_pid, record.owner_term) == ("login2", 4242, 1)
    assert [p.pid for p in record.observer_processes] == [os.getpid()]


async def test_after_a_takeover_only_the_new_owner_applies_scale_requests(
    make_cluster, slurm, transport, attach, kernel
):
    previous = await ready(make_cluster, slurm, owner_timeout=5)
    new = await attach(previous, kernel.identity, takeover=True)
    await until(lambda: not previous.owned_here, 10, "the previous owner standing down")
    await until(lambda: new.state is State.READY, 5, "the new owner sees it READY")
    await request_scale(transport, previous.job_dir, 2)
    await until(lambda: len(new.workers.jobs) == 1, 10, "the new owner's worker job")
    await asyncio.sleep(0.5)
    sbatches = [call for call in slurm.calls if call[0] == "sbatch"]
    assert len(sbatches) == 2 and previous.workers.jobs.keys() <= new.workers.jobs.keys()


async def test_an_observer_stops_the_cluster_on_purpose(make_cluster, slurm, attach, kernel):
    owner = await ready(make_cluster, slurm, owner_timeout=5)
    observer = await attach(owner, kernel.identity)
    assert (await observer.down_async(timeout=5)).state is State.STOPPED
    await until(lambda: owner.state.is_final, 5, "the owner sees the end")
    assert owner.state is State.STOPPED and owner.status.reason.startswith("stopped by pid")


def test_the_magic_takes_over_on_request():
    assert parse("attach ray --takeover").takeover
    assert not parse("attach ray").takeover


# -- the rules, pure ----------------------------------------------------------------------------
def test_the_lease_names_its_owner_and_term():
    lease = Lease(300, ProcessIdentity("login1", 42, "boot:7"))
    lease.term = 3
    seen = LeaseSeen.parse(lease.text())
    assert seen is not None and seen.owner == ProcessIdentity("login1", 42, "boot:7")
    assert seen.term == 3 and seen.renew_every == 10.0
    assert seen.fresh(300, now=seen.t + 35) and not seen.fresh(300, now=seen.t + 36)
    assert not seen.fresh(20, now=seen.t + 21)  # never beyond owner_timeout
    assert LeaseSeen.parse("4242 17\n") is None and LeaseSeen.parse(None) is None


def test_the_newest_claim_wins_and_ties_are_decided_alike_everywhere():
    a, b = ProcessIdentity("login1", 10, None), ProcessIdentity("login2", 5, None)
    record = ClusterRecord(id="ray-0001", name="ray", target="local", job_dir="/j")
    record.set_owner(a, 1)
    lease = LeaseSeen(b, term=2, t=0.0)
    assert newest_claim(lease, record).process == b  # a newer term in the lease
    record.set_owner(a, 3)
    assert newest_claim(lease, record).process == a
    assert Claim(b, 1).beats(Claim(a, 1)) and not Claim(a, 1).beats(Claim(b, 1))
    assert newest_claim(None, None) is None


def test_an_owner_lives_while_its_lease_is_fresh_and_its_process_runs():
    me = this_process()
    fresh = LeaseSeen(me, 0, t=time.time(), renew_every=1.0)
    assert claim_alive(Claim(me, 0, fresh), 300)
    stale = LeaseSeen(me, 0, t=fresh.t - 60, renew_every=1.0)
    assert not claim_alive(Claim(me, 0, stale), 300)
    gone = dead_process()
    assert not claim_alive(Claim(gone, 0, LeaseSeen(gone, 0, t=fresh.t, renew_every=1)), 300)
    elsewhere = ProcessIdentity("another-host", 1, None)  # cannot be judged: the lease says
    assert claim_alive(Claim(elsewhere, 0, LeaseSeen(elsewhere, 0, fresh.t, 1.0)), 300)
    assert claim_alive(Claim(elsewhere, 0), 300)  # only the record names it: cannot tell


def test_the_records_observers_forget_those_gone_at_the_next_write(registry):
    record = ClusterRecord(id="ray-0001", name="ray", target="local", job_dir="/j")
    registry.save(record)
    gone, watcher = dead_process(), this_process()
    for process in (gone, watcher):
        registry.update("ray-0001", lambda r, p=process: (r.set_observer(p, True), r)[1])
    observers = registry.load("ray-0001").observers
    assert [entry["pid"] for entry in observers] == [watcher.pid]
