"""A notebook session on the laptop side: SSH to the login node, up, tasks, dashboard, down.

Run by tests/test_cluster_ssh.py inside the host ("laptop") network namespace, which reaches
only the login node's sshd, as ``python -m tests.helpers.laptop_session STATE_DIR``. Prints one
JSON object with what it saw.
"""

from __future__ import annotations

import json
import socket
import ssl
import sys
import time
import urllib.error
import urllib.request

import ray
import ray.util.client

from jupyter_slurm_ray.cluster import SlurmRayCluster
from jupyter_slurm_ray.registry import Registry

from .clusters import ONE_TASK_PER_NODE, cluster_spec
from .testbed import ssh_transport, testbed_from_environment


def can_reach_directly(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=3).close()
    except OSError:
        return False
    return True


def dashboard_status(url: str, token: str | None, ca: str | None) -> int:
    headers = {"X-Ray-Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url + "api/cluster_status", headers=headers)
    context = ssl.create_default_context(cafile=ca) if ca else None  # the head's relay
    try:
        with urllib.request.urlopen(request, timeout=20, context=context) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def main() -> None:
    testbed = testbed_from_environment()
    assert testbed is not None, "run inside the testbed (JSR_* variables)"
    transport = ssh_transport(testbed)
    cluster = SlurmRayCluster(
        cluster_spec(nodes=2), transport, registry=Registry(sys.argv[1]), poll_interval=1
    )
    result: dict = {}
    started = time.monotonic()
    try:
        cluster.up()
        result["up_seconds"] = round(time.monotonic() - started, 1)
        result["state"] = cluster.state.value
        result["connect_mode"] = cluster.status.connect_mode
        result["connect_reason"] = cluster.status.connect_reason
        result["ray_client_connected"] = ray.util.client.ray.is_connected()
        info = cluster.connection
        result["head_reachable_directly"] = can_reach_directly(info.head_ip, info.client_port)
        namespace: dict = {"ray": ray, "json": json, "socket": socket}
        captured: list[str] = []
        namespace["print"] = captured.append
        exec(ONE_TASK_PER_NODE, namespace)
        result["hosts"] = json.loads(captured[-1])
        url = cluster.dashboard_url
        result["dashboard_url"] = url
        with open(cluster.token_path) as f:
            token = f.read().strip()
        result["dashboard_with_token"] = dashboard_status(url, token, cluster.ca_path)
        result["dashboard_without_token"] = dashboard_status(url, None, cluster.ca_path)
        result["forwards_while_up"] = len(transport.open_forwards)
    finally:
        status = cluster.down()
        result["final_state"] = status.state.value
        result["forwards_after_down"] = len(transport.open_forwards)
        result["job_id"] = cluster.job_id
        result["job_dir"] = cluster.job_dir
        cluster.close()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
