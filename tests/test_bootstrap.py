"""The bootstrap directory on real Ray clusters on the Slurm testbed, as alice (its pure helpers
are tested in tests/fast/test_bootstrap_*.py).

The cluster tests submit their own small sbatch scripts (tests/helpers/bootstrap.py) and judge
only what a client can see: events.jsonl, connection.json, squeue, /proc, and a Ray Client
session in a subprocess.
"""

from __future__ import annotations

import os
import platform
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from jupyter_slurm_ray.bootstrap.jsr_wire import default_object_store_mb, ray_memory_mb

from .helpers.bootstrap import (
    DEFAULT_SETUP,
    JobDir,
    assert_cleaned_up,
    cancel_and_check_cleanup,
    cancel_leftovers,
    claims,
    in_node,
    log,
    processes_matching,
    python_listener,
    run_ray_client,
    scancel,
    wait_until_gone,
)
from .helpers.jobs import queue_state


@pytest.fixture
def jobs(testbed) -> Iterator[list[JobDir]]:
    """Job dirs a test submits; whatever still runs afterwards is cancelled."""
    created: list[JobDir] = []
    yield created
    cancel_leftovers(created)


def log_ready_time(what: str, job: JobDir) -> None:
    ready = next(e for e in job.events() if e["event"] == "ready")
    queued = job.events()[0]["t"] - (time.time() - (time.monotonic() - job.submitted_at))
    log(f"{what}: job start -> ready {ready['elapsed']:.1f} s (queued {queued:.1f} s)")


def assert_ports_are_claimed_and_open(job: JobDir, connection: dict) -> None:
    ports = connection["ports"]
    mine = [c for c in claims() if c["job_id"] == job.job_id]
    assert len(mine) == connection["node_count"]
    head_claim = next(c for c in mine if c["host"] == connection["head_host"])
    assert head_claim["start"] == ports["node_manager"]
    assert (
        head_claim["size"]
        == 6 + job.settings["worker_ports"]
        == ports["max_worker"] - ports["node_manager"] + 1
    )
    # the GCS's port is kernel-assigned, outside the block; every port told is verified
    assert not head_claim["start"] <= ports["gcs"] < head_claim["start"] + head_claim["size"]
    assert connection["verified"]["listeners"] == {
        **{name: ports[name] for name in ("client", "dashboard", "gcs")},
        "relay": connection["dashboard_port"],  # with TLS, what clients use
    }
    assert connection["tls"] and connection["dashboard_port"] != ports["dashboard"]
    for name in ("gcs", "client", "dashboard"):
        with socket.create_connection((connection["head_ip"], ports[name]), timeout=2):
            pass


def assert_dashboard_needs_the_token(connection: dict) -> None:
    url = f"http://{connection['head_ip']}:{connection['ports']['dashboard']}/api/v0/nodes"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with pytest.raises(urllib.error.HTTPError) as refused:
        opener.open(url, timeout=5)
    assert refused.value.code in (401, 403)


@pytest.mark.testbed
@pytest.mark.ray
def test_three_node_cluster(jobs: list[JobDir]) -> None:
    job = JobDir.create(nodes=3)
    jobs.append(job)
    job.submit(extra_sbatch=["--gres=gpu:1"])
    connection = job.wait_ready()
    log_ready_time("3 nodes", job)

    assert connection["node_count"] == 3
    assert sorted(n["host"] for n in connection["nodes"]) == ["node1", "node2", "node3"]
    assert connection["gcs_address"] == f"{connection['head_ip']}:{connection['ports']['gcs']}"
    # the venv the tests run from is the cluster's (Debian 12's Python 3.11, trixie's 3.13)
    assert (connection["ray_version"], connection["python_version"]) == (
        "2.60.0",
        platform.python_version(),
    )
    assert (job.path / "connection.json").stat().st_mode & 0o777 == 0o600
    assert_ports_are_claimed_and_open(job, connection)
    assert_dashboard_needs_the_token(connection)
    phases = [e["phase"] for e in job.events() if e["event"] == "phase"]
    assert phases == [
        "bootstrap", "workers_starting", "ports", "head_starting", "head_up",
        "waiting_for_nodes", "ready",
    ]  # fmt: skip

    used = run_ray_client(job)
    assert used["hosts"] == ["node1", "node2", "node3"]
    assert used["resources"]["GPU"] == 3 and used["resources"]["CPU"] == 3

    scancel(job.job_id, options=("--signal=USR1", "--batch"))
    job.wait_for_event(lambda e: e["event"] == "walltime_warning", 10)
    time.sleep(1)
    assert queue_state(job.job_id) == "RUNNING"
    assert not [e for e in job.events() if e["event"] in ("stopping", "stopped")]

    log(f"3 nodes: scancel -> clean {cancel_and_check_cleanup(job):.1f} s")
    stopped = [e for e in job.events() if e["event"] == "worker_stopped"]
    assert sorted(e["host"] for e in stopped) == ["node2", "node3"]


@pytest.mark.testbed
@pytest.mark.ray
def test_two_clusters_share_a_node(jobs: list[JobDir]) -> None:
    pair = [JobDir.create(nodes=1, object_store_memory=None) for _ in range(2)]
    jobs.extend(pair)
    pair[0].submit(extra_sbatch=["--mem=1000"])
    node = pair[0].wait_started()["host"]  # whichever node is free on the shared testbed
    pair[1].submit(extra_sbatch=[f"--nodelist={node}", "--mem=1000"])
    connections = [job.wait_ready() for job in pair]
    for job in pair:
        log_ready_time("1 node (2 at once)", job)

    assert [c["head_host"] for c in connections] == [node, node]
    first, second = ({*c["ports"].values()} for c in connections)
    assert not first & second
    assert connections[0]["temp_dir"] != connections[1]["temp_dir"]
    for job, connection in zip(pair, connections, strict=True):
        assert_ports_are_claimed_and_open(job, connection)
    with ThreadPoolExecutor(2) as pool:  # two client subprocesses at once
        usage = list(pool.map(run_ray_client, pair))
    for used in usage:
        assert used["hosts"] == [node]
        assert used["resources"]["CPU"] == 1
        # what Ray's processes leave of the job's 1000 MB (30 % at most): jsr_wire's model
        store_mb = default_object_store_mb(1000, ray_memory_mb(True, 1))
        assert used["resources"]["object_store_memory"] == store_mb * 1024 * 1024
    for job in pair:
        cancel_and_check_cleanup(job)


@pytest.mark.testbed
@pytest.mark.ray
def test_stale_lease_stops_the_cluster_unless_detached(jobs: list[JobDir]) -> None:
    owned = JobDir.create(nodes=2, owner_timeout=8.0)
    detached = JobDir.create(nodes=1, owner_timeout=8.0)
    detached.detach()
    jobs.extend([owned, detached])
    for job in (owned, detached):
        job.submit()
    beat, started = 0, time.monotonic()
    # the owner is alive from the submission on: on a busy testbed the job may wait in the
    # queue for longer than owner_timeout
    while not [e for e in owned.events() if e["event"] == "ready"]:
        assert time.monotonic() - started < 150, owned.diagnostics()
        beat += 1
        owned.lease(f"{beat}\n")
        last_beat = time.monotonic()
        time.sleep(2)
    detached.wait_ready(60)
    detached_ready = time.monotonic()

    stale = owned.wait_for_event(lambda e: e["event"] == "lease_stale", 20)
    assert stale["owner_timeout"] == 8.0
    assert time.monotonic() - last_beat >= 8
    wait_until_gone(owned.job_id, 10)
    assert [e for e in owned.events() if e["event"] == "stopped"][-1]["reason"] == "lease_stale"
    assert_cleaned_up(owned)

    time.sleep(max(0.0, detached_ready + 12 - time.monotonic()))
    assert queue_state(detached.job_id) == "RUNNING"
    assert not [e for e in detached.events() if e["event"] in ("lease_stale", "stopping")]
    cancel_and_check_cleanup(detached)


@pytest.mark.testbed
@pytest.mark.ray
def test_missing_ray_fails_fast(jobs: list[JobDir]) -> None:
    job = JobDir.create(nodes=1)
    jobs.append(job)
    job.submit(setup="export PATH=/usr/bin:/bin", python="/usr/bin/python3")
    error = job.wait_for_event(lambda e: e["event"] == "error", 60, fail_on_error=False)
    assert "`ray` command is not on PATH (/usr/bin:/bin)" in error["reason"]
    assert "ray[default]" in error["reason"]
    began = next(e for e in job.events() if e.get("phase") == "bootstrap")
    assert error["t"] - began["t"] < job.settings["start_timeout"] / 2  # not by the timeout
    wait_until_gone(job.job_id, 10)
    assert job.events()[-1]["event"] == "stopped" and job.events()[-1]["exit_code"] == 1


@pytest.mark.testbed
@pytest.mark.ray
def test_fixed_port_in_use_fails_fast(jobs: list[JobDir]) -> None:
    busy = 24000 + os.getpid() % 2000
    listener = subprocess.Popen(
        in_node(1, *python_listener(busy)), stdout=subprocess.PIPE, text=True
    )
    try:
        assert listener.stdout is not None and listener.stdout.readline().strip() == "listening"
        job = JobDir.create(nodes=1, port_strategy="fixed", fixed_port_base=busy - 1)
        jobs.append(job)
        job.submit(extra_sbatch=["--nodelist=node1"])
        error = job.wait_for_event(lambda e: e["event"] == "error", 20, fail_on_error=False)
        assert f"port {busy} (object_manager) is already in use on node1" in error["reason"]
        wait_until_gone(job.job_id, 10)
    finally:
        listener.terminate()
        listener.wait(5)


@pytest.mark.testbed
@pytest.mark.ray
def test_a_worker_that_cannot_start_fails_the_cluster_fast(jobs: list[JobDir]) -> None:
    command = (
        'if [ "$(hostname)" = node2 ]; then echo nothing-here; exit 3; fi; '
        'ip -o -4 addr show scope global | awk \'{sub("/.*", "", $4); print $4; exit}\''
    )
    job = JobDir.create(nodes=2, node_ip_address_command=command)
    jobs.append(job)
    job.submit(extra_sbatch=["--nodelist=node1,node2"])
    error = job.wait_for_event(
        lambda e: e["event"] == "error" and e["role"] == "head", 60, fail_on_error=False
    )
    assert error["reason"].startswith("the worker on node2 failed: node_ip_address_command")
    # found by the head from the worker's own report, not by waiting out the start timeout
    assert not [e for e in job.events() if e["event"] == "ready"]
    began = next(e for e in job.events() if e.get("phase") == "bootstrap")
    assert error["t"] - began["t"] < job.settings["start_timeout"] / 2
    wait_until_gone(job.job_id, 15)
    assert_cleaned_up(job)


def pids_of(marker: str, program: str) -> list[int]:
    return [pid for pid, cmd in processes_matching([marker]) if program in cmd.split(" ")[0]]


def nodes_event(joined: int, after: float) -> Callable[[dict], bool]:
    return lambda e: e["event"] == "nodes" and e["t"] >= after and e["joined"] == joined


@pytest.mark.testbed
@pytest.mark.ray
def test_each_lost_worker_and_a_dead_head_are_reported(jobs: list[JobDir]) -> None:
    job = JobDir.create(nodes=3)
    jobs.append(job)
    # a job submitted with a list of names: srun would pass on only those without --export=ALL
    probe = "JSR_SETUP_PROBE=from-the-batch-shell"
    job.submit(extra_sbatch=["--export=PATH,HOME,USER"], setup=f"{DEFAULT_SETUP}; export {probe}")
    connection = job.wait_ready()
    starts = {e["host"]: e for e in job.events() if e["event"] == "worker_starting"}  # last
    workers = [starts[host] for host in sorted(starts)]
    head = next(e for e in job.events() if e.get("phase") == "head_starting")
    everyone = sorted(n["host"] for n in connection["nodes"])
    for worker in workers:  # the environment the setup lines built reached the workers
        raylets = pids_of(worker["temp_dir"], "raylet")
        assert raylets and probe.encode() in Path(f"/proc/{raylets[0]}/environ").read_bytes()

    for left, worker in enumerate(workers, start=1):  # one loss, then a second one
        for pid in pids_of(worker["temp_dir"], "raylet"):  # this test's own cluster, by pid
            os.kill(pid, signal.SIGKILL)
        lost = job.wait_for_event(
            lambda e, host=worker["host"]: e["event"] == "node_lost" and e["hosts"] == [host], 45
        )
        assert lost["log"], lost
        assert lost["reason"] in (
            f"1 node(s) left the cluster: {worker['host']}",  # seen by the head's state API
            "the worker step (srun) exited with status 1: no Ray worker nodes left",  # the last
        )
        assert (lost["joined"], lost["wanted"]) == (3 - left, 3)
        alive = [h for h in everyone if h not in {w["host"] for w in workers[:left]}]
        # the head's state API may see the loss only after the worker step ended
        nodes = job.wait_for_event(nodes_event(joined=3 - left, after=lost["t"] - 1), 45)
        assert (nodes["joined"], nodes["wanted"], nodes["hosts"]) == (3 - left, 3, alive)
    assert len([e for e in job.events() if e["event"] == "node_lost"]) == 2
    assert queue_state(job.job_id) == "RUNNING"

    for pid in pids_of(head["temp_dir"], "gcs_server"):
        os.kill(pid, signal.SIGKILL)
    error = job.wait_for_event(lambda e: e["event"] == "error", 30, fail_on_error=False)
    assert error["reason"].startswith("`ray start --head` exited with status")
    assert any("ray-head-" in line for line in error["log"])
    wait_until_gone(job.job_id, 15)
    assert_cleaned_up(job)
