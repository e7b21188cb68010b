"""Driver mode on the real testbed: a kernel inside a Slurm job (``sbatch -N1 -c1 --mem=1G`` on
node1, batchspawner's and Open OnDemand's shape) brings up a cluster with ``connect = "auto"``,
which there means driver mode. On nodes other than the kernel's, node1 joins the cluster as a
Ray node that runs no tasks and the kernel is an ordinary Ray driver through it, not a Ray
Client; when the head runs on node1 too, the kernel is a driver through the head's own node
(no second Ray node on the host).

The user's own kernel on the login node, which the testbed's nodes reach, is a driver too.

Then ``down()``, or the kernel SIGKILLed while its notebook job goes on (a kernel restart),
leaves nothing: no Ray node on the kernel's host, no job, no Ray process of the cluster.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from jupyter_slurm_ray.client.mode import local_address_toward

from .helpers.bootstrap import processes_matching, run_as_user
from .helpers.clusters import ProcessEnvironment, processes_of, wait_until_nothing_left
from .helpers.jobs import in_queue
from .helpers.notebookjob import LoginKernel, NotebookJob
from .helpers.paths import VENV_ACTIVATE, VENV_PYTHON
from .helpers.testbed import ENFORCED, PRIVATE_TMP
from .helpers.waiting import wait_for

pytestmark = [pytest.mark.testbed, pytest.mark.ray]

PROGRAM = "kernel_driver_in_a_job.py"
MB = 1024 * 1024
AWAY_FROM_THE_KERNEL = json.dumps(["--exclude=node1"])  # the kernel's job is on node1


def node_address(node: str) -> str:
    shown = subprocess.run(
        ["scontrol", "show", "node", node, "-o"], capture_output=True, text=True, check=True
    ).stdout
    match = re.search(r"\bNodeAddr=(\S+)", shown)
    assert match, shown
    return match.group(1)


def driver_processes(temp_dir: str) -> list[tuple[int, str]]:
    """The processes of the kernel host's Ray node (their command lines name its temp dir)."""
    return processes_matching([temp_dir])


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def assert_a_driver_on_its_own_node(job: NotebookJob, up: dict, nodes: int) -> None:
    """What the kernel saw once up: driver mode chosen by auto, and Ray agreeing."""
    assert up["connect_mode"] == "driver" and up["record_mode"] == "driver", up
    assert up["connect_reason"].startswith(
        f"auto: this kernel runs in Slurm job {job.job_id} on node1"
    ), up["connect_reason"]
    assert "Ray driver (auto:" in up["status"]
    ray = up["ray"]
    assert ray["client_connected"] is False and ray["initialized"] is True
    assert ray["init_again_node"] is True
    assert ray["node_ip"] == node_address("node1")  # the driver's node is the kernel's host
    resources = ray["node_resources"]
    assert resources.get("CPU", 0) == 0 and resources.get("GPU", 0) == 0, resources
    assert "slurm_ray_node" not in resources, resources
    assert len(ray["cluster_nodes"]) == nodes and ray["all_nodes"] == nodes + 1, ray
    assert up["driver_through"] == "", up
    pids = [pid for pid, _ in driver_processes(up["driver_temp_dir"])]
    assert pids, "no Ray node on the kernel's host"
    for pid in pids:  # the notebook job's Slurm variables stay out of it
        environ = ProcessEnvironment.of(pid)
        slurm = sorted(n for n in environ.variables if n.startswith("SLURM_")) if environ else []
        assert slurm in ([], ["SLURM_CONF"]), (pid, slurm)


@pytest.mark.compat
def test_a_kernel_in_a_job_is_a_ray_driver_and_down_leaves_nothing(testbed):
    # where the testbed enforces memory as a site does: 256 MB round trips from the kernel (its
    # copy, the object store's, what comes back) beside its Ray node's processes need 3 GB
    job = NotebookJob.submit(
        PROGRAM, str(VENV_PYTHON), VENV_ACTIVATE, "2", "down", AWAY_FROM_THE_KERNEL,
        "2G" if ENFORCED else "", mem="3G" if ENFORCED else "1G",
    )  # fmt: skip
    try:
        job.wait("outer", 120)
        up = job.wait("up", 300)
        assert_a_driver_on_its_own_node(job, up, 2)

        objects = job.wait("objects", 240)
        assert objects["round_trip_equal"] and objects["digest_ok"], objects
        assert objects["made_ok"] and objects["made_bytes"] == 256 * MB, objects
        tasks = job.wait("tasks", 120)
        assert tasks["hosts"] == ["node2", "node3"]  # a task on every node

        run_as_user("touch", str(job.work / "go"))
        down = job.wait("down", 120)
        assert down["job_id"] == up["job_id"] and down["state"] == "STOPPED"
        wait_until_nothing_left(up["job_id"], up["job_dir"])
        assert driver_processes(up["driver_temp_dir"]) == [] and not alive(up["driver_pid"])
        assert not Path(up["driver_temp_dir"]).exists()
        wait_for(lambda: not in_queue(job.job_id), 60, "the notebook job to end")
    finally:
        job.clean_up()


def test_a_kernel_on_the_heads_host_is_a_driver_through_the_heads_node(testbed):
    """The cluster's head on node1, where the kernel runs: no second Ray node there. Where
    each job has a /tmp of its own, the head's node (its sockets, in the head job's /tmp) is
    out of the kernel's reach: a node of its own then, and the reason says which."""
    job = NotebookJob.submit(  # with memory enforced: as the test above (a node of its own)
        PROGRAM, str(VENV_PYTHON), VENV_ACTIVATE, "3", "down", json.dumps(["--nodelist=node1"]),
        "2G" if ENFORCED else "", mem="3G" if ENFORCED else "1G",
    )  # fmt: skip
    try:
        job.wait("outer", 120)
        up = job.wait("up", 300)
        through, words = ("", "its Ray node") if PRIVATE_TMP else ("head", "the head's Ray node")
        assert up["connect_mode"] == "driver" and up["driver_through"] == through, up
        assert (
            up["connect_reason"].startswith(
                f"auto: this kernel runs in Slurm job {job.job_id} on node1"
            )
            and words in up["connect_reason"]
        ), up
        head = json.loads((Path(up["job_dir"]) / "connection.json").read_text())
        assert head["head_host"] == "node1"
        ray = up["ray"]
        assert ray["client_connected"] is False and ray["initialized"] is True
        assert ray["node_ip"] == node_address("node1")
        own_node = f"/d{up['driver_pid']}-"  # the temp dir a node of its own would have
        if PRIVATE_TMP:
            assert up["driver_temp_dir"] != head["temp_dir"] and ray["all_nodes"] == 4, ray
            assert driver_processes(up["driver_temp_dir"]), "no Ray node on the kernel's host"
        else:
            assert up["driver_temp_dir"] == head["temp_dir"]
            assert "slurm_ray_node" in ray["node_resources"]  # the head's node: it runs tasks
            assert len(ray["cluster_nodes"]) == 3 and ray["all_nodes"] == 3, ray  # none its own
            assert not processes_matching([own_node])

        objects = job.wait("objects", 240)
        assert objects["round_trip_equal"] and objects["digest_ok"], objects
        tasks = job.wait("tasks", 120)
        assert tasks["hosts"] == ["node1", "node2", "node3"]

        run_as_user("touch", str(job.work / "go"))
        down = job.wait("down", 120)
        assert down["job_id"] == up["job_id"] and down["state"] == "STOPPED"
        wait_until_nothing_left(up["job_id"], up["job_dir"])
        wait_for(lambda: not alive(up["driver_pid"]), 10, "the driver role to end")
        wait_for(lambda: not in_queue(job.job_id), 60, "the notebook job to end")
    finally:
        job.clean_up()


@pytest.mark.compat
def test_a_login_node_kernel_the_nodes_reach_is_a_ray_driver(testbed):
    """The user's own kernel on the login node, outside jobs (connect = "auto", driver_hosts
    unset): the testbed's nodes reach the login node, so its host joins as a Ray node that runs
    no tasks and the kernel is a driver (Ray Data, Train and Tune work as on the cluster);
    ``down`` leaves no Ray process on the login node."""
    kernel = LoginKernel.start(PROGRAM, str(VENV_PYTHON), VENV_ACTIVATE, "2", "down", "[]",
                               "2G" if ENFORCED else "")  # fmt: skip
    try:
        outer = kernel.wait("outer", 60)
        assert outer["job"] is None  # no Slurm job around this kernel
        up = kernel.wait("up", 300)
        assert up["connect_mode"] == "driver" and up["record_mode"] == "driver", up
        assert up["connect_reason"] == (
            f"auto: this kernel runs on {outer['host'].split('.')[0]}, outside Slurm jobs; "
            "the nodes reach its Ray node"
        ), up["connect_reason"]
        ray = up["ray"]
        assert ray["client_connected"] is False and ray["initialized"] is True, ray
        assert ray["node_ip"] == local_address_toward(node_address("node1")), ray
        assert ray["node_resources"].get("CPU", 0) == 0, ray  # nothing computes on the login node
        assert len(ray["cluster_nodes"]) == 2 and ray["all_nodes"] == 3, ray
        assert driver_processes(up["driver_temp_dir"]), "no Ray node on the login node"
        objects = kernel.wait("objects", 240)
        assert objects["round_trip_equal"] and objects["digest_ok"], objects
        assert objects["digest_host"] != outer["host"], objects  # the task ran on a node
        assert len(kernel.wait("tasks", 120)["hosts"]) == 2

        run_as_user("touch", str(kernel.work / "go"))
        down = kernel.wait("down", 120)
        assert down["job_id"] == up["job_id"] and down["state"] == "STOPPED"
        wait_until_nothing_left(up["job_id"], up["job_dir"])
        wait_for(lambda: not driver_processes(up["driver_temp_dir"]), 20, "its Ray node to end")
        assert not alive(up["driver_pid"]) and not Path(up["driver_temp_dir"]).exists()
    finally:
        kernel.clean_up()


def test_a_killed_kernel_leaves_no_ray_node_on_its_host_and_the_cluster_ends(testbed):
    """The kernel is SIGKILLed while its notebook job (the Jupyter server) goes on."""
    job = NotebookJob.submit(
        PROGRAM, str(VENV_PYTHON), VENV_ACTIVATE, "2", "hold", AWAY_FROM_THE_KERNEL, server=True
    )
    try:
        outer = job.wait("outer", 120)
        up = job.wait("up", 300)
        assert up["connect_mode"] == "driver"
        temp_dir = up["driver_temp_dir"]
        assert driver_processes(temp_dir)

        os.kill(int(outer["pid"]), signal.SIGKILL)
        wait_for(lambda: not driver_processes(temp_dir), 20, "the kernel host's Ray node to end")
        wait_for(lambda: not alive(up["driver_pid"]), 10, "the driver role to end")
        assert not Path(temp_dir).exists()
        assert in_queue(job.job_id)  # its server lives on: nothing of Slurm's cleaned it up
        # the owner is gone: its lease goes stale (owner_timeout 20 s) and the cluster ends
        wait_until_nothing_left(up["job_id"], up["job_dir"], timeout=90)
        assert not processes_of(up["job_dir"])
    finally:
        job.clean_up()
