"""The package's footprint in a kernel, each figure beside a baseline measured in the same run:

- importing the package (what ``%load_ext jupyter_slurm_ray`` imports), in fresh interpreters,
  against ``import ray`` (what a Ray notebook pays anyway); target < 200 ms;
- the kernel's memory (RSS) with the extension loaded and one connected one-node cluster,
  beyond ``import ray`` (target < 50 MB), split into the package itself and Ray Client's
  connection;
- listing 100 clusters (100 records, their jobs held in the real Slurm queue, one squeue)
  in-process, against one bare ``squeue`` through the same transport; target < 100 ms.

Run on the testbed's login node:
    scripts/testbed exec -- /opt/jupyter-slurm-ray/venv/bin/python benchmarks/footprint.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.results import write_result
from jupyter_slurm_ray.inventory import Inventory
from jupyter_slurm_ray.naming import new_cluster_id
from jupyter_slurm_ray.registry import ClusterRecord, Registry
from jupyter_slurm_ray.slurm.client import SlurmClient
from jupyter_slurm_ray.targets import Transports
from jupyter_slurm_ray.transport import LocalTransport
from tests.helpers.paths import VENV_PYTHON
from tests.helpers.testbed import USER, runuser

IMPORT_PROBE = """
import time
import IPython, ipykernel.ipkernel  # a kernel has them loaded already
started = time.perf_counter()
import {module}
print(time.perf_counter() - started)
"""

# One fresh "kernel": IPython and ray imported, then the extension loaded, a cluster up and
# connected; RSS after each step, as JSON (not USS: pages shared for a moment with the
# children this process spawns, e.g. Slurm commands, would not count).
MEMORY_PROBE = """
import gc, json, sys, tempfile
import psutil
import IPython
sys.path.insert(0, {root!r})
me = psutil.Process()
def rss():
    gc.collect()
    return me.memory_info().rss / 2**20
import ray
after_ray = rss()
import jupyter_slurm_ray, jupyter_slurm_ray.ui.magics, jupyter_slurm_ray.ui.widget
from jupyter_slurm_ray.cluster import SlurmRayCluster
from jupyter_slurm_ray.registry import Registry
from jupyter_slurm_ray.transport import LocalTransport
from tests.helpers.clusters import cluster_spec
from tests.helpers.testbed import USER, runuser
cluster = SlurmRayCluster(
    cluster_spec(nodes=1), LocalTransport(runuser(USER)),
    registry=Registry(tempfile.mkdtemp(prefix="jsr-footprint-")),
)
cluster.up(connect=False)
extension_up = rss()
cluster.connect()
connected = rss()
print(json.dumps({{"after import ray": after_ray, "extension + cluster up": extension_up,
                  "connected": connected}}))
cluster.down()
"""


def import_seconds(module: str, repeats: int) -> float:
    runs = []
    for _ in range(repeats):
        out = subprocess.run(
            [VENV_PYTHON, "-c", IMPORT_PROBE.format(module=module)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        runs.append(float(out.strip().splitlines()[-1]))
    return statistics.median(runs)


def kernel_memory() -> dict[str, float]:
    root = str(Path(__file__).resolve().parent.parent)
    out = subprocess.run(
        [VENV_PYTHON, "-c", MEMORY_PROBE.format(root=root)],
        capture_output=True,
        text=True,
        check=True,
        cwd=root,
    ).stdout
    return json.loads(next(line for line in out.splitlines() if line.startswith("{")))


async def listing(records: int, repeats: int) -> dict[str, float]:
    """ms to list ``records`` clusters with one squeue, and one bare squeue, medians."""
    transport = LocalTransport(runuser(USER))
    submitted = await transport.run(
        ["sh", "-c", f'for i in $(seq {records}); do sbatch --parsable --hold -t 1 -o /dev/null '
         '--wrap true; done']
    )  # fmt: skip
    job_ids = submitted.stdout.split()
    try:
        with tempfile.TemporaryDirectory(prefix="jsr-list-") as state:
            registry = Registry(state)
            for job_id in job_ids:
                name = f"c{job_id}"
                registry.save(
                    ClusterRecord(
                        id=new_cluster_id(name), name=name, target=transport.target, job_dir="/x",
                        job_id=job_id, state="PENDING",
                    )
                )  # fmt: skip
            inventory = Inventory(registry, Transports(lambda: transport), shared_max_age=0)
            slurm = SlurmClient(transport)
            list_ms, squeue_ms = [], []
            for _ in range(repeats):
                started = time.perf_counter()
                entries = await inventory.entries()
                list_ms.append((time.perf_counter() - started) * 1000)
                started = time.perf_counter()
                await slurm.query(job_ids)
                squeue_ms.append((time.perf_counter() - started) * 1000)
            assert len(entries) == records and inventory.slurm_queries == repeats
    finally:
        await transport.run(["scancel", *job_ids])
    return {"list": statistics.median(list_ms), "bare squeue": statistics.median(squeue_ms)}


def main(repeats: int) -> None:
    figures: dict[str, dict[str, float]] = {}
    package = import_seconds("jupyter_slurm_ray, jupyter_slurm_ray.ui.magics", repeats) * 1000
    ray = import_seconds("ray", repeats) * 1000
    figures["import ms"] = {"package": package, "ray": ray, "ratio": package / ray}
    print(f"import (median of {repeats} fresh interpreters)")
    print(f"  jupyter_slurm_ray + magics {package:7.0f} ms   (import ray {ray:.0f} ms; "
          f"ratio {package / ray:.2f}; target < 200 ms)")  # fmt: skip
    memory = kernel_memory()
    base = memory["after import ray"]
    extension = memory["extension + cluster up"] - base
    total = memory["connected"] - base
    figures["kernel MB (RSS)"] = {**memory, "beyond import ray": total, "extension": extension}
    print("kernel memory (RSS) beyond import ray, one connected one-node cluster")
    print(f"  package, its watcher and the cluster object {extension:6.1f} MB")
    print(f"  + Ray Client's connection                   {total - extension:6.1f} MB")
    print(f"  total beyond import ray ({base:.0f} MB)          {total:6.1f} MB   (target < 50 MB)")
    rows = asyncio.run(listing(100, repeats * 4))
    figures["list of 100 ms"] = {**rows, "ratio": rows["list"] / rows["bare squeue"]}
    print(f"list of 100 clusters, one squeue (median of {repeats * 4})")
    print(f"  list {rows['list']:6.1f} ms   bare squeue {rows['bare squeue']:6.1f} ms   "
          f"(ratio {rows['list'] / rows['bare squeue']:.2f}; target < 100 ms)")  # fmt: skip
    write_result("footprint", figures)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    main(parser.parse_args().repeats)
