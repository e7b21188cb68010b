"""A laptop session through an SSH drop: run by tests/test_cluster_ssh.py in the host
("laptop") network namespace. While a Ray task runs, the sshd process serving the session
(its connection's, not the user's other sessions) is killed; a squatter keeps trying to take
the forwards' local ports and records what reaches it. Prints one JSON object with what it
saw.

Usage: python -m tests.helpers.laptop_drop STATE_DIR SSHD_DAEMON_PID
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import ray

from jupyter_slurm_ray.aio import run_sync
from jupyter_slurm_ray.cluster import SlurmRayCluster
from jupyter_slurm_ray.registry import Registry

from .clusters import cluster_spec
from .faults import ssh_client_ports, sshd_sessions_from
from .testbed import ssh_transport, testbed_from_environment

SQUATTER = """
import json, socket, sys, time
ports, until = [int(p) for p in sys.argv[1].split(",")], time.time() + float(sys.argv[2])
bound, received = [], b""
while time.time() < until:
    for port in ports:
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            s.close()
            continue
        s.listen(8)
        s.settimeout(0.5)
        bound.append(port)
        try:
            conn, _ = s.accept()
            conn.settimeout(2)
            received += conn.recv(65536)
        except OSError:
            pass
        s.close()
    time.sleep(0.05)
print(json.dumps({"bound": bound, "received": received.decode("latin-1")}))
"""


def main() -> None:
    testbed = testbed_from_environment()
    assert testbed is not None, "run inside the testbed (JSR_* variables)"
    daemon = int(sys.argv[2])
    transport = ssh_transport(testbed)
    bystander = ssh_transport(testbed)
    cluster = SlurmRayCluster(
        cluster_spec(owner_timeout=20), transport, registry=Registry(sys.argv[1]), poll_interval=1
    )
    seen: dict = {}
    try:
        cluster.up()
        ports = sorted(f.local_port for f in transport.open_forwards)
        seen["ports_before"] = ports
        token = Path(cluster.token_path).read_text().strip()
        lease = f"{cluster.job_dir}/lease"

        @ray.remote(num_cpus=0)
        def slow() -> str:
            time.sleep(8)
            return socket.gethostname()

        ref = slow.remote()
        squatter = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(SQUATTER), ",".join(map(str, ports)), "25"],
            stdout=subprocess.PIPE,
            text=True,
        )
        time.sleep(1)
        ours = ssh_client_ports(testbed.ssh_port)  # the cluster's connection (the only one yet)
        run_sync(bystander.run(["true"]))  # another session of the user: it must go on
        sessions = sshd_sessions_from(ours, daemon)
        for pid in sessions:
            os.kill(pid, signal.SIGKILL)
        dropped = time.monotonic()
        seen["sessions_killed"] = len(sessions)
        try:
            seen["task_result"] = ray.get(ref, timeout=90)
        except Exception as exc:  # what Ray Client does across the drop is the measurement
            seen["task_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        seen["task_done_after_drop_s"] = round(time.monotonic() - dropped, 1)
        seen["ssh_connects"] = transport.connects
        seen["ports_after"] = sorted(f.local_port for f in transport.open_forwards)
        first = _read(cluster, lease)
        time.sleep(6)
        seen["lease_renewed_after_drop"] = _read(cluster, lease) != first
        try:
            seen["task_after_drop"] = ray.get(slow.options(num_cpus=0).remote(), timeout=90)
        except Exception as exc:
            seen["task_after_drop_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        seen["state_after_drop"] = cluster.state.value
        out, _ = squatter.communicate(timeout=60)
        squat = json.loads(out)
        seen["squatter_bound"] = squat["bound"]
        seen["squatter_got_token"] = token in squat["received"]
        run_sync(bystander.run(["true"]))
        seen["bystander_connects"] = bystander.connects
    finally:
        downed = time.monotonic()
        status = cluster.down()
        seen["down_s"] = round(time.monotonic() - downed, 1)
        seen["final_state"] = status.state.value
        seen["forwards_after_down"] = len(transport.open_forwards)
        seen["job_id"], seen["job_dir"] = cluster.job_id, cluster.job_dir
        cluster.close()
        run_sync(bystander.close())
    print(json.dumps(seen), flush=True)


def _read(cluster: SlurmRayCluster, path: str) -> str:
    return run_sync(cluster.transport.read_file(path))


if __name__ == "__main__":
    main()
