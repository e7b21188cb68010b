"""What Ray's TLS costs: the same 2-node cluster with ``tls`` on and off, in one process, the two
interleaved (off, on, off, on, …), the figures of TLS printed as ratios against the run
without it (the baseline):

- start: ``up()`` until CONNECTED (Ray Client), and the bootstrap's own ready time;
- task round trip: one tiny task at a time through Ray Client (median of many);
- 1 GiB through Ray Client: ``ray.put`` of 1 GiB from the kernel, then ``ray.get`` of it;
- 1 GiB between nodes: a task on the second node makes 1 GiB, a task on the head's node
  reads it (Ray's object manager: the raylets' TLS channels).

Run on the login node (it submits as the test user; a few minutes):

    scripts/testbed exec -- /opt/jupyter-slurm-ray/venv/bin/python benchmarks/tls.py
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.results import write_result
from jupyter_slurm_ray.cluster import SlurmRayCluster
from jupyter_slurm_ray.registry import Registry
from jupyter_slurm_ray.states import State
from jupyter_slurm_ray.transport import LocalTransport
from tests.helpers.clusters import cluster_spec, wait_until_nothing_left
from tests.helpers.testbed import runuser

GIB = 1024**3
ROUND_TRIPS = 300


def one_run(registry: Registry, tls: bool) -> dict[str, float]:
    spec = cluster_spec(
        nodes=2,
        cpus_per_node=1,
        mem_per_node="3000M",
        object_store_memory=int(1.4 * GIB),
        tls=tls,
        extra_sbatch=["--nodelist=node1,node2"],
    )
    cluster = SlurmRayCluster(spec, LocalTransport(runuser("alice")), registry=registry)
    started = time.monotonic()
    try:
        cluster.up()
        figures = {"up_to_connected_s": time.monotonic() - started}
        ready = next(e for e in cluster.events if e["event"] == "ready")
        figures["bootstrap_ready_s"] = float(ready["elapsed"])
        figures.update(workload())
    finally:
        cluster.down()
        wait_until_nothing_left(cluster.job_id, cluster.job_dir)
    assert cluster.state is State.STOPPED
    return figures


def workload() -> dict[str, float]:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy as On

    @ray.remote(num_cpus=0)
    def tiny() -> int:
        return 1

    ray.get(tiny.remote())  # a worker ready
    trips = []
    for _ in range(ROUND_TRIPS):
        begun = time.perf_counter()
        ray.get(tiny.remote())
        trips.append(time.perf_counter() - begun)
    figures = {"task_round_trip_ms": statistics.median(trips) * 1000}

    data = bytes(GIB)
    begun = time.perf_counter()
    ref = ray.put(data)
    back = ray.get(ref)
    figures["gib_put_get_client_s"] = time.perf_counter() - begun
    assert len(back) == GIB
    del ref, back, data

    head = ray.get_runtime_context().gcs_address.split(":")[0]
    nodes = {n["NodeManagerAddress"]: n["NodeID"] for n in ray.nodes() if n["Alive"]}
    other = next(node for address, node in nodes.items() if address != head)

    @ray.remote(num_cpus=0)
    def make() -> bytes:
        return bytes(GIB)

    @ray.remote(num_cpus=0)
    def size(data: bytes) -> int:
        return len(data)

    begun = time.perf_counter()
    made = make.options(scheduling_strategy=On(other, soft=False)).remote()
    read = size.options(scheduling_strategy=On(nodes[head], soft=False)).remote(made)
    assert ray.get(read) == GIB
    figures["gib_between_nodes_s"] = time.perf_counter() - begun
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="runs of each, interleaved")
    rounds = parser.parse_args().rounds
    logging.basicConfig(level=logging.WARNING)
    runs: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory(prefix="jsr-bench-tls-") as state:
        registry = Registry(Path(state))
        for _ in range(rounds):
            for name, tls in (("off", False), ("on", True)):
                runs[name].append(one_run(registry, tls))
                print(name, {k: round(v, 3) for k, v in runs[name][-1].items()}, flush=True)
    medians = {
        name: {key: statistics.median(run[key] for run in done) for key in done[0]}
        for name, done in runs.items()
    }
    print(f"\nTLS on against off (the baseline), medians of {rounds} runs each:")
    for key, baseline in medians["off"].items():
        value = medians["on"][key]
        print(f"  {key:24} off {baseline:9.3f}  on {value:9.3f}  ratio {value / baseline:5.2f}")
    write_result("tls", {"rounds": rounds, "medians": medians, "runs": runs})


if __name__ == "__main__":
    main()
