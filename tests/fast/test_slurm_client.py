"""The Slurm layer on a scripted Slurm: one squeue for many jobs, accounting and scontrol for ended
ones, silence told apart from "no such job", submit, tags and node reasons."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from jupyter_slurm_ray.errors import SlurmError, SlurmUnavailable, SpecError
from jupyter_slurm_ray.naming import job_comment
from jupyter_slurm_ray.slurm.client import SlurmClient
from jupyter_slurm_ray.slurm.queuecache import SharedQueue
from jupyter_slurm_ray.slurm.watch import JobNews, JobWatcher
from jupyter_slurm_ray.spec import ClusterSpec
from jupyter_slurm_ray.transport import LocalTransport

from ..helpers.fakeslurm import FakeJob, FakeSlurm
from ..helpers.waiting import until


@pytest.fixture
def client(transport) -> SlurmClient:
    return SlurmClient(transport)


def add(slurm: FakeSlurm, job_id: str, state: str = "RUNNING", **fields) -> FakeJob:
    job = FakeJob(job_id, "", state=state, **fields)
    slurm.jobs[job_id] = job
    return job


def commands(slurm: FakeSlurm) -> list[str]:
    return [call[0] for call in slurm.calls]


async def test_many_jobs_cost_one_squeue(slurm, client):
    add(slurm, "100", nodes="node[1-2]")
    add(slurm, "101", state="PENDING", reason="Resources")
    add(slurm, "102", state="COMPLETING")
    infos = await client.query(["102", "100", "101", "100"])
    assert commands(slurm) == ["squeue"] and client.commands_run == 1
    assert list(infos) == ["100", "101", "102"]
    assert infos["100"].nodes == ("node1", "node2") and infos["100"].is_running
    assert (infos["101"].state, infos["101"].reason) == ("PENDING", "Resources")


async def test_an_ended_job_gets_its_exit_code_from_accounting(slurm, client):
    slurm.accounting = True
    add(slurm, "100", state="FAILED", exit_code="3:0", nodes="node1")
    info = (await client.query(["100"]))["100"]
    assert (info.state, info.exit_code, info.nodes) == ("FAILED", 3, ("node1",))
    assert commands(slurm) == ["squeue", "sacct"]


async def test_a_job_squeue_forgot_is_found_in_accounting(slurm, client):
    slurm.accounting = True
    add(slurm, "100", state="CANCELLED", exit_code="0:15", forgotten=True)
    add(slurm, "101")
    infos = await client.query(["100", "101"])
    assert (infos["100"].state, infos["100"].exit_code, infos["100"].source) == (
        "CANCELLED",
        128 + 15,
        "sacct",
    )
    assert infos["101"].state == "RUNNING"


async def test_without_accounting_slurmctld_is_asked_about_ended_jobs(slurm, client):
    add(slurm, "100", state="TIMEOUT", exit_code="0:1")
    info = (await client.query(["100"]))["100"]
    assert (info.state, info.exit_code) == ("TIMEOUT", 129)
    assert commands(slurm) == ["squeue", "sacct", "sacct", "scontrol"]  # sacct, then sacct -c


async def test_a_job_slurm_no_longer_knows_is_missing_from_the_answer(slurm, client):
    add(slurm, "100", state="COMPLETED", forgotten=True)
    add(slurm, "101")
    infos = await client.query(["100", "101"])
    assert "100" not in infos and infos["101"].state == "RUNNING"


async def test_jobs_a_fresh_squeue_no_longer_shows_are_not_asked_of_slurmctld_one_by_one(
    slurm, client
):
    for job_id in ("100", "101", "102"):  # old job dirs' jobs, long forgotten
        add(slurm, job_id, state="COMPLETED", forgotten=True)
    add(slurm, "103")
    assert list(await client.query(["100", "101", "102", "103"])) == ["103"]
    assert commands(slurm) == ["squeue", "sacct", "sacct"]  # slurmctld already said


async def test_a_job_newer_than_the_shared_queues_answer_is_asked_of_slurmctld(
    slurm, transport, tmp_path: Path
):
    shared = SharedQueue(tmp_path, transport.target)
    kernel = SlurmClient(transport, shared=shared)
    assert await kernel.query(["100"], max_age=60) == {}  # the queue, asked before 100 ran
    add(slurm, "100", state="COMPLETED", exit_code="0:0")
    info = (await kernel.query(["100"], max_age=60))["100"]
    assert info.state == "COMPLETED" and commands(slurm)[-1] == "scontrol"


async def test_invalid_job_id_is_an_answer_not_silence(slurm, client):
    add(slurm, "100", state="COMPLETED", forgotten=True)  # squeue: "Invalid job id specified"
    assert await client.query(["100"]) == {}
    assert commands(slurm)[0] == "squeue"


async def test_a_controller_that_does_not_answer_raises_slurm_unavailable(slurm, client):
    add(slurm, "100")
    slurm.down = True
    with pytest.raises(SlurmUnavailable, match="Unable to contact slurm controller"):
        await client.query(["100"])


@pytest.mark.parametrize("command", ["squeue", "scontrol"])
async def test_a_command_without_answer_raises_slurm_unavailable(slurm, transport, command):
    add(slurm, "100", state="COMPLETED")  # ended, no accounting: scontrol is asked too
    transport.hang_before = command
    with pytest.raises(SlurmUnavailable, match=f"{command}: .*did not finish"):
        await SlurmClient(transport).query(["100"])


async def test_a_malformed_job_id_never_reaches_slurm(slurm, client):
    with pytest.raises(SlurmError, match="not a Slurm job id"):
        await client.query(["100;scancel -u alice"])
    assert slurm.calls == []


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("partition", "debug; touch /tmp/jsr-pwned"),
        ("name", "x$(touch /tmp/jsr-pwned)"),
        ("name", "two\nlines"),
        ("extra_sbatch", ["-N 3"]),
        ("time", "-1"),
        ("time", "25:99:99x"),
        ("mem_per_node", "lots"),
    ],
)
def test_hostile_input_never_reaches_slurm(transport, field, value):
    with pytest.raises(SpecError) as info:
        ClusterSpec(**{"time": "5", field: value})
    assert info.value.field == field
    assert transport.commands == []


async def test_watching_many_jobs_costs_one_squeue_per_poll(slurm, client):
    job_ids = [add(slurm, str(100 + i)).job_id for i in range(5)]
    watcher = JobWatcher(client, interval=0.02)
    seen: dict[str, JobNews] = {}

    def remember(job_id: str):
        async def callback(answer: JobNews) -> None:
            seen[job_id] = answer

        return callback

    callbacks = {job_id: remember(job_id) for job_id in job_ids}
    for job_id, callback in callbacks.items():
        watcher.watch(job_id, callback)
    await until(lambda: watcher.polls >= 3 and len(seen) == 5, 5, "three polls")
    for job_id, callback in callbacks.items():
        watcher.unwatch(job_id, callback)
    assert watcher._task is not None
    await asyncio.wait_for(watcher._task, 5)
    assert commands(slurm) == ["squeue"] * watcher.polls
    assert all(a.answered and a.job and a.job.state == "RUNNING" for a in seen.values())


async def test_submit_answers_the_job_id(slurm, client, tmp_path: Path):
    script = tmp_path / "job.sbatch"
    script.write_text(f"#!/bin/bash\n#SBATCH --comment={job_comment('c-0001')}\ntrue\n")
    job_id = await client.submit(str(script))
    assert job_id == "100" and slurm.jobs["100"].comment == job_comment("c-0001")


async def test_a_refused_submit_carries_slurms_words(slurm, client, tmp_path: Path):
    slurm.refuse_submit = "invalid partition specified: nosuch"
    (tmp_path / "job.sbatch").write_text("#!/bin/bash\ntrue\n")
    with pytest.raises(SlurmError, match=r"^sbatch failed: invalid partition specified: nosuch$"):
        await client.submit(str(tmp_path / "job.sbatch"))


FAKE_SBATCH = """#!/bin/sh
env | grep '^SBATCH_' > "$(dirname "$0")/sbatch-environment"
echo "4242;cluster"
"""


async def test_sbatch_gets_no_sbatch_variables_of_the_submitting_environment(
    tmp_path: Path, monkeypatch
):
    """The package's own submit program runs for real, with an sbatch stand-in on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(FAKE_SBATCH)
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SBATCH_PARTITION", "short")
    monkeypatch.setenv("SBATCH_TIMELIMIT", "1")
    job_id = await SlurmClient(LocalTransport()).submit("#!/bin/bash\ntrue\n")
    assert job_id == "4242"
    assert (bin_dir / "sbatch-environment").read_text() == ""


async def test_tagged_jobs_are_this_users_active_jobs_with_a_cluster_tag(slurm, client):
    add(slurm, "100", comment=job_comment("a-0001"))
    add(slurm, "101", state="PENDING", comment=job_comment("a-0001"))
    add(slurm, "102", comment=job_comment("b-0002"))
    add(slurm, "103", comment="someone else's job")
    add(slurm, "104", state="COMPLETED", comment=job_comment("c-0003"))
    assert await client.tagged_jobs() == {"100": "a-0001", "101": "a-0001", "102": "b-0002"}
    assert await client.find_tagged("a-0001") == "101"  # the newest
    assert await client.find_tagged("c-0003") is None
    assert all("--me" in call for call in slurm.calls)


async def test_node_reasons_name_each_node(slurm, client):
    slurm.node_reasons = {"node[1-2]": "Not responding", "node3": "Kill task failed"}
    reasons = await client.node_reasons(["node1", "node2", "node3"])
    assert reasons == {
        "node1": "Not responding",
        "node2": "Not responding",
        "node3": "Kill task failed",
    }
    assert await client.node_reasons([]) == {}
    assert len(slurm.calls) == 1
