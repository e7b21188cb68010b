"""What every scheduler answers, the same way: the contract the cluster, the watcher and the
views rely on, checked on each implementation the package has.

- Slurm's client (``slurm/client.py``) on the scripted Slurm;
- local mode's jobs (``slurm/localjobs.py``): real process groups of this machine;
- the ``--here`` scheduler (``slurm/heresteps.py``) for the Slurm jobs it also runs (a here
  cluster's worker jobs), on the scripted Slurm;
- a toy scheduler of the tests (``tests/helpers/toyscheduler.py``): the interface in one file,
  as a second batch system would add it.

The contract: ``submit`` gives an id that ``query`` then answers for, by that id; a job that
ends is final with its exit code, in ``query`` and in ``history``; ``cancel`` ends a job as
CANCELLED; an id the scheduler does not know is left out of an answer (never an error); what
a scheduler cannot do (a longer walltime, accounting, partitions, node reasons, tags) is an
empty answer or a refusal in its own words (``ExtendRefused``, ``SlurmError``), never another
failure. A new scheduler (``scheduler/interface.py``) passes this module before anything uses
it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from jupyter_slurm_ray.errors import ExtendRefused, SlurmError, SlurmUnavailable
from jupyter_slurm_ray.scheduler import kinds
from jupyter_slurm_ray.scheduler.interface import Scheduler
from jupyter_slurm_ray.scheduler.kind import JobRequest
from jupyter_slurm_ray.scheduler.records import JobInfo, Partition
from jupyter_slurm_ray.slurm.client import SlurmClient
from jupyter_slurm_ray.slurm.heresteps import HereSteps
from jupyter_slurm_ray.slurm.localjobs import LocalJobs
from jupyter_slurm_ray.transport import LocalTransport
from tests.helpers.fakeslurm import FakeSlurm, FakeTransport
from tests.helpers.toyscheduler import ToyScheduler

# The job: its header in its scheduler's words (``header``), then it waits until the test lets
# it end (the file "go" in its job dir holds its exit status); TERM (cancel) ends it at once.
JOB = """trap 'exit 0' TERM
while [ ! -e go ]; do sleep 0.05; done
exit "$(cat go)"
"""
WITHIN = 20.0  # seconds a job may take to be seen ended (local mode: a real process)


@dataclass
class Bench:
    """One scheduler, and how the test moves its jobs along."""

    scheduler: Scheduler
    start: Callable[[str], None]  # the job runs (Slurm: it left the queue)
    finish: Callable[[str, Path, int], None]  # the job ends with this exit status
    unknown_id: str  # an id of this scheduler's kind that no job has
    submitted: list[str] = field(default_factory=list)


def scripted_slurm(kind: type[SlurmClient | HereSteps]) -> Bench:
    slurm = FakeSlurm()

    def finish(job_id: str, _job_dir: Path, status: int) -> None:
        slurm.end(job_id, "COMPLETED" if status == 0 else "FAILED", f"{status}:0")

    return Bench(kind(FakeTransport(slurm)), slurm.run, finish, "99999")


def processes_of_this_machine(scheduler: Scheduler, unknown_id: str) -> Bench:
    def finish(_job_id: str, job_dir: Path, status: int) -> None:
        (job_dir / "go").write_text(f"{status}\n")

    return Bench(scheduler, lambda _job_id: None, finish, unknown_id)


BENCHES: dict[str, Callable[[], Bench]] = {
    "slurm": lambda: scripted_slurm(SlurmClient),
    "local": lambda: processes_of_this_machine(LocalJobs(LocalTransport()), "local-999999999"),
    "here": lambda: scripted_slurm(HereSteps),
    # a second batch system, as one file would add it (tests/helpers/toyscheduler.py)
    "toy": lambda: processes_of_this_machine(ToyScheduler(LocalTransport()), "toy-999"),
}


@pytest.fixture(params=sorted(BENCHES))
async def bench(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # local mode's runner keeps state there
    made = BENCHES[request.param]()
    kinds.register(ToyScheduler)  # as its entry point would
    yield made
    kinds.unregister(ToyScheduler.mode)
    answers = await made.scheduler.query(made.submitted)  # no job of a test left running
    for job_id in [job for job, info in answers.items() if not info.is_final]:
        await made.scheduler.cancel(job_id)
    for job_id in made.submitted:
        assert (await final(made, job_id)).is_final


async def submitted(bench: Bench, tmp_path: Path) -> tuple[str, Path]:
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    request = JobRequest(
        name="conformance", tag="jsr-conformance", nodes=1, job_dir=str(job_dir),
        walltime_warning=60, exported=("PATH", "HOME"), time="10",
    )  # fmt: skip
    header = type(bench.scheduler).header(request)
    job_id = await bench.scheduler.submit("\n".join(["#!/bin/bash", *header, JOB]))
    bench.submitted.append(job_id)
    return job_id, job_dir


async def final(bench: Bench, job_id: str) -> JobInfo:
    for _ in range(int(WITHIN / 0.05)):
        info = (await bench.scheduler.query([job_id])).get(job_id)
        if info is not None and info.is_final:
            return info
        await asyncio.sleep(0.05)
    raise AssertionError(f"{job_id} did not end within {WITHIN} s")


async def test_submit_gives_the_id_the_scheduler_then_answers_for(bench: Bench, tmp_path):
    job_id, _ = await submitted(bench, tmp_path)
    info = (await bench.scheduler.query([job_id]))[job_id]
    assert info.job_id == job_id and info.state in ("PENDING", "RUNNING"), info
    bench.start(job_id)
    assert (await bench.scheduler.query([job_id]))[job_id].state == "RUNNING"


async def test_the_id_it_gives_names_its_kind(bench: Bench, tmp_path):
    """The package finds a job's scheduler by its id alone (``scheduler/kinds.py``)."""
    job_id, _ = await submitted(bench, tmp_path)
    kind, mine = kinds.kind_of(job_id), type(bench.scheduler)
    assert kind is mine or kind.mode in mine.also_answers, (job_id, kind)
    assert kind.owns(job_id) and not kind.owns(bench.unknown_id + "x")
    bench.finish(job_id, tmp_path / "job", 0)


@pytest.mark.parametrize(("status", "state"), [(0, "COMPLETED"), (3, "FAILED")])
async def test_a_job_that_ends_is_final_with_its_exit_status(
    bench: Bench, tmp_path, status: int, state: str
):
    job_id, job_dir = await submitted(bench, tmp_path)
    bench.start(job_id)
    bench.finish(job_id, job_dir, status)
    info = await final(bench, job_id)
    assert (info.state, info.exit_code) == (state, status), info
    remembered = (await bench.scheduler.history([job_id]))[job_id]
    assert (remembered.state, remembered.exit_code) == (state, status), remembered


async def test_cancel_ends_a_job_as_cancelled(bench: Bench, tmp_path):
    job_id, _ = await submitted(bench, tmp_path)
    bench.start(job_id)
    await asyncio.sleep(0.2)  # a real job has set its TERM trap
    await bench.scheduler.cancel(job_id)
    assert (await final(bench, job_id)).state == "CANCELLED"


async def test_an_id_it_does_not_know_is_left_out_of_its_answer(bench: Bench, tmp_path):
    job_id, _ = await submitted(bench, tmp_path)
    answer = await bench.scheduler.query([job_id, bench.unknown_id])
    assert set(answer) == {job_id}


async def test_what_it_cannot_do_is_an_empty_answer_or_a_refusal_in_its_words(
    bench: Bench, tmp_path
):
    job_id, _ = await submitted(bench, tmp_path)
    bench.start(job_id)
    jobs = bench.scheduler
    try:
        await jobs.extend(job_id, 30)
    except ExtendRefused as refused:
        assert str(refused), "a refusal says why"
    try:
        assert isinstance(await jobs.usage([job_id]), list)
    except SlurmError as refused:
        assert "accounting" in str(refused) or "sacct" in str(refused), refused
    partitions = await jobs.partitions()
    assert all(isinstance(partition, Partition) for partition in partitions)
    assert await jobs.node_reasons([]) == {}
    assert isinstance(await jobs.tagged_jobs(), dict)
    assert await jobs.find_tagged("ray-00000000") is None
    silence = SlurmUnavailable("sbatch: Unable to contact slurm controller")
    told = jobs.unreachable(silence)  # what the user reads when the system did not answer
    assert isinstance(told, SlurmUnavailable) and str(told).startswith(str(silence))
    if isinstance(jobs, SlurmClient | HereSteps):  # no Slurm here? then local mode
        assert "--local" in str(told)


async def test_a_command_runs_on_each_node_of_a_running_job_or_is_refused_in_its_words(
    bench: Bench, tmp_path
):
    """``run_on_nodes`` (the driver's reach check): each run knows its node as ``JSR_NODE``;
    a system that cannot run one says so, naming itself."""
    job_id, job_dir = await submitted(bench, tmp_path)
    bench.start(job_id)
    argv = ["sh", "-c", 'echo "on $JSR_NODE"']
    if not bench.scheduler.node_runner:
        with pytest.raises(SlurmError, match=bench.scheduler.system):
            await bench.scheduler.run_on_nodes(job_id, argv, nodes=1)
    else:
        result = await bench.scheduler.run_on_nodes(job_id, argv, nodes=1)
        assert (result.returncode, result.stdout) == (0, "on node1\n")
    bench.finish(job_id, job_dir, 0)
