"""Adaptive scaling on the real testbed (issue 9, item 4): Ray's pending tasks grow the cluster
with worker jobs and idle ones are retired (no submit/cancel loop); with the partition held by
another user, adapt keeps at most max_pending jobs waiting, PENDING with Slurm's reason, the same
ones poll after poll, and they join once the blocker ends; bad input changes nothing.

One-CPU Ray nodes, each its own Slurm node (``exclusive``), so every Ray node has its own
address; the head's node is one of the solo partition's three (``solo``: these tests run one at
a time beside the rest). The test that pauses slurmctld runs alone (``exclusive``), on a
cluster of its own.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from jupyter_slurm_ray.aio import background_loop
from jupyter_slurm_ray.cluster import SlurmRayCluster
from jupyter_slurm_ray.errors import Conflict, SpecError
from jupyter_slurm_ray.naming import worker_job_comment
from jupyter_slurm_ray.registry import Registry
from jupyter_slurm_ray.slurm.schedulers import watcher_for
from jupyter_slurm_ray.transport import LocalTransport

from .helpers.clusters import client_tls_environment, cluster_spec, last_json_line, processes_of
from .helpers.faults import controller_paused, record_figure
from .helpers.jobs import accounted_jobs, idle_nodes, in_queue, jobs_with_comment, queue_state
from .helpers.testbed import SOLO, USER, runuser
from .helpers.waiting import wait_for

pytestmark = [pytest.mark.testbed, pytest.mark.ray, pytest.mark.solo]  # whole nodes

QUEUE_WAIT = 300  # the previous solo test's jobs may still be ending
IDLE = 5.0  # seconds a worker node runs nothing before adapt retires it

WORKLOAD = """
import json, socket, sys, time, ray
from jupyter_slurm_ray.client.connect import connect_ray_client
connect_ray_client(sys.argv[1], sys.argv[2], timeout=30)

@ray.remote(num_cpus=1)
def work(i, seconds):
    time.sleep(seconds)
    return i, socket.gethostname()

refs = [work.remote(i, float(sys.argv[4])) for i in range(int(sys.argv[3]))]
print("submitted", flush=True)
done = ray.get(refs)
print(json.dumps({"done": sorted(i for i, _ in done), "hosts": sorted({h for _, h in done})}))
"""


def adapting_cluster(tmp_path_factory) -> Iterator[SlurmRayCluster]:
    """A 1-node cluster on the solo partition, up; at the end down, and nothing left."""
    registry = Registry(tmp_path_factory.mktemp("state"))
    spec = cluster_spec(partition=SOLO, cpus_per_node=1, exclusive=True, owner_timeout=60)
    cluster = SlurmRayCluster(spec, LocalTransport(runuser("alice")), registry=registry)
    cluster.up(connect=False, queue_timeout=QUEUE_WAIT)
    yield cluster
    cluster.down()
    leftover = [job_id for job_id in cluster.workers.jobs if in_queue(job_id)]
    subprocess.run(["scancel", *leftover], check=False, capture_output=True)
    assert not leftover, f"worker jobs left in the queue: {leftover}"
    wait_for(lambda: not processes_of(cluster.job_dir), 30, "the cluster's processes to end")
    record = registry.load(cluster.id)
    assert record is not None and record.state in ("CANCELLED", "STOPPED")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, solo_nodes) -> Iterator[SlurmRayCluster]:
    yield from adapting_cluster(tmp_path_factory)


@pytest.fixture
def own_cluster(tmp_path_factory, solo_nodes) -> Iterator[SlurmRayCluster]:
    yield from adapting_cluster(tmp_path_factory)


def start_workload(cluster: SlurmRayCluster, tasks: int, seconds: float) -> subprocess.Popen:
    token = cluster.registry.store_token(
        cluster.id, Path(f"{cluster.job_dir}/ray_token").read_text().strip()
    )
    info = cluster.connection_info()
    address = f"ray://{info.head_ip}:{info.client_port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(client_tls_environment(cluster.job_dir))
    program = textwrap.dedent(WORKLOAD)
    workload = subprocess.Popen(
        [sys.executable, "-c", program, address, str(token), str(tasks), str(seconds)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert workload.stdout is not None
    assert workload.stdout.readline().strip() == "submitted"
    return workload


def finish(workload: subprocess.Popen) -> dict:
    try:
        out, err = workload.communicate(timeout=240)
    finally:
        if workload.poll() is None:
            workload.kill()
    try:
        return last_json_line(out)
    except AssertionError:
        raise AssertionError(f"the workload failed: {err[-2000:]}") from None


def adapt_moves(cluster: SlurmRayCluster, since: float) -> tuple[list[str], list[str]]:
    """Every worker job adapt submitted and retired since ``since``, from its ``scaled``
    events (the module's tests share one cluster)."""
    cluster.refresh()
    submitted, retired = [], []
    for event in unique_events(cluster):
        if event["t"] < since:
            continue
        if event.get("event") == "scaled" and str(event.get("cause")).startswith("adapt:"):
            submitted += event["submitted"]
            retired += event["retired"]
    return submitted, retired


def unique_events(cluster: SlurmRayCluster) -> list[dict]:
    """The cluster's events, each once (a refresh racing the watcher's tick may read a line
    twice: seen in this test's first runs)."""
    seen, unique = set(), []
    for event in cluster.events:
        key = json.dumps(event, sort_keys=True)
        if key not in seen:
            seen.add(key)
            unique.append(event)
    return unique


def alive(cluster: SlurmRayCluster) -> int:
    return cluster.refresh().nodes_joined


def test_bad_input_is_one_line_and_changes_nothing(cluster):
    before = (cluster.status.nodes_wanted, dict(cluster.workers.jobs))
    bad = [
        dict(minimum=-1, maximum=3),
        dict(minimum=1, maximum=1.5),
        dict(minimum="two", maximum=3),
        dict(minimum=3, maximum=2),
        dict(minimum=1, maximum=3, idle_timeout=-1),
        dict(minimum=1, maximum=3, max_pending=0),
        dict(minimum=1, maximum=3, group="gpu"),
    ]
    for kwargs in bad:
        with pytest.raises(SpecError) as caught:
            cluster.adapt(**kwargs)
        assert "\n" not in str(caught.value)
    assert cluster.adapting is None
    assert (cluster.status.nodes_wanted, dict(cluster.workers.jobs)) == before


def test_grows_for_pending_tasks_and_shrinks_when_idle_without_a_loop(cluster):
    # the two nodes it grows to must be free first (the last solo test's jobs may still end)
    wait_for(lambda: idle_nodes(SOLO) >= 2, QUEUE_WAIT, "two idle nodes")
    started = time.time()
    cluster.adapt(minimum=1, maximum=3, idle_timeout=IDLE, max_pending=2)
    try:
        # 144 s of work in short tasks: a worker that joins late under load still gets some
        workload = start_workload(cluster, tasks=24, seconds=6)
        wait_for(lambda: alive(cluster) == 3, QUEUE_WAIT, "3 nodes alive")
        result = finish(workload)
        assert result["done"] == list(range(24))
        assert len(result["hosts"]) == 3  # the worker nodes did work
        wait_for(
            lambda: cluster.refresh().nodes_wanted == 1 and not cluster.status.worker_jobs,
            90,
            "adapt to shrink to the minimum",
        )
        # the decision's event follows the drained job's end
        wait_for(lambda: len(adapt_moves(cluster, started)[1]) >= 2, 30, "both retired")
        submitted, retired = adapt_moves(cluster, started)
    finally:
        cluster.stop_adapting()
    assert len(submitted) == 2, submitted  # exactly the two it needed: no loop
    assert sorted(retired) == sorted(submitted)
    assert sorted(cluster.workers.jobs) == sorted(submitted)  # no other sbatch (first test)
    for job_id in submitted:
        wait_for(lambda job_id=job_id: not in_queue(job_id), 30, f"worker job {job_id} to end")
    # Slurm's own count, independent of the cluster's events: the worker jobs its accounting
    # knows for this cluster (by name, in its job dir), each ended: cancelled by alice, or
    # completed (a drained worker leaves by itself)
    ended = (f"CANCELLED by {pwd.getpwnam(USER).pw_uid}", "COMPLETED")
    accounted = wait_for(
        lambda: (
            (jobs := accounted_jobs(f"{cluster.spec.name}-worker", cluster.job_dir, started))
            and not {"PENDING", "RUNNING", "COMPLETING"} & set(jobs.values())
            and jobs
        ),
        30,
        "sacct to record the end of every worker job",
    )
    assert all(state in ended for state in accounted.values()), accounted
    assert sorted(accounted) == sorted(submitted), accounted  # no other sbatch, no loop
    assert len(accounted) <= 3 - 1  # maximum=3 Ray nodes: the head's and 2 worker jobs
    causes = [e["cause"] for e in cluster.events if e.get("event") == "scaled"]
    assert any("pending tasks/actors need" in cause for cause in causes)
    assert any("idle" in cause for cause in causes)
    assert alive(cluster) == 1


@pytest.fixture
def blocker():
    """bob's job holding the solo partition's other two nodes, once a job of the last solo
    test has ended on them: holding only one while such a job ends on the other, it left a node
    that freed up later, where a worker job meant to stay pending started (seen under load)."""
    wait_for(lambda: idle_nodes(SOLO) >= 2, QUEUE_WAIT, "the two other nodes idle")
    done = subprocess.run(
        [*runuser("bob"), "sbatch", "--parsable", "-p", SOLO, "-N2", "--exclusive", "-t", "5",
         "-J", "adapt-blocker", "-D", "/tmp", "-o", "/dev/null", "--wrap", "sleep 300"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    job_id = done.stdout.strip().split(";")[0]
    try:
        wait_for(lambda: queue_state(job_id) != "PENDING", QUEUE_WAIT, "bob's job to start")
        assert queue_state(job_id) == "RUNNING"
        yield job_id
    finally:
        subprocess.run(["scancel", job_id], check=False, capture_output=True)


def test_a_full_partition_keeps_max_pending_jobs_waiting_without_churn(cluster, blocker):
    started = time.time()
    cluster.adapt(minimum=1, maximum=3, idle_timeout=IDLE, max_pending=1)
    try:
        # the head alone would need 80 s: the demand lasts until the worker node joins
        workload = start_workload(cluster, tasks=4, seconds=20)
        wait_for(lambda: cluster.refresh().worker_jobs_pending, 60, "a worker job PENDING")
        watcher = watcher_for(cluster.transport)
        waiting = [job.job_id for job in cluster.status.worker_jobs]
        polls = watcher.polls
        wait_for(lambda: watcher.polls >= polls + 4, 60, "four more polls")
        status = cluster.refresh()
        assert [job.job_id for job in status.worker_jobs] == waiting  # no churn
        assert len(waiting) == 1  # max_pending, though the demand wants 2 more nodes
        (pending,) = status.worker_jobs_pending
        assert pending.reason in ("Resources", "Priority", "ReqNodeNotAvail")
        shown = cluster._repr_mimebundle_()["text/plain"]
        assert f"job {pending.job_id} PENDING ({pending.reason}" in shown
        assert "adapting 1-3 nodes" in shown
        assert queue_state(pending.job_id) == "PENDING"
        subprocess.run(["scancel", blocker], check=True)
        result = finish(workload)
        assert result["done"] == list(range(4))
        submitted, _ = adapt_moves(cluster, started)
        assert submitted[0] == waiting[0]  # the job that waited is the one that joined

        def joined() -> bool:  # told once the head's nodes.json names its node: seconds later
            cluster.refresh()
            kinds = [e["event"] for e in cluster.events if e.get("worker_job") == waiting[0]]
            return "worker_joined" in kinds

        wait_for(joined, 30, "the waiting job's worker_joined")
        wait_for(
            lambda: cluster.refresh().nodes_wanted == 1 and not cluster.status.worker_jobs,
            90,
            "adapt to shrink to the minimum",
        )
    finally:
        cluster.stop_adapting()


def cli(cluster: SlurmRayCluster, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """`jupyter slurm-ray ARGS…` in a terminal of this machine, as the test user."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER_SLURM_RAY_")}
    environ.update(
        JUPYTER_SLURM_RAY_STATE_DIR=str(cluster.registry.path),
        JUPYTER_SLURM_RAY_COMMAND_PREFIX=" ".join(runuser("alice")),
    )
    argv = [sys.executable, "-m", "jupyter_slurm_ray.ui.cli", *args]
    done = subprocess.run(argv, env=environ, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 or not check, done.stderr
    return done


def test_the_cli_asks_the_owning_process_to_adapt_and_to_stop(cluster):
    """`jupyter slurm-ray adapt NAME …` in a terminal: the owner (this process) applies it."""

    def adapt(*args: str) -> str:
        return cli(cluster, "adapt", cluster.spec.name, *args).stdout

    assert "asked of its owner" in adapt("--maximum", "2", "--idle", "30")
    wait_for(lambda: cluster.refresh() and cluster.adapting, 30, "the owner adapting")
    assert (cluster.adapting.settings.maximum, cluster.adapting.settings.idle_timeout) == (2, 30)
    assert cluster.status.scaling[0].startswith("adapting 1-2 nodes (idle 30 s")
    adapt("--off")
    wait_for(lambda: cluster.refresh() and cluster.adapting is None, 30, "adapting stopped")


def sbatch_in_flight(user: str) -> bool:
    """An sbatch of ``user`` is running. The script comes on its stdin (nothing names the
    cluster in its command line); this module's tests run one at a time, as alice."""
    uid = pwd.getpwnam(user).pw_uid
    for pid in os.listdir("/proc"):
        try:
            if not pid.isdigit() or os.stat(f"/proc/{pid}").st_uid != uid:
                continue
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and os.path.basename(argv[0]) == b"sbatch":
            return True
    return False


@pytest.mark.exclusive  # slurmctld paused
def test_scale_is_refused_while_adapting_and_down_during_a_scale_out_leaves_no_job(own_cluster):
    """Issue 18, item 6. Adapt running: a manual scale is refused with adapt's bounds, from this
    process and from the CLI. Then, with slurmctld paused, a scale-out's sbatch is in flight,
    the caller is interrupted (as a cell is) and down is issued: down waits for the sbatch, and
    cancels the job it queued; Slurm's own count of the cluster's worker jobs is that one job,
    cancelled."""
    cluster = own_cluster
    started, before = time.time(), set(cluster.workers.jobs)
    cluster.adapt(minimum=1, maximum=2, idle_timeout=IDLE, max_pending=1)
    try:
        refusal = "is adapting between 1 and 2 nodes: change that with `adapt --minimum N"
        with pytest.raises(Conflict, match=re.escape(refusal)):
            cluster.scale(2)
        done = cli(cluster, "scale", "2", cluster.spec.name, check=False)
        assert done.returncode == 1 and refusal in done.stderr, done.stderr
    finally:
        cluster.stop_adapting()
    assert set(cluster.workers.jobs) == before  # nothing submitted by either
    with ThreadPoolExecutor(1) as pool:
        with controller_paused():
            scaling = asyncio.run_coroutine_threadsafe(cluster.scale_async(2), background_loop())
            wait_for(lambda: sbatch_in_flight(USER), 10, "the worker job's sbatch", step=0.05)
            scaling.cancel()  # the cell that scaled is interrupted: sbatch is not killed
            stopping = pool.submit(cluster.down)
            time.sleep(1)
            assert not stopping.done() and sbatch_in_flight(USER)
            resumed = time.monotonic()  # slurmctld goes on as the block ends
        stopping.result(timeout=120)
        down_after_resume = time.monotonic() - resumed
    new = set(cluster.workers.jobs) - before
    assert len(new) == 1, cluster.workers.jobs  # the job of the sbatch in flight, recorded
    tag = worker_job_comment(cluster.id)
    active = ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING")
    wait_for(
        lambda: all(queue_state(job_id) not in active for job_id in jobs_with_comment(tag)),
        30,
        "no worker job of the cluster left in Slurm's queue",
    )
    accounted = wait_for(
        lambda: (
            (jobs := accounted_jobs(f"{cluster.spec.name}-worker", cluster.job_dir, started))
            and set(jobs) - before == new
            and not set(active) & set(jobs.values())
            and jobs
        ),
        30,
        "sacct to record the worker job's end",
    )
    uid = pwd.getpwnam(USER).pw_uid
    assert {accounted[job_id] for job_id in new} == {f"CANCELLED by {uid}"}, accounted
    assert cluster.state.is_final
    record_figure(
        "down while a worker job's sbatch is in flight (slurmctld paused, the scale interrupted)",
        worker_jobs_queued=len(new),
        worker_jobs_left=0,
        down_returned_after_resume_s=round(down_after_resume, 1),
    )
