"""The fast tier: no root, no testbed, no Ray; Slurm is scripted (tests/helpers/fakeslurm.py)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from jupyter_slurm_ray.cluster import SlurmRayCluster
from jupyter_slurm_ray.registry import Registry
from jupyter_slurm_ray.spec import ClusterSpec
from jupyter_slurm_ray.watch import watcher_for

from ..helpers.fakeslurm import FakeSlurm, FakeTransport


@pytest.fixture
def slurm() -> FakeSlurm:
    return FakeSlurm()


@pytest.fixture
def transport(slurm: FakeSlurm) -> FakeTransport:
    return FakeTransport(slurm)


@pytest.fixture
def registry(tmp_path: Path) -> Registry:
    return Registry(tmp_path / "state")


@pytest.fixture
def jobs_root(tmp_path: Path) -> Path:
    root = tmp_path / "jobs"
    root.mkdir(mode=0o700)
    return root


@pytest.fixture
async def make_cluster(transport, registry, jobs_root):
    """A cluster on the fake Slurm, polled every 50 ms, job dirs under the test's tmp dir.

    At the end the clusters are closed and their watcher has stopped: a task cancelled while
    it starts a subprocess can hang the loop's shutdown.
    """
    made: list[SlurmRayCluster] = []

    def make(**spec) -> SlurmRayCluster:
        settings = dict(time="10", job_dir_root=str(jobs_root), idle_timeout=8)
        settings.update(spec)
        cluster = SlurmRayCluster(
            ClusterSpec(**settings), transport, registry=registry, poll_interval=0.05
        )
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        await cluster.close_async()
    watcher = watcher_for(transport)
    if watcher._task is not None:
        await asyncio.wait_for(watcher._task, 10)


def emit(cluster: SlurmRayCluster, *events: dict) -> None:
    """Append the bootstrap's events to the cluster's events.jsonl, as the job would."""
    assert cluster.job_dir
    with open(Path(cluster.job_dir) / "events.jsonl", "a") as f:
        for event in events:
            f.write(json.dumps(event) + "\n")


def write_connection(cluster: SlurmRayCluster, **overrides) -> None:
    assert cluster.job_dir
    info = dict(
        head_ip="10.0.0.1",
        client_port=10001,
        dashboard_port=8265,
        gcs_address="10.0.0.1:6379",
        ray_version="2.60.0",
        python_version="3.11.2",
        node_count=1,
    )
    info.update(overrides)
    (Path(cluster.job_dir) / "connection.json").write_text(json.dumps(info))
