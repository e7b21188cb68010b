"""Time from ``up()`` to a connected Ray Client, with its phases, against two references measured
in the same run on the same testbed:

- baseline: Ray's documented Slurm template (head with ``srun``, ``sleep``, then the workers one
  by one with a ``sleep`` each, then ``ray.init``), with token auth added so security is equal;
- floor: sbatch → RUNNING, plus a bare ``ray start --head``, plus one Ray Client connect.

Our phases come from the cluster's states and the bootstrap's events; also the commands the
transport ran until connected (each a round trip over SSH), and the time from ``down()`` to no
job and no Ray process left. The figures go to a JSON file (benchmarks/results.py). Run on the
login node:
    scripts/testbed exec -- /opt/jupyter-slurm-ray/venv/bin/python benchmarks/startup.py
"""

from __future__ import annotations

import argparse
import logging
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
from benchmarks.results import write_result
from jupyter_slurm_ray.client.connect import connect_ray_client, disconnect_ray_client
from jupyter_slurm_ray.cluster import SlurmRayCluster
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


class RetryCounter(logging.Handler):
    """Ray Client connect attempts that failed and were retried (client/connect.py logs them)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.retries = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.retries += "connect attempt" in record.getMessage()


RETRIES = RetryCounter()
logging.getLogger("jupyter_slurm_ray.client.connect").addHandler(RETRIES)


def nodes_idle(timeout: float = 120) -> None:
    """Wait until every node is idle: a run never waits for the previous run's nodes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = sh("sinfo", "-h", "-N", "-o", "%t").split()
        if states and all(state == "idle" for state in states):
            return
        time.sleep(0.2)
    raise TimeoutError("nodes not idle")


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
    nodes_idle()
    retries = RETRIES.retries
    d = job_dir("bench-baseline.XXXX")
    started = time.monotonic()
    job = submit(TEMPLATE.format(nodes=nodes, d=d, venv=Path(VENV_PYTHON).parent.parent), d)
    try:
        ready = wait_file(d / "ready")
        connect = client_connect(d, (d / "head_ip").read_text().strip())
        return {"total": ready - started + connect, "connect retries": RETRIES.retries - retries}
    finally:
        subprocess.run(["scancel", job], check=False)


def run_floor() -> dict[str, float]:
    nodes_idle()
    retries = RETRIES.retries
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
            "connect retries": RETRIES.retries - retries,
        }
    finally:
        subprocess.run(["scancel", job], check=False)


class CountingTransport(LocalTransport):
    """The test user's transport, counting its commands (round trips, over SSH)."""

    def __init__(self) -> None:
        super().__init__(AS_USER)
        self.commands = 0
        self.commands_to_submit: int | None = None

    def mark_submitted(self) -> None:
        if self.commands_to_submit is None:
            self.commands_to_submit = self.commands

    async def run(self, argv, **kwargs):  # type: ignore[no-untyped-def]
        self.commands += 1
        return await super().run(argv, **kwargs)


def run_ours(nodes: int, registry: Registry) -> dict[str, float]:
    """``up()`` to connected with every node joined, its phases from the cluster's own states
    and the bootstrap's events (all stamped with time.time() on this one machine)."""
    nodes_idle()
    retries = RETRIES.retries
    transport = CountingTransport()
    cluster = SlurmRayCluster(
        cluster_spec(nodes=nodes), transport, registry=registry, poll_interval=0.2
    )
    started = time.time()
    cluster.add_observer(lambda status: status.job_id and transport.mark_submitted())
    cluster.up()
    returned = time.time()
    first = {s.state: s.at for s in reversed(cluster.history)}
    events: dict[str, dict] = {}
    for event in cluster.events:
        events.setdefault(event.get("phase") or event["event"], event)
    job_start = min(e["t"] for e in cluster.events)
    result = {
        "submit (job dir, sbatch)": first[State.PENDING] - started,
        "queue (until the job runs)": job_start - first[State.PENDING],
        "import ray on the node": events["import_ray"]["seconds"],
        "head answers (from job start)": events["head_ready"]["t"] - job_start,
        "client connected (after head)": first[State.CONNECTED] - events["head_ready"]["t"],
        "all nodes joined (from job start)": events["ready"]["t"] - job_start,
        "total: up() -> connected, all joined": returned - started,
        "commands run until submitted": transport.commands_to_submit or 0,
        "connect retries": RETRIES.retries - retries,
    }
    down_started = time.monotonic()
    cluster.down()
    while processes_of(cluster.job_dir):
        time.sleep(0.1)
    result["down -> nothing left"] = time.monotonic() - down_started
    return result


def median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def print_phases(label: str, figures: dict[str, float]) -> None:
    for phase, value in figures.items():
        unit = "" if phase.startswith(("commands", "connect")) else " s"
        print(f"  {label:9s} {phase:38s} {value:6.1f}{unit}")


def main(repeats: int) -> None:
    """Runs interleaved (floor, then ours and the template for 1 and 3 nodes, repeated), so
    a slow moment of the machine hits every variant alike; medians of ``repeats``."""
    registry = Registry(tempfile.mkdtemp(prefix="jsr-bench-"))
    runs: dict[str, list[dict[str, float]]] = {}
    for _ in range(repeats):
        runs.setdefault("floor", []).append(run_floor())
        for nodes in (1, 3):
            runs.setdefault(f"ours {nodes}", []).append(run_ours(nodes, registry))
            runs.setdefault(f"template {nodes}", []).append(run_baseline(nodes))
    medians = {name: median_of(r) for name, r in runs.items()}
    floor = medians["floor"]
    print(f"medians of {repeats} interleaved runs on this machine ({os.cpu_count()} cores)")
    print_phases("floor", floor)
    ratios = {}
    for nodes in (1, 3):
        ours, template = medians[f"ours {nodes}"], medians[f"template {nodes}"]
        total = ours["total: up() -> connected, all joined"]
        ratios[f"{nodes} node(s)"] = {
            "ours/template": total / template["total"],
            "ours/floor": total / floor["total"],
        }
        print(f"\n{nodes} node(s):")
        print_phases("ours", ours)
        print_phases("template", template)
        print(
            f"  ratio ours/template {total / template['total']:.2f}   "
            f"ours/floor {total / floor['total']:.2f}   (targets at 3 nodes: <= 0.6, <= 1.1)"
        )
    figures = {"repeats": repeats, "medians": medians, "ratios": ratios, "runs": runs}
    write_result("startup", figures)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    main(parser.parse_args().repeats)
