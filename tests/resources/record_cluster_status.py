"""Record Ray's ``api/cluster_status`` answers with pending placement groups, for the fast
tests of ``elastic/raydemand.py`` (tests/fast/test_placement_group_demand.py reads them from
``tests/resources/cluster_status/``). Run again when Ray's version changes, on the testbed:

    scripts/testbed exec -- env PYTHONPATH=$PWD <venv>/bin/python \
        -m tests.resources.record_cluster_status

A 1-node cluster of tests/test_placement_groups.py's shape (1 CPU, 2 fake GPUs) as the test
user; a Ray Client driver makes each situation, and each answer is kept once Ray's monitor has
written it twice (so that actors waiting for their group show too), as
``test-artifacts/cluster-status/NAME.json``; copy those wanted into
tests/resources/cluster_status/.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from jupyter_slurm_ray.bootstrap import dashhttp
from jupyter_slurm_ray.cluster import SlurmRayCluster
from jupyter_slurm_ray.registry import Registry
from jupyter_slurm_ray.transport import LocalTransport

from ..helpers.clusters import client_tls_environment, cluster_spec, wait_until_nothing_left
from ..helpers.paths import ARTIFACTS
from ..helpers.testbed import runuser

DRIVER = """
import json, os, sys, time
from pathlib import Path

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from jupyter_slurm_ray.bootstrap import dashhttp
from jupyter_slurm_ray.client.connect import connect_ray_client

address, token_path, url, out = sys.argv[1:5]
connect_ray_client(address, token_path, timeout=30)
token = Path(token_path).read_text().strip()


def record(name, wanted):
    times = []
    for _ in range(90):
        body = dashhttp.get_json(url, token, ca_file=os.environ.get("RAY_TLS_CA_CERT"))
        status = body["data"]["clusterStatus"]
        if wanted(status["loadMetricsReport"]):
            times.append(status["time"])
            if len(set(times)) >= 2:
                path = Path(out, name + ".json")
                path.write_text(json.dumps(body, indent=1, sort_keys=True) + "\\n")
                print("recorded", path, flush=True)
                return
        time.sleep(1)
    raise SystemExit(f"{name}: not seen in 90 s")


def in_bundle(group, index):
    return PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)


@ray.remote(num_cpus=0.5, num_gpus=1)
class Worker:
    def ping(self):
        return 1


@ray.remote(num_cpus=0.25, num_gpus=0.5)
class Half:
    def ping(self):
        return 1


@ray.remote(num_gpus=2)
def two_gpus():
    return 2


def quiet():
    record("nothing-pending", lambda r: not r.get("pgDemand") and not r.get("resourceDemand"))


# A STRICT_SPREAD group of 3 on one node, an actor waiting for each of its bundles.
spread = placement_group([{"CPU": 0.5, "GPU": 1}] * 3, strategy="STRICT_SPREAD")
waiting = [Worker.options(scheduling_strategy=in_bundle(spread, i)).remote() for i in range(3)]
record("pending-strict-spread-with-actors", lambda r: r.get("pgDemand"))
for actor in waiting:
    ray.kill(actor)
remove_placement_group(spread)
quiet()

# A placed group holding one GPU (an actor on half of it); then a PACK group of two one-GPU
# bundles and a task of 2 GPUs, both pending.
held = placement_group([{"CPU": 0.5, "GPU": 1}], strategy="PACK")
ray.get(held.ready(), timeout=60)
half = Half.options(scheduling_strategy=in_bundle(held, 0)).remote()
ray.get(half.ping.remote(), timeout=60)
pack = placement_group([{"CPU": 0.25, "GPU": 1}] * 2, strategy="PACK")
task = two_gpus.remote()
record(
    "pending-pack-and-a-task-beside-a-placed-group",
    lambda r: r.get("pgDemand") and r.get("resourceDemand"),
)
ray.cancel(task, force=True)
remove_placement_group(pack)
ray.kill(half)
remove_placement_group(held)
quiet()

# A STRICT_PACK group larger than any node (3 GPUs on one node of 2).
big = placement_group([{"CPU": 0.25, "GPU": 1}] * 3, strategy="STRICT_PACK")
record("pending-strict-pack-larger-than-a-node", lambda r: r.get("pgDemand"))
remove_placement_group(big)
"""


def main() -> None:
    out = ARTIFACTS / "cluster-status"
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="jsr-record-") as state:
        record_into(out, Registry(Path(state)))


def record_into(out: Path, registry: Registry) -> None:
    spec = cluster_spec(cpus_per_node=1, gpus_per_node=2, owner_timeout=60)
    cluster = SlurmRayCluster(spec, LocalTransport(runuser("alice")), registry=registry)
    cluster.up(connect=False, queue_timeout=300)
    try:
        info = cluster.connection_info()
        token = Path(f"{cluster.job_dir}/ray_token").read_text().strip()
        token_path = registry.store_token(cluster.id, token)
        path = "api/cluster_status"
        url = dashhttp.dashboard_url(info.head_ip, info.dashboard_port, path, tls=info.tls)
        address = f"ray://{info.head_ip}:{info.client_port}"
        argv = [sys.executable, "-c", textwrap.dedent(DRIVER), address, str(token_path), url]
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        env["RAY_USAGE_STATS_ENABLED"] = "0"
        env.update(client_tls_environment(cluster.job_dir))
        subprocess.run([*argv, str(out)], check=True, timeout=600, env=env)
    finally:
        cluster.down()
        wait_until_nothing_left(cluster.job_id, cluster.job_dir)


if __name__ == "__main__":
    main()
