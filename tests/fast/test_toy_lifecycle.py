"""A cluster's whole lifecycle on the toy scheduler (tests/helpers/toyscheduler.py, one file,
registered as its entry point would be): up, its job running, READY, down, the job ended and
nothing left. The package is not told of the toy anywhere else: ``mode="toy"`` picks it.

The job script runs for real (bash, in its ``--chdir``), its ``python`` a stand-in that waits
as the bootstrap would; the test writes the bootstrap's events and connection, as the fast
tier's other cluster tests do (no Ray here)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from jupyter_slurm_ray.cluster import SlurmRayCluster
from jupyter_slurm_ray.config import resolve_spec
from jupyter_slurm_ray.errors import SpecError
from jupyter_slurm_ray.registry import Registry
from jupyter_slurm_ray.scheduler import kinds
from jupyter_slurm_ray.slurm.sitecheck import check_with_slurm
from jupyter_slurm_ray.spec import ClusterSpec, ignored_by_mode
from jupyter_slurm_ray.states import State
from jupyter_slurm_ray.transport import LocalTransport

from ..helpers.toyscheduler import ToyScheduler
from ..helpers.waiting import until
from .conftest import emit, write_connection


@pytest.fixture
def toy() -> Iterator[type[ToyScheduler]]:
    kinds.register(ToyScheduler)
    yield ToyScheduler
    kinds.unregister(ToyScheduler.mode)


@pytest.fixture
def stand_in_python(tmp_path: Path) -> str:
    """What the job script execs as its python: waits, as the bootstrap does, until stopped."""
    path = tmp_path / "bin" / "python"
    path.parent.mkdir()
    path.write_text("#!/bin/sh\nexec sleep 300\n")
    path.chmod(0o755)
    return str(path)


async def test_a_cluster_lives_its_whole_life_on_the_toy_scheduler(
    toy, stand_in_python: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    registry = Registry(tmp_path / "state")
    spec = ClusterSpec(
        mode="toy", time="10", python=stand_in_python, job_dir_root=str(tmp_path / "jobs")
    )
    cluster = SlurmRayCluster(
        spec, LocalTransport(), registry=registry, poll_interval=0.05, steady_poll_interval=0.05
    )
    assert isinstance(cluster.slurm, toy)

    await cluster.up_async(wait=False)
    job_id = cluster.job_id
    assert job_id is not None and toy.owns(job_id)
    process = toy._jobs[job_id]
    await until(lambda: cluster.state is State.STARTING, 10, "STARTING: the toy runs the job")
    assert (Path(cluster.job_dir) / "job.sbatch").read_text().startswith("#!/bin/bash")

    write_connection(cluster)
    emit(cluster, {"event": "ready", "joined": 1, "node_count": 1})
    await until(lambda: cluster.state is State.READY, 10, "READY")
    assert registry.load(cluster.id).state == "READY"
    assert registry.load(cluster.id).job_id == job_id

    await cluster.down_async()
    await asyncio.wait_for(process.wait(), 10)  # the job's process is gone ...
    assert toy._cancelled >= {job_id}
    answer = (await toy(LocalTransport()).query([job_id]))[job_id]
    assert answer.state == "CANCELLED" and answer.is_final  # ... and the toy says so
    record = registry.load(cluster.id)
    assert State(record.state).is_final and record.job_id == job_id  # no record claims it lives
    await cluster.close_async()


def test_what_the_toy_decides_is_left_out_of_the_configuration_and_refused_when_asked(
    toy,
) -> None:
    """The spec asks the mode's kind what it decides itself, never which kind it is: the toy's
    one queue needs no line of the package."""
    spec, sources = resolve_spec({"mode": "toy", "partition": "short", "time": "10"}, environ={})
    assert spec.partition is None
    assert ignored_by_mode(sources) == [
        "partition: ignored with mode 'toy': the toy scheduler has one queue (argument asked short)"
    ]
    with pytest.raises(SpecError) as refused:
        ClusterSpec(mode="toy", partition="short")
    assert refused.value.field == "partition"
    assert "unset with the toy scheduler: the toy scheduler has one queue" in str(refused.value)
    assert ClusterSpec(mode="toy").needs_walltime  # the toy decides no walltime


def test_a_jobs_extra_options_are_refused_by_the_scheduler_that_reads_them(toy) -> None:
    """Slurm's own options (``--time``: the time setting) are Slurm's to refuse; the toy
    refuses its own, and Slurm's table is not asked for it."""
    with pytest.raises(SpecError, match="--time is set by jupyter_slurm_ray: use the time"):
        ClusterSpec(extra_sbatch=("--time=5",))
    assert ClusterSpec(mode="toy", extra_sbatch=("--time=5",)).extra_sbatch == ("--time=5",)
    with pytest.raises(SpecError, match="the toy scheduler has one queue") as refused:
        ClusterSpec(mode="toy", extra_sbatch=("--queue=fast",))
    assert refused.value.field == "extra_sbatch"


async def test_the_site_check_asks_the_toy_and_never_slurm(toy) -> None:
    """``usecases.submit``'s site check asks the mode's scheduler for partitions, accounting
    and memory policy: the toy has none (the interface's answers), no Slurm command runs, and
    the notes say what was not checked."""

    class Recording(LocalTransport):
        def __init__(self) -> None:
            super().__init__()
            self.argvs: list[list[str]] = []

        async def run(self, argv, **options):  # type: ignore[no-untyped-def]
            self.argvs.append(list(argv))
            return await super().run(argv, **options)

    transport = Recording()
    checked = await check_with_slurm(ClusterSpec(mode="toy", time="10"), transport)
    assert transport.argvs == [] and checked.partitions == []
    assert checked.notes == (
        "account and QOS not checked: the toy scheduler's accounting did not answer "
        "(the toy scheduler has no Slurm accounting)",
    )
