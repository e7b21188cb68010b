"""The cluster's state machine on a scripted Slurm: what it shows, when it ends, and that
missing answers never end it."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from jupyter_slurm_ray.cluster import SlurmRayCluster
from jupyter_slurm_ray.errors import SlurmError, SpecError
from jupyter_slurm_ray.states import State
from jupyter_slurm_ray.ui.formatting import status_line

from ..helpers.waiting import until
from .conftest import emit, write_connection


async def started(make_cluster, slurm, **spec):
    cluster = make_cluster(**spec)
    await cluster.up_async(wait=False)
    slurm.run(cluster.job_id)
    emit(cluster, {"event": "phase", "phase": "bootstrap"})
    return cluster


async def ready(make_cluster, slurm, **spec):
    cluster = await started(make_cluster, slurm, **spec)
    write_connection(cluster)
    emit(cluster, {"event": "ready", "joined": 1, "node_count": 1})
    await until(lambda: cluster.state is State.READY, 5, "READY")
    return cluster


async def test_up_goes_pending_starting_ready(make_cluster, slurm):
    cluster = make_cluster()
    await cluster.up_async(wait=False)
    assert cluster.state is State.PENDING
    await until(lambda: cluster.status.reason == "Priority", 5, "Slurm's pending reason")
    slurm.run(cluster.job_id)
    await until(lambda: cluster.state is State.STARTING, 5, "STARTING")
    write_connection(cluster)
    emit(cluster, {"event": "ready", "joined": 1})
    await until(lambda: cluster.state is State.READY, 5, "READY")
    record = cluster.registry.load(cluster.id)
    assert record.state == "READY" and record.head_ip == "10.0.0.1"
    await cluster.close_async()


async def test_the_job_dir_is_fresh_private_and_holds_the_script_and_a_json_lease(
    make_cluster, slurm
):
    cluster = make_cluster()
    await cluster.up_async(wait=False)
    job_dir = Path(cluster.job_dir)
    assert oct(job_dir.stat().st_mode & 0o777) == "0o700"
    assert (job_dir / "job.sbatch").read_text().startswith("#!/bin/bash")
    lease = json.loads((job_dir / "lease").read_text())
    assert lease["pid"] == os.getpid() and lease["renew_every"] > 0 and lease["t"] > 0
    assert "--no-requeue" in (job_dir / "job.sbatch").read_text()
    await cluster.close_async()


async def test_a_silent_controller_keeps_the_last_state_and_the_lease_renewed(make_cluster, slurm):
    cluster = await ready(make_cluster, slurm, owner_timeout=5)  # lease renewed every 1.25 s
    lease = Path(cluster.job_dir) / "lease"
    slurm.down = True
    await until(lambda: cluster.status.slurm_unreachable_since, 5, "Slurm silence noticed")
    first = lease.read_text()
    await until(lambda: lease.read_text() != first, 5, "the lease renewed while Slurm is silent")
    assert cluster.state is State.READY
    assert "Slurm not answering for" in status_line(cluster.status)
    assert cluster.registry.load(cluster.id).slurm_unreachable_since is not None
    slurm.down = False
    await until(lambda: cluster.status.slurm_unreachable_since is None, 15, "Slurm back")
    assert cluster.state is State.READY
    await cluster.close_async()


async def test_silence_never_ends_a_cluster_but_slurm_forgetting_it_does(make_cluster, slurm):
    cluster = await ready(make_cluster, slurm)
    slurm.down = True
    await until(lambda: cluster.status.slurm_unreachable_since, 5, "silence noticed")
    await until(lambda: len(slurm.calls) > 10, 10, "more polls, all unanswered")
    assert cluster.state is State.READY
    slurm.down = False
    slurm.only_job().forgotten = True
    await until(lambda: cluster.state.is_final, 5, "the forgotten job to end")
    assert cluster.state is State.STOPPED and "no longer knows" in cluster.status.reason


async def test_the_state_is_final_only_once_slurm_says_so(make_cluster, slurm):
    cluster = await ready(make_cluster, slurm)
    emit(cluster, {"event": "stopped", "reason": "signal SIGTERM"})
    slurm.down = True
    await until(lambda: len(slurm.calls) > 10, 10, "polls")
    assert not cluster.state.is_final
    slurm.down = False
    slurm.end(cluster.job_id, "CANCELLED")
    await until(lambda: cluster.state is State.CANCELLED, 5, "CANCELLED")


async def test_node_fail_names_the_node_and_slurms_reason(make_cluster, slurm):
    cluster = await ready(make_cluster, slurm, nodes=2)
    slurm.only_job().nodes = "node[1-2]"
    slurm.node_reasons = {"node2": "Not responding"}
    slurm.end(cluster.job_id, "NODE_FAIL")
    await until(lambda: cluster.state is State.NODE_FAIL, 5, "NODE_FAIL")
    assert cluster.status.reason == "node2 failed: Not responding"


async def test_a_lost_worker_is_shown_with_the_nodes_left(make_cluster, slurm):
    cluster = await ready(make_cluster, slurm, nodes=2)
    emit(cluster, {"event": "ready", "joined": 2})
    await until(lambda: cluster.status.nodes_joined == 2, 5, "2 nodes")
    emit(
        cluster,
        {"event": "node_lost", "hosts": ["node2"], "reason": "1 node(s) left the cluster: node2"},
        {"event": "nodes", "joined": 1, "wanted": 2},
    )
    await until(lambda: cluster.status.nodes_lost, 5, "the lost node")
    status = cluster.status
    assert status.state is State.READY and status.reason == "node2 lost"
    assert (status.nodes_joined, status.nodes_wanted) == (1, 2)
    assert cluster.registry.load(cluster.id).nodes_lost == ["node2"]
    await cluster.close_async()


async def test_an_owner_gone_before_start_is_reported_as_such(make_cluster, slurm):
    cluster = await started(make_cluster, slurm)
    reason = "the owner's lease was last renewed 3:00:00 ago: the owner is gone"
    emit(cluster, {"event": "owner_gone", "reason": reason, "lease_age": 10800})
    slurm.end(cluster.job_id, "COMPLETED")
    await until(lambda: cluster.state.is_final, 5, "the end")
    assert cluster.state is State.STOPPED and cluster.status.reason == reason


async def test_a_refused_submit_leaves_no_record_and_no_job_dir(make_cluster, slurm, jobs_root):
    slurm.refuse_submit = "invalid partition specified: nope"
    cluster = make_cluster()
    with pytest.raises(SlurmError, match="invalid partition"):
        await cluster.up_async(wait=False)
    assert cluster.registry.all() == [] and list(jobs_root.iterdir()) == []


async def test_a_submit_without_answer_is_adopted_by_its_tag(make_cluster, slurm, transport):
    transport.hang_after = "sbatch"  # the job is queued, then the answer is lost
    cluster = make_cluster()
    await cluster.up_async(wait=False)
    assert cluster.job_id == slurm.only_job().job_id
    assert cluster.state is State.PENDING
    await cluster.down_async(timeout=5)
    assert slurm.only_job().state == "CANCELLED"


async def test_a_submit_without_answer_and_no_job_cleans_up(
    make_cluster, slurm, transport, jobs_root
):
    transport.hang_before = "sbatch"  # the answer is lost and nothing was queued
    cluster = make_cluster()
    with pytest.raises(SlurmError, match="no job was queued"):
        await cluster.up_async(wait=False)
    assert slurm.jobs == {} and cluster.registry.all() == [] and list(jobs_root.iterdir()) == []


async def test_a_job_dir_root_others_can_write_is_refused(make_cluster, tmp_path, slurm):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    cluster = make_cluster(job_dir_root=str(shared / "jobs"))
    with pytest.raises(SpecError, match="writable by other users") as refused:
        await cluster.up_async(wait=False)
    assert refused.value.field == "job_dir_root" and slurm.jobs == {}
    assert not (shared / "jobs").exists()


async def test_down_with_a_silent_controller_releases_the_lease(make_cluster, slurm):
    cluster = await ready(make_cluster, slurm)
    slurm.down = True
    status = await cluster.down_async(timeout=1)
    assert not cluster.lease.kept
    assert "stops by itself" in (status.notice or "")


async def test_a_stop_by_another_process_is_stopped_for_the_owner_too(
    make_cluster, slurm, transport, registry
):
    owner = await ready(make_cluster, slurm)
    other = SlurmRayCluster.from_record(registry.load(owner.id), transport, registry=registry)
    stopped = await other.down_async(timeout=5)
    assert stopped.state is State.STOPPED
    await until(lambda: owner.state.is_final, 5, "the owner sees the end")
    assert owner.state is State.STOPPED, status_line(owner.status)
    assert owner.status.reason == f"stopped by pid {os.getpid()} on {socket.gethostname()}"
    assert registry.load(owner.id).state == "STOPPED"
    await other.close_async()


async def test_a_forgotten_record_is_not_written_again_by_its_owner(make_cluster, slurm):
    cluster = await started(make_cluster, slurm)
    slurm.end(cluster.job_id, "CANCELLED")
    await until(lambda: cluster.state.is_final, 5, "the end")
    cluster.registry.delete(cluster.id)  # forgotten from the sidebar meanwhile
    cluster._save_record()  # the owner's next update, e.g. its forwards closing
    assert cluster.registry.load(cluster.id) is None
    await cluster.close_async()
