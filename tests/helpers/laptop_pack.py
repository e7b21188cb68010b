"""A laptop-side session with ``environment = "pack"``: two ups in a row over SSH, timed.

Run by tests/test_packs.py with the pack venv's Python (scripts/pack-venv makes it: Ray and the
module jsr_pack_marker, which only that venv has) inside the host ("laptop") network namespace,
as ``python -m tests.helpers.laptop_pack STATE_DIR``. The first up finds no archive anywhere
(they are removed first), the second reuses all. Prints one JSON object with what it saw.
"""

from __future__ import annotations

import json
import sys
import time

import ray

from jupyter_slurm_ray.aio import run_sync
from jupyter_slurm_ray.cluster import SlurmRayCluster
from jupyter_slurm_ray.job import packs
from jupyter_slurm_ray.registry import Registry

from .clusters import cluster_spec
from .paths import USER_TEMP_PARENTS
from .testbed import ssh_transport, testbed_from_environment

WHERE_AND_WHAT = """
import json
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy as Affinity

@ray.remote(num_cpus=0)
def where():
    import socket, sys
    import jsr_pack_marker
    return [socket.gethostname(), jsr_pack_marker.__file__, sys.executable]

nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
refs = [where.options(scheduling_strategy=Affinity(n, soft=False)).remote() for n in nodes]
print(json.dumps(sorted(ray.get(refs))))
"""


def run_tasks() -> list[list[str]]:
    captured: list[str] = []
    exec(WHERE_AND_WHAT, {"ray": ray, "print": captured.append})
    return json.loads(captured[-1])


def forget_every_copy(transport, env: packs.EnvironmentToPack, root: str) -> None:
    """The archive here, on the cluster side, and unpacked on the nodes: removed."""
    (packs.cache_dir() / env.archive_name).unlink(missing_ok=True)
    script = 'rm -rf -- "$1"'
    for parent in USER_TEMP_PARENTS:  # unpacked: and -<content hash> after it
        unpacked = f"{parent}/jsr-$(id -u)/env-{env.kind}-{env.key}"
        script += f" {unpacked} {unpacked}-*"
    remote = packs.remote_archive(env, root)
    run_sync(transport.run(["sh", "-c", script, "sh", remote]))


def alive_nodes() -> int:
    return sum(1 for node in ray.nodes() if node["Alive"])


def scale_out(cluster: SlurmRayCluster, seen: dict) -> None:
    """One worker job more: its bootstrap finds the pack in the job dir (no JSR_ENV_PACK)."""
    cluster.scale(3)
    deadline = time.monotonic() + 300
    while alive_nodes() < 3 and time.monotonic() < deadline:  # other tests may hold nodes
        time.sleep(1)
    seen["scaled_tasks"] = run_tasks()
    deadline = time.monotonic() + 20  # its events reach this process with the next polls
    while not [e for e in cluster.events if e.get("worker_job") and e["event"] == "env_pack"]:
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)


def archive_copies(transport, env: packs.EnvironmentToPack, root: str) -> dict:
    """Where the archive is, here (the laptop's cache) and on the cluster side: inode, mtime
    (ns) and size of each, so that a second up can be shown not to pack or send it again."""
    here = (packs.cache_dir() / env.archive_name).stat()
    there = run_sync(transport.run(["stat", "-c", "%i %.9Y %s", packs.remote_archive(env, root)]))
    return {
        "laptop": [here.st_ino, here.st_mtime_ns, here.st_size],
        "cluster_side": there.stdout.split(),
    }


def one_up(transport, state_dir: str, root: str, scale: bool = False) -> dict:
    spec = cluster_spec(nodes=2, python=None, setup=(), environment="pack")
    cluster = SlurmRayCluster(spec, transport, registry=Registry(state_dir), poll_interval=1)
    seen: dict = {}
    started = time.monotonic()
    try:
        cluster.up()
        seen["up_seconds"] = round(time.monotonic() - started, 1)
        seen["archives"] = archive_copies(transport, packs.describe_environment(), root)
        seen["state"] = cluster.state.value
        seen["tasks"] = run_tasks()
        if scale:
            scale_out(cluster, seen)
        seen["env_pack_events"] = [e for e in cluster.events if e.get("event") == "env_pack"]
        first = cluster.events[0]["t"] if cluster.events else 0.0
        seen["timeline"] = [
            (round(e["t"] - first, 1), e.get("role"), e["event"], e.get("phase", ""))
            for e in cluster.events
        ]
    finally:
        status = cluster.down()
        seen["final_state"] = status.state.value
        seen["job_id"] = cluster.job_id
        seen["job_dir"] = cluster.job_dir
        cluster.close()
    return seen


def main() -> None:
    testbed = testbed_from_environment()
    assert testbed is not None, "run inside the testbed (JSR_* variables)"
    transport = ssh_transport(testbed)
    env = packs.describe_environment()
    root = run_sync(transport.expand_path(cluster_spec().job_dir_root))
    forget_every_copy(transport, env, root)
    result = {"archive": packs.remote_archive(env, root), "kind": env.kind}
    result["first"] = one_up(transport, sys.argv[1], root)
    result["second"] = one_up(transport, sys.argv[1], root, scale=True)
    size = run_sync(transport.run(["stat", "-c", "%s", result["archive"]])).stdout
    result["archive_bytes"] = int(size.strip())
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
