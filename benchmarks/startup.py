"""Time from ``up()`` to a connected Ray Client, with its phases, against two references measured
in the same run on the same testbed:

- baseline: Ray's documented Slurm template (head with ``srun``, ``sleep``, then the workers one
  by one with a ``sleep`` each, then ``ray.init``), with token auth added so security is equal;
- floor: sbatch → RUNNING, plus a bare ``ray start --head``, plus one Ray Client connect.

Also the time from ``down()`` to no job and no Ray process left. Run on the login node:
    scripts/testbed exec -- /opt/jupyter-slurm-ray/venv/bin/python benchmarks/startup.py
"""

from __future__ import annotations

import argparse
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from jupyter_slurm_ray.cluster import SlurmRayCluster
from jupyter_slurm_ray.connect import connect_ray_client, disconnect_ray_client
from jupyter_slurm_ray.registry import Registry
from jupyter_slurm_ray.states import State
from jupyter_slurm_ray.transport import LocalTransport
from tests.helpers.clusters import cluster_spec, processes_of
from tests.helpers.paths import VENV_PYTHON

USER = os.environ.get("JSR_USER", "alice")
AS_USER = ["runuser", "-u", USER, "--"]
HOME = Path(f"/home/{USER}")

# Ray's documented template, reduced to its timing-relevant steps (+ token env, + our venv)
TEMPLATE = """#!/bin/bash
#SBATCH --nodes={nodes} --ntasks-per-node=1 --cpus-per-task=1 --time=10
#SBATCH --output={d}/out --error={d}/err --chdir={d}
source {venv}/bin/activate
export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH={d}/token RAY_USAGE_STATS_ENABLED=0
nodes_array=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))
head_node=${{nodes_array[0]}}
head_node_ip=$(srun --nodes=1 --ntasks=1 -w "$head_node" hostname --ip-address | awk '{{print $1}}')
port=6379
echo "$head_node_ip" > {d}/head_ip
srun --overlap --nodes=1 --ntasks=1 -w "$head_node" \\
    ray start --head --node-ip-address="$head_node_ip" --port=$port --num-cpus=1 \\
    --object-store-memory=200000000 --temp-dir=/tmp/b$SLURM_JOB_ID --block &
sleep 10
worker_num=$((SLURM_JOB_NUM_NODES - 1))
for ((i = 1; i <= worker_num; i++)); do
    node_i=${{nodes_array[$i]}}
    srun --overlap --nodes=1 --ntasks=1 -w "$node_i" ray start --address "$head_node_ip:$port" \\
        --num-cpus=1 --object-store-memory=200000000 --temp-dir=/tmp/b$SLURM_JOB_ID.$i --block &
    sleep 5
done
touch {d}/ready
wait
"""

FLOOR = """#!/bin/bash
#SBATCH --nodes=1 --time=10 --output={d}/out --error={d}/err --chdir={d}
source {venv}/bin/activate
export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH={d}/token RAY_USAGE_STATS_ENABLED=0
ip=$(ip -o route get 10.200.0.1 | sed -n 's/.* src \\([0-9.]*\\).*/\\1/p')
echo "$ip" > {d}/head_ip
date +%s.%N > {d}/running
exec ray start --head --node-ip-address="$ip" --num-cpus=1 --object-store-memory=200000000 \\
    --temp-dir=/tmp/f$SLURM_JOB_ID --include-dashboard=false --block
"""


def sh(*argv: str, **kw) -> str:
    return subprocess.run(
        [*AS_USER, *argv], check=True, capture_output=True, text=True, **kw
    ).stdout


def job_dir(prefix: str) -> Path:
    d = Path(sh("mktemp", "-d", "-p", str(HOME), prefix).strip())
    token = secrets.token_urlsafe(32)
    sh("sh", "-c", 'umask 077; cat > "$1"', "sh", str(d / "token"), input=token)
    return d


def wait_file(path: Path, timeout: float = 300) -> float:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(path)
        time.sleep(0.05)
    return time.monotonic()


def port_open(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=0.5).close()
        return True
    except OSError:
        return False


def client_connect(d: Path, host: str) -> float:
    """One Ray Client connect, retrying the known transient failure like ``up()`` does."""
    started = time.monotonic()
    connect_ray_client(f"ray://{host}:10001", str(d / "token"), timeout=30)
    elapsed = time.monotonic() - started
    disconnect_ray_client()
    return elapsed


def submit(script: str, d: Path) -> str:
    sh("sh", "-c", 'cat > "$1"', "sh", str(d / "job.sh"), input=script)
    return sh("sbatch", "--parsable", str(d / "job.sh")).strip()


def run_baseline(nodes: int) -> dict[str, float]:
    d = job_dir("bench-baseline.XXXX")
    started = time.monotonic()
    job = submit(TEMPLATE.format(nodes=nodes, d=d, venv=Path(VENV_PYTHON).parent.parent), d)
    try:
        ready = wait_file(d / "ready")
        connect = client_connect(d, (d / "head_ip").read_text().strip())
        return {"total": ready - started + connect}
    finally:
        subprocess.run(["scancel", job], check=False)


def run_floor() -> dict[str, float]:
    d = job_dir("bench-floor.XXXX")
    started = time.monotonic()
    job = submit(FLOOR.format(d=d, venv=Path(VENV_PYTHON).parent.parent), d)
    try:
        running = wait_file(d / "running")
        host = (d / "head_ip").read_text().strip()
        while not port_open(host, 10001):
            time.sleep(0.05)
        head_up = time.monotonic()
        connect = client_connect(d, host)
        return {
            "sbatch->running": running - started,
            "ray start --head": head_up - running,
            "client connect": connect,
            "total": head_up - started + connect,
        }
    finally:
        subprocess.run(["scancel", job], check=False)


def run_ours(nodes: int, registry: Registry) -> dict[str, float]:
    cluster = SlurmRayCluster(
        cluster_spec(nodes=nodes), LocalTransport(AS_USER), registry=registry, poll_interval=0.2
    )
    started = time.time()
    cluster.up()
    first = {s.state: s.at for s in reversed(cluster.history)}
    seen = cluster._follower.events.events
    events = {e.get("phase") or e["event"]: e["t"] for e in seen if "t" in e}
    result = {
        "submit": first[State.PENDING] - started,
        "queue": first[State.STARTING] - first[State.PENDING],
        "head up": events.get("head_up", first[State.READY]) - first[State.STARTING],
        "nodes joined": first[State.READY] - events.get("head_up", first[State.STARTING]),
        "client connected": first[State.CONNECTED] - first[State.READY],
        "total": first[State.CONNECTED] - started,
    }
    down_started = time.monotonic()
    cluster.down()
    while processes_of(cluster.job_dir):
        time.sleep(0.1)
    result["down -> nothing left"] = time.monotonic() - down_started
    return result


def median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    registry = Registry(tempfile.mkdtemp(prefix="jsr-bench-"))
    floor = median_of([run_floor() for _ in range(args.repeats)])
    print(
        f"floor (median of {args.repeats}): "
        + ", ".join(f"{k} {v:.1f} s" for k, v in floor.items())
    )
    for nodes in (1, 3):
        ours = median_of([run_ours(nodes, registry) for _ in range(args.repeats)])
        base = median_of([run_baseline(nodes) for _ in range(args.repeats)])
        print(f"\n{nodes} node(s), medians of {args.repeats}:")
        for phase, seconds in ours.items():
            print(f"  ours   {phase:22s} {seconds:6.1f} s")
        print(f"  Ray's Slurm template total  {base['total']:6.1f} s")
        print(
            f"  ratio ours/baseline {ours['total'] / base['total']:.2f}   "
            f"ours/floor {ours['total'] / floor['total']:.2f}"
        )


if __name__ == "__main__":
    main()
