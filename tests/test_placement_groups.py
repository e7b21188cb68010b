"""Placement groups as RL frameworks drive them (issue 20, item 3), on the testbed's fake GPUs:
a STRICT_SPREAD group of one GPU per node over 3 nodes (an actor per bundle tells its node and
``ray.get_gpu_ids()``), a PACK group whose two actors share one GPU (``num_gpus=0.5`` each),
through Ray Client and as a Ray driver (driver mode), on the solo partition; and adapt growing a
1-node cluster with worker jobs for a pending STRICT_SPREAD group, then shrinking once the group
is removed.

Bundles are shaped as OpenRLHF's are, a GPU and some CPU each ({"CPU": 0.5, "GPU": 1}); every
node of these clusters has both GPUs of a testbed node and one of its 2 CPUs (the other is left
for the kernel's own job in driver mode). A node could hold two of the STRICT_SPREAD group's
bundles, so that the strategy (not the nodes' size) spreads them, and the PACK group's two
actors share one GPU of two. Each cluster ends with nothing left: no job in Slurm's queue, no
Ray process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import ClassVar

import pytest

from jupyter_slurm_ray.bootstrap import dashhttp
from jupyter_slurm_ray.cluster import SlurmRayCluster
from jupyter_slurm_ray.elastic.raydemand import parse_cluster_status
from jupyter_slurm_ray.registry import Registry
from jupyter_slurm_ray.transport import LocalTransport

from .helpers.bootstrap import run_as_user, write_as_user
from .helpers.clusters import (
    TEST_SPEC,
    client_tls_environment,
    cluster_spec,
    last_json_line,
    processes_of,
    ray_in_subprocess,
    ray_result,
    wait_until_nothing_left,
)
from .helpers.jobs import idle_nodes, in_queue
from .helpers.notebookjob import NotebookJob
from .helpers.paths import ARTIFACTS, VENV_ACTIVATE, VENV_PYTHON
from .helpers.testbed import SOLO, runuser
from .helpers.waiting import wait_for

pytestmark = [pytest.mark.testbed, pytest.mark.ray, pytest.mark.solo]  # every GPU

QUEUE_WAIT = 300  # the previous solo test's jobs may still be ending
# a solo node's 2 fake GPUs, 1 of its CPUs
GPU_NODE = dict(partition=SOLO, cpus_per_node=1, gpus_per_node=2)
IDLE = 5.0  # seconds a worker node runs nothing before adapt retires it

# What each workload below starts with (after the connection): where an actor runs.
WHERE = """
import os, time
from ray.util.placement_group import (
    placement_group, placement_group_table, remove_placement_group,
)
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy


def where():
    return {
        "host": socket.gethostname(),
        "node": ray.get_runtime_context().get_node_id(),
        "gpus": [str(g) for g in ray.get_gpu_ids()],
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


BUNDLE = {"CPU": 0.5, "GPU": 1}


def in_bundle(group, index):
    return PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)


def removed(group):
    remove_placement_group(group)
    for _ in range(100):
        if placement_group_table(group)["state"] == "REMOVED":
            return True
        time.sleep(0.1)
    return False
"""

STRICT_SPREAD = (
    WHERE
    + """
@ray.remote(num_cpus=0.5, num_gpus=1)
class Worker:
    def where(self):
        return where()


group = placement_group([BUNDLE] * 3, strategy="STRICT_SPREAD")
ray.get(group.ready(), timeout=180)
print("placed", flush=True)
workers = [Worker.options(scheduling_strategy=in_bundle(group, i)).remote() for i in range(3)]
seen = ray.get([w.where.remote() for w in workers], timeout=180)
nodes = placement_group_table(group)["bundles_to_node_id"]
for w in workers:
    ray.kill(w)
print(json.dumps({"where": seen, "bundles": [nodes[i] for i in range(3)],
                  "removed": removed(group)}))
"""
)

PACK = (
    WHERE
    + """
@ray.remote(num_cpus=0.25, num_gpus=0.5)
class Half:
    def where(self):
        return where()


group = placement_group([BUNDLE] * 2, strategy="PACK")
ray.get(group.ready(), timeout=180)
halves = [Half.options(scheduling_strategy=in_bundle(group, 0)).remote() for _ in range(2)]
seen = ray.get([h.where.remote() for h in halves], timeout=180)
nodes = placement_group_table(group)["bundles_to_node_id"]
for h in halves:
    ray.kill(h)
print(json.dumps({"where": seen, "bundles": [nodes[i] for i in range(2)],
                  "removed": removed(group)}))
"""
)


def token_path(cluster: SlurmRayCluster) -> Path:
    """The cluster's token, in this process's private copy (the test runs as root)."""
    token = Path(f"{cluster.job_dir}/ray_token").read_text().strip()
    return cluster.registry.store_token(cluster.id, token)


def new_cluster(tmp_path_factory, **overrides) -> SlurmRayCluster:
    registry = Registry(tmp_path_factory.mktemp("state"))
    spec = cluster_spec(**GPU_NODE, owner_timeout=60, **overrides)
    return SlurmRayCluster(spec, LocalTransport(runuser("alice")), registry=registry)


def down_and_nothing_left(cluster: SlurmRayCluster) -> None:
    worker_jobs = list(cluster.workers.jobs)
    cluster.down()
    leftover = [job_id for job_id in worker_jobs if in_queue(job_id)]
    subprocess.run(["scancel", *leftover], check=False, capture_output=True)
    assert not leftover, f"worker jobs left in the queue: {leftover}"
    wait_until_nothing_left(cluster.job_id, cluster.job_dir)


class ThroughRayClient:
    """This process brings the 3-node cluster up; each workload runs in a fresh Python on the
    login side, connected with Ray Client (the mode on main today)."""

    def start(self, tmp_path_factory, solo_nodes: tuple[str, ...]) -> SlurmRayCluster:
        cluster = new_cluster(tmp_path_factory, nodes=3)
        cluster.up(connect=False, queue_timeout=QUEUE_WAIT)
        return cluster

    def run(self, cluster: SlurmRayCluster, code: str) -> dict:
        info = cluster.connection_info()
        address = f"ray://{info.head_ip}:{info.client_port}"
        return ray_result(
            ray_in_subprocess(
                address, str(token_path(cluster)), code, timeout=300, job_dir=cluster.job_dir
            )
        )

    def stop(self, cluster: SlurmRayCluster) -> None:
        down_and_nothing_left(cluster)


class AsARayDriver:
    """A kernel inside a Slurm job on a solo node (batchspawner's shape) brings the 3-node
    cluster up with ``connect="driver"`` and runs each workload as a cell, an ordinary Ray driver
    (tests/resources/kernel_driver_runs_workloads.py)."""

    program = "kernel_driver_runs_workloads.py"

    def start(self, tmp_path_factory, solo_nodes: tuple[str, ...]):
        settings = {**TEST_SPEC, **GPU_NODE, "nodes": 3, "owner_timeout": 60}
        del settings["python"], settings["setup"]
        job = NotebookJob.submit(
            self.program,
            str(VENV_PYTHON),
            VENV_ACTIVATE,
            json.dumps(settings),
            node=solo_nodes[0],
            partition=SOLO,
        )
        try:
            up = job.wait("up", QUEUE_WAIT + 180)
            assert up["connect_mode"] == "driver", up
        except BaseException:
            job.clean_up()
            raise
        return job, up

    def run(self, kernel, code: str) -> dict:
        job, _ = kernel
        name = uuid.uuid4().hex[:8]
        request = job.work / f"run-{name}.py"
        write_as_user(request.with_suffix(".tmp"), "import json, socket, ray\n" + code)
        run_as_user("mv", str(request.with_suffix(".tmp")), str(request))

        def ran():
            job.event("up")  # an error line, or the job ended: AssertionError
            found = [e for e in job.events() if e["event"] == "ran" and e["name"] == name]
            return found[0] if found else None

        done = wait_for(ran, 300, f"the kernel to run {name}")
        assert "error" not in done, done["error"]
        return last_json_line(done["output"])

    def stop(self, kernel) -> None:
        job, up = kernel
        try:
            write_as_user(job.work / "go", "")
            down = job.wait("down", 120)
            assert down["state"] == "STOPPED", down
            wait_until_nothing_left(up["job_id"], up["job_dir"])
            wait_for(lambda: not in_queue(job.job_id), 60, "the notebook job to end")
            assert not processes_of(up["job_dir"])
        finally:
            job.clean_up()


@pytest.fixture(scope="class")
def three_nodes(request, tmp_path_factory, solo_nodes):
    """A 3-node cluster for one class's tests, reached the class's way."""
    way = request.cls.way
    cluster = way.start(tmp_path_factory, solo_nodes)
    yield cluster
    way.stop(cluster)


class TestThroughRayClient:
    """The kernel on the login side, with Ray Client."""

    way: ClassVar[ThroughRayClient | AsARayDriver] = ThroughRayClient()

    def test_a_strict_spread_group_puts_one_gpu_bundle_on_each_node(self, three_nodes):
        result = self.way.run(three_nodes, STRICT_SPREAD)
        seen = result["where"]
        hosts = {w["host"] for w in seen}
        assert len(hosts) == 3, seen  # one bundle per node, though a node has room for two
        assert [w["node"] for w in seen] == result["bundles"]  # each actor in its bundle
        for w in seen:
            assert len(w["gpus"]) == 1 and w["gpus"][0] in ("0", "1"), w  # Slurm's 2 GPUs
            assert w["visible"] == w["gpus"][0], w  # the actor sees its GPU, and only it
        assert result["removed"]

    def test_a_pack_group_colocates_two_actors_on_one_gpu(self, three_nodes):
        result = self.way.run(three_nodes, PACK)
        first, second = result["where"]
        assert result["bundles"][0] == result["bundles"][1]  # PACK: one node for both bundles
        assert first["node"] == second["node"] == result["bundles"][0]
        assert first["host"] == second["host"]
        assert len(first["gpus"]) == 1 and first["gpus"] == second["gpus"], result  # shared
        assert first["visible"] == second["visible"] == first["gpus"][0]
        assert result["removed"]


class TestAsARayDriver(TestThroughRayClient):
    """The same tests, the kernel in a job on a solo node a Ray driver."""

    way: ClassVar[ThroughRayClient | AsARayDriver] = AsARayDriver()


# -- adapt grows the cluster for a pending group, and shrinks after ----------------------------
SPREAD_WHEN_PLACED = (
    WHERE
    + """
@ray.remote(num_cpus=0.25, num_gpus=0.5)
class Worker:
    def where(self):
        return where()


group = placement_group([{"CPU": 0.25, "GPU": 0.5}] * 3, strategy="STRICT_SPREAD")
print("created", flush=True)
ray.get(group.ready(), timeout=float(sys.argv[3]))
workers = [Worker.options(scheduling_strategy=in_bundle(group, i)).remote() for i in range(3)]
seen = ray.get([w.where.remote() for w in workers], timeout=120)
for w in workers:
    ray.kill(w)
print(json.dumps({"where": seen, "removed": removed(group)}))
"""
)


def start_workload(cluster: SlurmRayCluster, code: str, *args: str) -> subprocess.Popen:
    """``code`` connected with Ray Client in a subprocess that runs on; its first line read."""
    info = cluster.connection_info()
    address = f"ray://{info.head_ip}:{info.client_port}"
    connect = (
        "import json, socket, sys, ray\n"
        "from jupyter_slurm_ray.client.connect import connect_ray_client\n"
        "connect_ray_client(sys.argv[1], sys.argv[2], timeout=30)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(client_tls_environment(cluster.job_dir))
    program = connect + textwrap.dedent(code)
    workload = subprocess.Popen(
        [sys.executable, "-c", program, address, str(token_path(cluster)), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**env, "RAY_USAGE_STATS_ENABLED": "0"},
    )
    assert workload.stdout is not None
    first = workload.stdout.readline().strip()
    if not first:
        workload.wait(timeout=30)
        raise AssertionError(f"the workload failed: {workload.stderr.read()[-3000:]}")  # type: ignore[union-attr]
    return workload


def finish(workload: subprocess.Popen, timeout: float) -> dict:
    try:
        out, err = workload.communicate(timeout=timeout)
    finally:
        if workload.poll() is None:
            workload.kill()
    try:
        return last_json_line(out)
    except AssertionError:
        raise AssertionError(f"the workload failed: {err[-3000:]}") from None


def cluster_status(cluster: SlurmRayCluster) -> dict:
    """The dashboard's ``api/cluster_status`` answer (what adapt reads), with the token."""
    info = cluster.connection_info()
    path = "api/cluster_status"
    url = dashhttp.dashboard_url(info.head_ip, info.dashboard_port, path, tls=info.tls)
    token = Path(f"{cluster.job_dir}/ray_token").read_text().strip()
    ca = f"{cluster.job_dir}/tls/ca.crt" if info.tls else None  # the head's relay
    return dashhttp.get_json(url, token, ca_file=ca)


def record_payload(name: str, body: dict) -> None:
    """Keep what Ray answered (``test-artifacts/cluster-status/``): tests/resources/
    cluster_status/ holds such recordings for the fast tests."""
    folder = ARTIFACTS / "cluster-status"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")


def adapt_moves(cluster: SlurmRayCluster) -> tuple[list[str], list[str], list[str]]:
    """The worker jobs adapt submitted and retired, and the causes it gave (``scaled``)."""
    cluster.refresh()
    submitted: list[str] = []
    retired: list[str] = []
    causes: list[str] = []
    seen = set()
    for event in cluster.events:
        key = json.dumps(event, sort_keys=True)  # a line read twice counts once
        if event.get("event") != "scaled" or key in seen:
            continue
        seen.add(key)
        if str(event.get("cause")).startswith("adapt:"):
            submitted += event["submitted"]
            retired += event["retired"]
            causes.append(event["cause"])
    return submitted, retired, causes


@pytest.fixture
def one_node(tmp_path_factory, solo_nodes):
    cluster = new_cluster(tmp_path_factory)
    cluster.up(connect=False, queue_timeout=QUEUE_WAIT)
    yield cluster
    down_and_nothing_left(cluster)


def test_adapt_grows_for_a_pending_strict_spread_group_and_shrinks_after(one_node):
    """A STRICT_SPREAD group of 3 half-GPU bundles ({CPU: 0.25, GPU: 0.5}) on a 1-node head of
    1 CPU and 2 GPUs. All three would fit one node, so packing them (adapt's count before it
    knew placement groups) asks for 1 worker job and the group waits for ever; spread, the head
    holds one bundle and each other one needs a node of its own: exactly 2 worker jobs. The
    group is placed on 3 nodes; once it is removed, the idle worker jobs are retired."""
    cluster = one_node
    wait_for(lambda: idle_nodes(SOLO) >= 2, QUEUE_WAIT, "two idle nodes")
    cluster.adapt(minimum=1, maximum=3, idle_timeout=IDLE, max_pending=2)
    try:
        workload = start_workload(cluster, SPREAD_WHEN_PLACED, str(QUEUE_WAIT))
        # Ray's own view of the pending group, as adapt reads it (its monitor writes every 5 s)
        body = wait_for(
            lambda: (b := cluster_status(cluster)) and parse_cluster_status(b["data"]).groups and b,
            30,
            "the pending group in Ray's cluster status",
        )
        record_payload("pending-half-gpu-strict-spread-on-one-node", body)
        (group,) = parse_cluster_status(body["data"]).groups
        assert (group.strategy, group.size(), group.count) == ("STRICT_SPREAD", 3, 1)
        assert group.bundles == (({"CPU": 0.25, "GPU": 0.5}, 3),)
        result = finish(workload, QUEUE_WAIT + 120)
        hosts = {w["host"] for w in result["where"]}
        assert len(hosts) == 3, result
        assert all(len(w["gpus"]) == 1 for w in result["where"]), result
        assert result["removed"]
        wait_for(
            lambda: cluster.refresh().nodes_wanted == 1 and not cluster.status.worker_jobs,
            120,
            "adapt to shrink to the head",
        )
        submitted, retired, causes = wait_for(
            lambda: (moves := adapt_moves(cluster)) and len(moves[1]) >= 2 and moves,
            30,
            "both worker jobs retired",
        )
    finally:
        cluster.stop_adapting()
    assert len(submitted) == 2, submitted  # exactly the nodes the group lacked: no loop
    assert sorted(retired) == sorted(submitted)
    assert sorted(cluster.workers.jobs) == sorted(submitted)  # no other sbatch
    assert "placement group STRICT_SPREAD of 3 × {CPU: 0.25, GPU: 0.5} pending" in causes[0], causes
    assert any("idle" in cause for cause in causes[1:]), causes
    for job_id in submitted:
        wait_for(lambda job_id=job_id: not in_queue(job_id), 60, f"worker job {job_id} to end")
    assert cluster.refresh().nodes_joined == 1  # (the fixture's down checks nothing is left)
