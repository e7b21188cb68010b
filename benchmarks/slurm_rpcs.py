"""Slurm RPCs per minute that one user puts on slurmctld in steady state, with 1, 10 and 100
clusters up, against the naive way (each kernel asks for its job every second on its own).

Each cluster is owned by its own "kernel" (its own transport, so its own job watcher, as in
separate processes) and all share the user's state dir, as on a login node; a Jupyter server
with the sidebar open lists the clusters every 5 s and keeps house every 10 s. Slurm is the
scripted one of the fast tier (tests/helpers/fakeslurm.py): the calls are counted, not timed,
so a minute of real time is spent per run; the bootstrap's events and leases are real files.
From the figures: what a site of 500 such users puts on the controller. Run:
    /opt/jupyter-slurm-ray/venv/bin/python benchmarks/slurm_rpcs.py
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.results import write_result
from jupyter_slurm_ray.cluster import SlurmRayCluster
from jupyter_slurm_ray.registry import Registry
from jupyter_slurm_ray.server.manager import ClusterManager
from jupyter_slurm_ray.spec import ClusterSpec
from jupyter_slurm_ray.states import State
from jupyter_slurm_ray.targets import Transports
from tests.fast.conftest import emit, write_connection
from tests.helpers.fakeslurm import FakeSlurm, FakeTransport

SIDEBAR_EVERY = 5.0  # the labextension's default refresh
SITE_USERS = 500


async def steady_clusters(
    slurm: FakeSlurm, root: Path, count: int, *, shared: bool, steady: float
) -> list[SlurmRayCluster]:
    """``count`` READY clusters, each in its own 'kernel'; with ``shared``, one state dir."""
    jobs = root / "jobs"
    jobs.mkdir(mode=0o700, exist_ok=True)
    clusters = []
    for i in range(count):
        state = root / ("state" if shared else f"state-{i}")
        cluster = SlurmRayCluster(
            ClusterSpec(time="60", job_dir_root=str(jobs), owner_timeout=600),
            FakeTransport(slurm),
            registry=Registry(state),
            poll_interval=1.0,
            steady_poll_interval=steady,
        )
        await cluster.up_async(wait=False)
        slurm.run(cluster.job_id or "")
        write_connection(cluster)
        emit(cluster, {"event": "phase", "phase": "bootstrap"}, {"event": "ready", "joined": 1})
        clusters.append(cluster)
    for cluster in clusters:
        while cluster.state is not State.READY:
            await asyncio.sleep(0.1)
    return clusters


async def sidebar_open(manager: ClusterManager, seconds: float) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while loop.time() < end:
        await manager.list()
        await asyncio.sleep(SIDEBAR_EVERY)


async def scenario(count: int, seconds: float, *, ours: bool) -> dict[str, float]:
    """squeue calls per minute for ``count`` steady clusters (+ a server, for ours)."""
    slurm = FakeSlurm()
    with tempfile.TemporaryDirectory(prefix="jsr-rpcs-") as tmp:
        root = Path(tmp)
        clusters = await steady_clusters(
            slurm, root, count, shared=ours, steady=15.0 if ours else 1.0
        )
        slurm.calls.clear()
        work = [asyncio.sleep(seconds)]
        if ours:
            manager = ClusterManager(
                Registry(root / "state"),
                Transports(lambda: FakeTransport(slurm)),
                resolve_spec=lambda settings, profile: ClusterSpec(**settings),
            )
            manager.start_housekeeping()
            work.append(sidebar_open(manager, seconds))
        await asyncio.gather(*work)
        calls = list(slurm.calls)
        if ours:
            await manager.close()
        for cluster in clusters:
            await cluster.close_async()
    minutes = seconds / 60
    squeue = sum(1 for c in calls if c[0] == "squeue")
    return {"squeue per min": squeue / minutes, "all Slurm RPCs per min": len(calls) / minutes}


async def main(seconds: float) -> None:
    counts = (1, 10, 100)
    ours = await asyncio.gather(*(scenario(n, seconds, ours=True) for n in counts))
    naive = await asyncio.gather(*(scenario(n, seconds, ours=False) for n in (1, 10)))
    figures: dict[str, dict[str, float]] = {}
    print(f"Slurm RPCs per minute of one user in steady state ({seconds:g} s per run)")
    print(f"{'clusters':>9} {'ours':>8} {'naive':>8} {'ratio':>7}")
    for n, mine, theirs in zip(counts, ours, [*naive, None], strict=True):
        rate = mine["all Slurm RPCs per min"]
        base = theirs["all Slurm RPCs per min"] if theirs else None
        ratio = f"{rate / base:7.3f}" if base else "      -"
        print(f"{n:9d} {rate:8.1f} {base if base is not None else float('nan'):8.1f} {ratio}")
        figures[f"{n} clusters"] = {"ours": rate, "naive": base or float("nan")}
    worst = max(m["all Slurm RPCs per min"] for m in ours) * SITE_USERS / 60
    naive_one = naive[0]["all Slurm RPCs per min"] * SITE_USERS / 60
    print(
        f"\na site of {SITE_USERS} such users (sidebar open, up to 100 clusters each): "
        f"{worst:.1f} RPC/s on slurmctld; naive, one cluster each: {naive_one:.0f} RPC/s"
    )
    figures["site"] = {"users": SITE_USERS, "rpc_per_s": worst, "naive_rpc_per_s": naive_one}
    write_result("slurm_rpcs", figures)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    asyncio.run(main(parser.parse_args().seconds))
