"""The Slurm layer against the real testbed, as the unprivileged user, over both transports.

Its logic on a scripted Slurm (fallbacks, silence, tags) is in tests/fast/test_slurm_client.py.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Sequence

import pytest

from jupyter_slurm_ray.errors import SlurmError
from jupyter_slurm_ray.job.script import render_job_script
from jupyter_slurm_ray.scheduler.records import JobInfo
from jupyter_slurm_ray.slurm.client import SlurmClient
from jupyter_slurm_ray.slurm.watch import JobNews, JobWatcher
from jupyter_slurm_ray.spec import ClusterSpec
from jupyter_slurm_ray.transport import CommandResult, LocalTransport, Transport

from .helpers.jobs import submit_script
from .helpers.testbed import SOLO, runuser

pytestmark = [pytest.mark.testbed, pytest.mark.compat]


async def submit(
    transport: Transport, name: str, command: Sequence[str], cancel_jobs: list[str], **spec
) -> tuple[SlurmClient, str]:
    spec.setdefault("time", "5")
    cluster_spec = ClusterSpec(name=name, **spec)
    job_dir = f"{await transport.home()}/.jsr-test-jobs/{name}"
    script = render_job_script(
        cluster_spec, cluster_id=f"id-{name}", job_dir=job_dir, command=command
    )
    slurm = SlurmClient(transport)
    job_id = await submit_script(transport, script, job_dir)
    cancel_jobs.append(job_id)
    return slurm, job_id


async def watch_until(slurm: SlurmClient, job_id: str, done, timeout: float = 60) -> list[JobInfo]:
    """Poll every 0.2 s; return the distinct states seen, stopping when ``done(info)``."""
    seen: list[JobInfo] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = (await slurm.query([job_id]))[job_id]
        if not seen or seen[-1].state != info.state:
            seen.append(info)
        if done(info):
            return seen
        await asyncio.sleep(0.2)
    raise AssertionError(f"job {job_id} never got there; seen {[i.state for i in seen]}")


@pytest.mark.solo  # two nodes at once, within the watch's bounded wait
async def test_two_node_job_goes_pending_running_completed(
    transport, unique_name, cancel_jobs, solo_nodes
):
    slurm, job_id = await submit(
        transport,
        unique_name,
        ["sleep", "3"],
        cancel_jobs,
        partition=SOLO,
        nodes=2,
        extra_sbatch=["--begin=now+2"],  # hold it in the queue long enough to be seen
    )
    seen = await watch_until(slurm, job_id, lambda i: i.is_final)
    # COMPLETING (Slurm ending the job's processes) shows when a poll falls in it: under load
    seen = [i for i in seen if i.state != "COMPLETING"]
    assert [i.state for i in seen] == ["PENDING", "RUNNING", "COMPLETED"]
    assert seen[0].reason == "BeginTime"
    # which two nodes is Slurm's choice: two of the solo partition's, the same while running
    # and once completed
    assert len(set(seen[1].nodes)) == 2 and set(seen[1].nodes) <= set(solo_nodes)
    assert seen[1].nodes == seen[2].nodes
    assert seen[2].exit_code == 0


async def test_an_impossible_job_is_refused_or_stays_pending_and_cancel_works(
    transport, unique_name, cancel_jobs, testbed
):
    """More nodes than the partition has: Slurm 22.05 and 26.05 queue the job, PENDING with its
    reason for ever, and cancelling ends it; 24.11 refuses it at submit, in its words
    (tests/fast/test_slurm_releases.py has each release's answer)."""
    try:
        slurm, job_id = await submit(
            transport, unique_name, ["true"], cancel_jobs, nodes=testbed.nodes + 1
        )
    except SlurmError as refused:
        assert "Requested node configuration is not available" in str(refused)
        return
    seen = await watch_until(slurm, job_id, lambda i: i.reason == "PartitionNodeLimit", 20)
    assert seen[-1].state == "PENDING" and seen[-1].nodes == ()
    await slurm.cancel(job_id)
    seen = await watch_until(slurm, job_id, lambda i: i.is_final, 20)
    assert seen[-1].state == "CANCELLED"


async def test_final_state_and_exit_code_outlive_squeue(local, unique_name, cancel_jobs, testbed):
    """MinJobAge is short on the testbed, so squeue forgets jobs quickly; sacct -c remembers."""
    slurm, job_id = await submit(local, unique_name, ["sh", "-c", "exit 3"], cancel_jobs)
    # squeue may show FAILED a moment before the exit code: wait for the code as well
    await watch_until(slurm, job_id, lambda i: i.is_final and (i.exit_code or i.state != "FAILED"))
    final = (await slurm.query([job_id]))[job_id]
    assert (final.state, final.exit_code) == ("FAILED", 3)
    deadline = time.monotonic() + 150
    while job_id in await slurm._squeue([job_id]):
        assert time.monotonic() < deadline, "squeue never forgot the job"
        await asyncio.sleep(2)
    info = (await slurm.query([job_id]))[job_id]
    assert (info.state, info.exit_code, info.source) == ("FAILED", 3, "sacct")
    # the node Slurm chose (other tests may hold some), remembered by sacct
    assert len(final.nodes) == 1 and final.nodes[0] in testbed.node_names
    assert info.nodes == final.nodes


class CountingTransport(LocalTransport):
    """A real local transport that records every command it runs."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.commands: list[str] = []

    async def run(self, argv, **kwargs) -> CommandResult:
        self.commands.append(argv[0])
        return await super().run(argv, **kwargs)


async def test_watching_many_jobs_costs_one_squeue_per_poll(testbed, unique_name, cancel_jobs):
    transport = CountingTransport(runuser(testbed.user))
    job_ids = []
    for i in range(5):
        _, job_id = await submit(
            transport, f"{unique_name}-{i}", ["sleep", "30"], cancel_jobs, nodes=1
        )
        job_ids.append(job_id)
    watcher = JobWatcher(SlurmClient(transport), interval=0.5)
    seen: dict[str, JobInfo | None] = {}

    async def remember(job_id: str, answer: JobNews) -> None:
        assert answer.answered
        seen[job_id] = answer.job

    transport.commands.clear()
    for job_id in job_ids:
        watcher.watch(job_id, lambda answer, j=job_id: remember(j, answer))
    await asyncio.sleep(2.2)  # the watcher polls by itself
    polls = watcher.polls
    for job_id in job_ids:
        for callback in list(watcher._subscribers.get(job_id, [])):
            watcher.unwatch(job_id, callback)
    assert polls >= 3
    assert transport.commands == ["squeue"] * polls
    assert set(seen) == set(job_ids) and all(i and not i.is_final for i in seen.values())


async def test_sbatch_ignores_sbatch_variables_of_the_submitting_environment(
    testbed, unique_name, cancel_jobs
):
    """The job is what the script says, even if the kernel's environment has SBATCH_*."""
    transport = LocalTransport(
        ["env", "SBATCH_PARTITION=short", "SBATCH_JOB_NAME=x", *runuser(testbed.user)]
    )
    _, job_id = await submit(transport, unique_name, ["true"], cancel_jobs)
    out = subprocess.run(
        ["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%P %j"], capture_output=True, text=True
    ).stdout.split()
    assert out == ["debug", unique_name]


async def test_sbatch_refusals_carry_slurms_message(transport, unique_name, cancel_jobs):
    with pytest.raises(SlurmError, match="invalid partition specified: nosuch"):
        await submit(transport, unique_name, ["true"], cancel_jobs, partition="nosuch")
    with pytest.raises(SlurmError, match="Requested node configuration is not available"):
        await submit(transport, unique_name, ["true"], cancel_jobs, gpus_per_node=99)


async def test_partitions_for_the_widget(transport, testbed):
    partitions = {p.name: p for p in await SlurmClient(transport).partitions()}
    assert set(partitions) == {"debug", "short", SOLO, f"{SOLO}-short"}
    debug = partitions["debug"]
    assert debug.is_default and debug.total_nodes == testbed.nodes and debug.max_time is None
    assert debug.gpus_per_node == testbed.gpus and debug.cpus_per_node >= 1
    assert partitions["short"].max_time == 30 * 60
