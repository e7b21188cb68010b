"""A notebook kernel's stand-in inside a Slurm job, connected in driver mode.

Run as the job's own process by tests/test_driver_mode.py (or as the test user's process on the
login node): ``python kernel_driver_in_a_job.py WORK PYTHON SETUP NODES AFTER [SBATCH]``. It
brings up a cluster of NODES nodes with the package (``connect = "auto"``: inside a Slurm job,
or on a login node the nodes reach, that is driver mode), then
notes what Ray says of this process (a driver, not a Ray Client; its node), moves a 256 MB
object both ways, runs a task on every node of the allocation, and then, with AFTER ``down``,
waits (at most 5 minutes) for ``WORK/go`` before ``down()``; with AFTER ``hold``, it waits to
be killed. SBATCH: a JSON list of the cluster job's extra sbatch options (where it may run).
Each step is one JSON line in ``WORK/report.jsonl``; a failure is an ``error`` line.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import traceback
from pathlib import Path

from kernel_common import one_task_per_node, report_to

work, python, setup = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
nodes, after = int(sys.argv[4]), sys.argv[5]
extra_sbatch = json.loads(sys.argv[6]) if len(sys.argv) > 6 else []
# where the site enforces memory: a head and its 700 MB store need 2 GB
mem_per_node = sys.argv[7] if len(sys.argv) > 7 and sys.argv[7] else None
MB = 1024 * 1024


def report(event: str, **fields: object) -> None:
    report_to(work, event, **fields)


def what_ray_says() -> dict[str, object]:
    """This process as Ray sees it: a driver or a client, its node, the cluster's nodes."""
    import ray
    import ray.util.client

    mine = ray.get_runtime_context().get_node_id()
    again = ray.init()  # a Ray example's own ray.init(): the connected cluster, not "twice"
    rows = [node for node in ray.nodes() if node["Alive"]]
    node = next(row for row in rows if row["NodeID"] == mine)
    return {
        "client_connected": ray.util.client.ray.is_connected(),
        "initialized": ray.is_initialized(),
        "init_again_node": again.address_info.get("node_id", "") == mine,
        "node_ip": node["NodeManagerAddress"],
        "node_resources": node["Resources"],
        "cluster_nodes": sorted(
            row["NodeManagerAddress"] for row in rows if "slurm_ray_node" in row["Resources"]
        ),
        "all_nodes": len(rows),
    }


def big_objects() -> dict[str, object]:
    """256 MB from this process to the cluster and back, and 256 MB made by a task."""
    import hashlib

    import ray

    @ray.remote(num_cpus=1, resources={"slurm_ray_node": 0.01})
    def digest(data: bytes) -> tuple[str, str]:
        return hashlib.sha256(data).hexdigest(), socket.gethostname()

    @ray.remote(num_cpus=1, resources={"slurm_ray_node": 0.01})
    def make(size: int) -> bytes:
        return bytes(range(256)) * (size // 256)

    payload = os.urandom(MB) * 256
    started = time.monotonic()
    ref = ray.put(payload)
    back = ray.get(ref)
    put_get = time.monotonic() - started
    remote_digest, host = ray.get(digest.remote(ref), timeout=120)
    made = ray.get(make.remote(256 * MB), timeout=120)
    return {
        "round_trip_equal": back == payload,
        "put_get_seconds": round(put_get, 2),
        "digest_ok": remote_digest == hashlib.sha256(payload).hexdigest(),
        "digest_host": host,
        "made_bytes": len(made),
        "made_ok": made == bytes(range(256)) * MB,
    }


def main() -> None:
    from jupyter_slurm_ray import ClusterSpec, SlurmRayCluster
    from jupyter_slurm_ray.registry import Registry
    from jupyter_slurm_ray.transport import LocalTransport
    from jupyter_slurm_ray.ui.formatting import status_line

    job = os.environ.get("SLURM_JOB_ID")  # none on the login node
    report("outer", host=socket.gethostname(), pid=os.getpid(), job=job)
    spec = ClusterSpec(
        nodes=nodes,
        time="10",
        cpus_per_node=1,
        python=python,
        setup=[setup],
        object_store_memory="700M",
        mem_per_node=mem_per_node,
        start_timeout=180,
        owner_timeout=20,
        extra_sbatch=extra_sbatch,
    )
    registry = Registry(work / "state")
    cluster = SlurmRayCluster(spec, LocalTransport(), registry=registry)
    try:
        cluster.up()
        record = registry.find(cluster.id)
        driver = cluster._client.driver
        report(
            "up",
            job_id=cluster.job_id,
            job_dir=cluster.job_dir,
            status=status_line(cluster.status),
            connect_mode=cluster.status.connect_mode,
            connect_reason=cluster.status.connect_reason,
            record_mode=record.connect_mode if record else None,
            driver_pid=driver.pid if driver else None,
            driver_temp_dir=driver.ready_info.temp_dir if driver and driver.ready_info else None,
            driver_through=driver.ready_info.through if driver and driver.ready_info else None,
            ray=what_ray_says(),
        )
        report("objects", **big_objects())
        report("tasks", hosts=one_task_per_node())
        if after == "hold":
            time.sleep(600)  # until the test kills this process
        deadline = time.monotonic() + 300
        while not (work / "go").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
    except Exception:
        report("error", error=traceback.format_exc(), job_id=cluster.job_id)
    finally:
        status = cluster.down()
        report("down", job_id=cluster.job_id, state=str(status.state))


if __name__ == "__main__":
    main()
