"""A kernel whose environment names a proxy in every variable (run by
tests/test_proxy_variables.py with that environment): it brings a cluster up and uses every
path by which it sends the cluster's token — Ray Client and a task on every node, the Ray Jobs
client (a job submitted, its logs read), adapt for a few cycles (``api/cluster_status``) — and
prints one JSON line per step. As a control, the kernel and a task on every node make a plain
request that only the proxy can answer. It then waits for a line on stdin (or SIGTERM), takes
the cluster down and prints a last line.

Usage: python -m tests.helpers.proxied_kernel '{"spec": {...}, "prefix": [...], "state": DIR,
"names": [...]}'
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
import urllib.error
import urllib.request
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from jupyter_slurm_ray.cluster import SlurmRayCluster
from jupyter_slurm_ray.registry import Registry
from jupyter_slurm_ray.transport import LocalTransport

from .clusters import cluster_spec
from .server import dashboard_log

JOB_DONE = ("SUCCEEDED", "FAILED", "STOPPED")
PROXY_CHECK = "http://proxy-check.invalid/"  # never resolved: only a proxy can answer it
ADAPT_SECONDS = 4.0  # adapt's loop at a 0.5 s interval: several reads of api/cluster_status


def say(**data: Any) -> None:
    print(json.dumps(data), flush=True)


def through_the_proxy(who: str) -> str:
    """A plain request as a user's code would make it, through the proxy the environment
    names (the control: that proxy is in force and answers); what came back."""
    try:
        urllib.request.urlopen(f"{PROXY_CHECK}{who}", timeout=10)
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "answered"


def environment_on_every_node(names: list[str]) -> dict[str, dict[str, str | None]]:
    """Host -> the value of each of ``names`` in a Ray task pinned to that node, and what a
    request through the proxy got there (``proxy_check``)."""

    @ray.remote(num_cpus=0)
    def seen() -> tuple[str, dict[str, str | None]]:
        host = socket.gethostname()
        values = {name: os.environ.get(name) for name in names}
        return host, {**values, "proxy_check": through_the_proxy(host)}

    nodes = [node["NodeID"] for node in ray.nodes() if node["Alive"]]
    pinned = [NodeAffinitySchedulingStrategy(node, soft=False) for node in nodes]
    return dict(ray.get([seen.options(scheduling_strategy=s).remote() for s in pinned]))


def run_a_job(cluster: SlurmRayCluster) -> dict[str, str]:
    jobs = cluster.job_client()
    submission = jobs.submit_job(entrypoint="echo hello-from-a-ray-job")
    deadline = time.monotonic() + 120
    status = str(jobs.get_job_status(submission))
    while not status.endswith(JOB_DONE) and time.monotonic() < deadline:
        time.sleep(0.5)
        status = str(jobs.get_job_status(submission))
    return {"submission": submission, "status": status, "logs": jobs.get_job_logs(submission)}


def adapt_for_a_while(cluster: SlurmRayCluster) -> dict[str, Any]:
    """adapt between the head's nodes and as many (nothing to do but read Ray's state); how
    many ``api/cluster_status`` requests the head's dashboard logged meanwhile."""
    before = dashboard_log(cluster).count("/api/cluster_status")
    cluster.adapt(minimum=cluster.spec.nodes, maximum=cluster.spec.nodes, interval=0.5)
    time.sleep(ADAPT_SECONDS)
    lines = list(cluster.refresh().scaling)
    cluster.stop_adapting()
    time.sleep(1)  # let the dashboard flush its log
    after = dashboard_log(cluster).count("/api/cluster_status")
    return {"scaling": lines, "cluster_status_requests": after - before}


def main() -> None:
    args = json.loads(sys.argv[1])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("terminated"))  # down() still runs
    cluster = SlurmRayCluster(
        cluster_spec(**args["spec"]),
        LocalTransport(args["prefix"]),
        registry=Registry(args["state"]),
    )
    try:
        cluster.up()  # and Ray Client connected
        say(id=cluster.id, job_id=cluster.job_id, job_dir=cluster.job_dir)
        say(proxy_check=through_the_proxy("kernel"))
        say(environment=environment_on_every_node(args["names"]))
        say(job=run_a_job(cluster))
        say(adapt=adapt_for_a_while(cluster))
        sys.stdin.readline()  # the test is done with the cluster
    finally:
        status = cluster.down()
        say(down=status.state.value, job_id=cluster.job_id, job_dir=cluster.job_dir)


if __name__ == "__main__":
    main()
