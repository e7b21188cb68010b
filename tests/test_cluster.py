"""SlurmRayCluster against the real testbed: real sbatch, real Ray, token auth, as alice.

The tests use the blocking facade, as a notebook would. Only one Ray Client connection can live
in a process, so in-process connections happen one at a time; parallel clients run in
subprocesses.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time

import pytest
import ray

from jupyter_slurm_ray.cluster import SlurmRayCluster
from jupyter_slurm_ray.errors import ConnectError, RayStartError
from jupyter_slurm_ray.registry import Registry
from jupyter_slurm_ray.states import State
from jupyter_slurm_ray.transport import LocalTransport

from .helpers.clusters import (
    ONE_TASK_PER_NODE,
    cluster_spec,
    processes_of,
    ray_in_subprocess,
    ray_result,
    wait_until_nothing_left,
)
from .helpers.jobs import in_queue
from .helpers.kernel import start_kernel
from .helpers.testbed import runuser
from .helpers.waiting import wait_for

pytestmark = [pytest.mark.testbed, pytest.mark.ray]


@pytest.fixture(scope="module")
def registry(tmp_path_factory) -> Registry:
    return Registry(tmp_path_factory.mktemp("state"))


def new_cluster(registry: Registry, user: str = "alice", **spec) -> SlurmRayCluster:
    return SlurmRayCluster(cluster_spec(**spec), LocalTransport(runuser(user)), registry=registry)


def store_token(cluster: SlurmRayCluster):
    """A local copy of the cluster's token, as connect() makes one (read here as root)."""
    with open(f"{cluster.job_dir}/ray_token") as f:
        return cluster.registry.store_token(cluster.id, f.read().strip())


@pytest.fixture(scope="module")
def one_node(registry):
    """A connected 1-node cluster shared by the tests below (in file order)."""
    cluster = new_cluster(registry)
    seen: list[State] = []
    cluster.add_observer(lambda status: seen.append(status.state))
    cluster.up()
    cluster.seen = seen
    yield cluster
    cluster.down()


@pytest.mark.compat
def test_up_reports_every_state_in_order_and_connects(one_node):
    states = list(dict.fromkeys(one_node.seen))
    assert states == [State.PENDING, State.STARTING, State.READY, State.CONNECTED]
    assert one_node.state is State.CONNECTED
    assert [s.at for s in one_node.history] == sorted(s.at for s in one_node.history)
    assert ray.is_initialized()

    @ray.remote(num_cpus=0)
    def where() -> str:
        return socket.gethostname()

    assert ray.get(where.remote()) in {"node1", "node2", "node3"}
    assert len([n for n in ray.nodes() if n["Alive"]]) == 1


def test_status_and_logs_tell_the_truth(one_node):
    status = one_node.refresh()
    assert status.state is State.CONNECTED and status.nodes_joined == 1
    assert status.time_left is not None and 0 < status.time_left <= 600
    record = one_node.registry.load(one_node.id)
    assert record is not None and record.state == "CONNECTED" and record.job_id == one_node.job_id
    node = status.nodes[0]
    assert "ray start" in one_node.logs(node=node, tail=200) or one_node.logs(node=node)


def test_a_client_without_the_token_cannot_connect(one_node):
    info = one_node.connection
    address = f"ray://{info.head_ip}:{info.client_port}"
    started = time.monotonic()
    result = ray_in_subprocess(  # with the cluster's certificate: the token is still needed
        address,
        None,
        "print(json.dumps('connected'))",
        env={"RAY_CLIENT_MAX_CONNECTION_TIMEOUT_S": "5", "RAY_AUTH_MODE": "disabled"},
        job_dir=one_node.job_dir,
    )
    assert result.returncode != 0 and '"connected"' not in result.stdout
    assert time.monotonic() - started < 80


def test_a_client_with_the_token_but_not_the_clusters_certificate_cannot_connect(one_node):
    """A token that got out is useless alone: every gRPC port asks for a certificate of the
    cluster's CA before anything else (Ray Client here)."""
    info = one_node.connection
    token = store_token(one_node)
    address = f"ray://{info.head_ip}:{info.client_port}"
    started = time.monotonic()
    result = ray_in_subprocess(  # Ray's own ray.init, with the token and without retries
        address,
        None,
        "print(json.dumps('connected'))",
        env={
            "RAY_CLIENT_MAX_CONNECTION_TIMEOUT_S": "5",
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(token),
        },
    )
    assert result.returncode != 0 and '"connected"' not in result.stdout
    assert time.monotonic() - started < 80


def test_the_other_user_cannot_read_the_token_or_the_job_dir(one_node, testbed):
    other = runuser(testbed.user2)
    for argv in (["cat", f"{one_node.job_dir}/ray_token"], ["ls", one_node.job_dir]):
        result = subprocess.run([*other, *argv], capture_output=True, text=True)
        assert result.returncode != 0 and "Permission denied" in result.stderr
    assert os.stat(one_node.job_dir).st_mode & 0o777 == 0o700
    assert os.stat(f"{one_node.job_dir}/ray_token").st_mode & 0o777 == 0o600


def test_version_mismatch_is_refused_naming_both_versions(one_node):
    one_node.disconnect()
    assert one_node.state is State.READY
    path = f"{one_node.job_dir}/connection.json"
    with open(path) as f:
        original = f.read()
    data = json.loads(original)
    data["ray_version"] = "2.9.3"
    one_node._client.connection = None  # read connection.json again
    try:
        with open(path, "w") as f:
            json.dump(data, f)
        with pytest.raises(ConnectError) as info:
            one_node.connect()
        assert "Ray 2.9.3" in str(info.value) and f"Ray {ray.__version__}" in str(info.value)
    finally:
        with open(path, "w") as f:
            f.write(original)
        one_node._client.connection = None
    cached = one_node._client.connection
    if cached is not None and cached.ray_version != ray.__version__:
        one_node._client.connection = None  # the cluster's poll read the edited file meanwhile
    one_node.connect()
    assert one_node.state is State.CONNECTED


def test_scancel_from_outside_is_cancelled_and_ray_calls_fail_fast(one_node):
    subprocess.run(["scancel", one_node.job_id], check=True)
    wait_for(lambda: one_node.state.is_final, 30, "the cluster to notice the cancel")
    assert one_node.state is State.CANCELLED
    assert "cancelled" in (one_node.status.reason or "")

    @ray.remote(num_cpus=0)
    def nothing() -> None:
        return None

    started = time.monotonic()
    with pytest.raises(Exception):  # noqa: B017 - any clear Ray error; the point is: no hang
        ray.get(nothing.remote(), timeout=60)
    assert time.monotonic() - started < 30
    wait_until_nothing_left(one_node.job_id, one_node.job_dir)


@pytest.mark.compat
def test_three_nodes_run_one_task_each_and_down_leaves_nothing(registry):
    cluster = new_cluster(registry, nodes=3)
    try:
        cluster.up(connect=False)
        assert cluster.status.nodes_joined == 3
        info = cluster.connection_info()
        token = store_token(cluster)
        address = f"ray://{info.head_ip}:{info.client_port}"
        result = ray_in_subprocess(address, str(token), ONE_TASK_PER_NODE, job_dir=cluster.job_dir)
        assert ray_result(result) == ["node1", "node2", "node3"]
    finally:
        started = time.monotonic()
        status = cluster.down()
    assert status.state is State.STOPPED
    wait_until_nothing_left(cluster.job_id, cluster.job_dir)
    assert time.monotonic() - started < 40


def test_two_clusters_of_one_user_share_a_node(registry):
    first = new_cluster(registry, extra_sbatch=["--nodelist=node3"])
    second = new_cluster(registry, extra_sbatch=["--nodelist=node3"])
    try:
        first.up(wait=False)
        second.up(connect=False)
        first.wait_ready()
        a, b = first.connection_info(), second.connection_info()
        bound = [{port for port in info.ports.values() if port} for info in (a, b)]
        assert a.head_ip == b.head_ip and bound[0].isdisjoint(bound[1])
        for cluster, info in ((first, a), (second, b)):
            path = store_token(cluster)
            address = f"ray://{info.head_ip}:{info.client_port}"
            result = ray_in_subprocess(
                address, str(path), ONE_TASK_PER_NODE, job_dir=cluster.job_dir
            )
            assert ray_result(result) == ["node3"]
    finally:
        first.down()
        second.down()
    wait_until_nothing_left(first.job_id, first.job_dir)
    wait_until_nothing_left(second.job_id, second.job_dir)


def test_failing_setup_line_fails_fast_with_the_log(registry):
    cluster = new_cluster(registry, setup=["echo preparing", "false"])
    started = time.monotonic()
    with pytest.raises(RayStartError) as info:
        cluster.up()
    assert time.monotonic() - started < 30
    assert cluster.state is State.FAILED
    assert "setup line 2 failed" in cluster.status.log_tail
    assert "setup line 2 failed" in str(info.value)


def test_ray_missing_from_the_setup_environment_fails_fast(registry):
    cluster = new_cluster(registry, setup=["export PATH=/usr/bin:/bin"], python="/usr/bin/python3")
    started = time.monotonic()
    with pytest.raises(RayStartError):
        cluster.up()
    assert time.monotonic() - started < 30
    assert cluster.state is State.FAILED
    assert "ray" in (cluster.status.reason or "").lower()
    assert "PATH" in (cluster.status.reason or "") + cluster.status.log_tail


def test_walltime_warning_comes_first_then_timeout(registry):
    cluster = new_cluster(registry, time="1", walltime_warning=60)
    cluster.up(connect=False)
    wait_for(lambda: cluster.status.walltime_warning, 75, "the walltime warning", step=1)
    assert cluster.state is State.READY
    wait_for(lambda: cluster.state.is_final, 120, "the time limit", step=1)
    assert cluster.state is State.TIMEOUT
    wait_until_nothing_left(cluster.job_id, cluster.job_dir)


def test_a_killed_kernels_cluster_ends_by_itself(registry, testbed):
    kernel = start_kernel(str(registry.path), runuser(testbed.user), wait=True, owner_timeout=10)
    try:
        assert kernel.next_line()["state"] == "READY"
        job_id, job_dir = kernel.job_id, kernel.job_dir
        assert in_queue(job_id)
        kernel.kill()
        killed = time.monotonic()
        wait_for(lambda: not in_queue(job_id), 10 + 2 + 15, "the orphaned job to end")
        ended_after = time.monotonic() - killed
    finally:
        kernel.kill()
    with open(f"{job_dir}/events.jsonl") as f:
        events = [json.loads(line) for line in f]
    assert any(e["event"] == "lease_stale" for e in events)
    assert ended_after > 5  # not before the idle timeout
    wait_for(lambda: not processes_of(job_dir), 20, "the cluster's processes to end")
