"""The server's ClusterManager on a scripted Slurm: query budget, forgetting, housekeeping."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
import warnings

import pytest

from jupyter_slurm_ray.cluster import SlurmRayCluster
from jupyter_slurm_ray.errors import Conflict
from jupyter_slurm_ray.lease import Lease
from jupyter_slurm_ray.naming import job_comment
from jupyter_slurm_ray.owner import this_process
from jupyter_slurm_ray.registry import ClusterRecord
from jupyter_slurm_ray.server.manager import ClusterManager, _owner_timeout
from jupyter_slurm_ray.spec import ClusterSpec
from jupyter_slurm_ray.targets import Transports

from ..helpers.fakeslurm import FakeJob
from ..helpers.processes import dead_process


def record(job_id: str | None, name: str, state: str = "READY", **fields) -> ClusterRecord:
    fields.setdefault("target", "fake")
    fields.setdefault("job_dir", f"/nowhere/{name}-0000")
    return ClusterRecord(
        id=f"{name}-0000",
        name=name,
        job_id=job_id,
        state=state,
        **fields,
    )


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.fixture
def manager(registry, transport):
    def resolve(settings, profile):
        return ClusterSpec(**settings)

    manager = ClusterManager(registry, Transports(lambda: transport), resolve_spec=resolve)
    yield manager


def add_job(slurm, job_id: str, cluster_id: str, state: str = "RUNNING") -> None:
    slurm.jobs[job_id] = FakeJob(job_id, "", comment=job_comment(cluster_id), state=state)


async def test_concurrent_listings_share_one_slurm_query_per_refresh(manager, registry, slurm):
    add_job(slurm, "7", "one-0000", state="COMPLETED")
    registry.save(record("7", "one"))
    registry.save(record("7", "two"))
    registry.save(record("8", "elsewhere", target="ssh://bob@login2"))
    listings = await asyncio.gather(*(manager.list() for _ in range(20)))
    squeues = [c for c in slurm.calls if c[0] == "squeue"]
    assert len(squeues) == 1  # one for 20 concurrent callers; none for the other target
    clusters = {c["name"]: c for c in listings[0]["clusters"]}
    assert clusters["one"]["state"] == clusters["two"]["state"] == "STOPPED"
    assert clusters["elsewhere"]["state"] == "READY" and not clusters["elsewhere"]["reachable"]
    await manager.list()
    assert len([c for c in slurm.calls if c[0] == "squeue"]) == 1  # still fresh


async def test_a_record_added_since_the_last_query_is_asked_about(manager, registry, slurm):
    add_job(slurm, "7", "one-0000")
    registry.save(record("7", "one"))
    await manager.list()
    add_job(slurm, "8", "two-0000")
    registry.save(record("8", "two"))
    listing = await manager.list()
    assert {c["name"]: c["state"] for c in listing["clusters"]} == {"one": "READY", "two": "READY"}


async def test_a_silent_slurm_keeps_the_last_state_and_says_since_when(manager, registry, slurm):
    add_job(slurm, "7", "one-0000")
    registry.save(record("7", "one"))
    slurm.down = True
    view = (await manager.list())["clusters"][0]
    assert view["state"] == "READY" and view["slurm_unreachable_since"] <= time.time()
    assert "Unable to contact" in view["notice"]


async def test_forget_refuses_an_active_cluster_and_removes_an_ended_one(manager, registry, slurm):
    add_job(slurm, "7", "live-0000")
    registry.save(record("7", "live"))
    registry.save(record("8", "old", state="CANCELLED"))
    with pytest.raises(Conflict, match="stop it before"):
        await manager.forget("live-0000")
    assert (await manager.forget("old-0000"))["forgotten"]
    assert [r.id for r in registry.all()] == ["live-0000"]


async def test_housekeeping_cancels_a_dead_owners_tagged_job_only(manager, registry, slurm):
    add_job(slurm, "7", "orphan-0000")
    registry.save(record("7", "orphan", owner_pid=dead_pid()))
    add_job(slurm, "8", "someone-else")  # tagged for another cluster than its record says
    registry.save(record("8", "mislabelled", owner_pid=dead_pid()))
    add_job(slurm, "9", "mine-0000")
    registry.save(record("9", "mine", owner_pid=os.getpid()))
    add_job(slurm, "10", "away-0000")
    registry.save(record("10", "away", owner_pid=dead_pid(), detached=True))
    await manager.housekeep()
    assert manager.reaped == ["7"]
    assert {j: slurm.jobs[j].state for j in ["7", "8", "9", "10"]} == {
        "7": "CANCELLED",
        "8": "RUNNING",
        "9": "RUNNING",
        "10": "RUNNING",
    }


async def test_housekeeping_never_reaps_a_cluster_whose_lease_names_a_live_owner(
    manager, registry, slurm, tmp_path
):
    """The record names a gone kernel, but another process took the cluster over from
    elsewhere (its lease, fresh, names it): only the cluster whose lease agrees is reaped."""
    for name, lease_owner in (("taken", this_process()), ("orphan", dead_process())):
        job_dir = tmp_path / f"{name}-0000"
        job_dir.mkdir()
        lease = Lease(300, lease_owner)
        lease.term = 1
        (job_dir / "lease").write_text(lease.text())
        add_job(slurm, str(len(name)), f"{name}-0000")
        registry.save(record(str(len(name)), name, owner_pid=dead_pid(), job_dir=str(job_dir)))
    await manager.housekeep()
    assert manager.reaped == ["6"]  # the orphan's job only
    assert slurm.jobs["5"].state == "RUNNING"


def test_a_record_written_before_the_rename_loads_its_lease_setting_silently(registry, transport):
    spec = {**ClusterSpec(time="10").to_dict(), "idle_timeout": 30.0}
    del spec["owner_timeout"]  # an older client's record names it idle_timeout
    old = record("5", "old", spec=spec)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # read on every poll: no warning each time
        assert _owner_timeout(old) == 30.0
        cluster = SlurmRayCluster.from_record(old, transport, registry=registry)
    assert cluster.spec.owner_timeout == 30.0 and cluster.ownership.owner_timeout == 30.0


async def test_a_quiet_housekeeping_round_asks_slurm_nothing(manager, registry, slurm):
    add_job(slurm, "7", "mine-0000")
    registry.save(record("7", "mine", owner_pid=os.getpid()))  # its owner lives and watches it
    add_job(slurm, "8", "away-0000")
    registry.save(record("8", "away", owner_pid=dead_pid(), detached=True))
    for _ in range(3):
        await manager.housekeep()
    assert [c for c in slurm.calls if c[0] == "squeue"] == []


async def test_housekeeping_forgets_ended_clusters_after_the_retention(manager, registry):
    registry.save(record("7", "old", state="STOPPED"))
    path = registry.path / "clusters" / "old-0000.json"
    text = path.read_text().replace('"updated_at": ', '"updated_at": 1000, "x": ')
    path.write_text(text)
    registry.save(record("8", "new", state="STOPPED"))
    await manager.housekeep()
    assert [r.name for r in registry.all()] == ["new"]
