"""The job watcher never dies, a job's events are taken in once, and the lease is renewed on
its own timer."""

from __future__ import annotations

import asyncio
import json

from jupyter_slurm_ray.follow import JobFollower
from jupyter_slurm_ray.lease import Lease, renew_interval
from jupyter_slurm_ray.scheduler.records import JobInfo
from jupyter_slurm_ray.slurm.client import SlurmClient
from jupyter_slurm_ray.slurm.watch import JobNews, JobWatcher

from ..helpers.waiting import until


class BrokenSlurm(SlurmClient):
    """Fails with a bug (not a Slurm error) every other query."""

    def __init__(self) -> None:
        self.calls = 0

    async def query(self, job_ids, *, max_age=0.0):
        self.calls += 1
        if self.calls % 2:
            raise ValueError("a parsing bug")
        return {j: JobInfo(job_id=j, state="RUNNING") for j in job_ids}


async def test_the_watcher_survives_bugs_and_broken_subscribers_and_reports_them():
    answers: list[JobNews] = []

    async def subscriber(answer: JobNews) -> None:
        answers.append(answer)
        raise RuntimeError("a broken observer")

    watcher = JobWatcher(BrokenSlurm(), interval=0.01)
    watcher.watch("1", subscriber)
    await until(lambda: len(answers) >= 4, 5, "four polls")
    silent = [a for a in answers if not a.answered]
    assert silent and "a parsing bug" in silent[0].error
    assert any(a.answered and a.job.state == "RUNNING" for a in answers)
    watcher.unwatch("1", subscriber)
    await asyncio.wait_for(watcher._task, 5)


def test_the_lease_says_who_when_and_how_often():
    lease = Lease(owner_timeout=300)
    first, second = json.loads(lease.text()), json.loads(lease.text())
    assert second["seq"] == first["seq"] + 1 and second["t"] >= first["t"]
    assert first["renew_every"] == renew_interval(300) == 10.0
    assert renew_interval(5) == 1.25 and renew_interval(1) == 1.0


async def test_the_lease_outlives_write_failures():
    written: list[str] = []

    async def write(text: str) -> None:
        if len(written) % 2 == 0:
            written.append("failed")
            raise OSError("the filesystem hiccups")
        written.append(text)

    lease = Lease(owner_timeout=4)  # every 1 s
    lease.keep(write)
    await until(lambda: len(written) >= 3, 6, "three renewals")
    assert lease.kept and written[1].startswith("{") and lease.renewed_at is not None
    lease.release()
    assert not lease.kept


class SlowEventsFile:
    """A job dir whose events file answers after a pause, as a command on a node does."""

    def __init__(self, events: list[dict]) -> None:
        self.lines = [json.dumps(e) + "\n" for e in events]

    async def read_events(self, offset: int) -> tuple[list[dict], int]:
        text = "".join(self.lines)[offset:]
        await asyncio.sleep(0.01)  # another reader starts meanwhile
        return [json.loads(line) for line in text.splitlines()], offset + len(text)


async def test_a_refresh_beside_the_watchers_poll_takes_each_event_in_once():
    follower = JobFollower()
    job_dir = SlowEventsFile([{"event": "worker_draining", "worker_job": j} for j in "12"])
    await asyncio.gather(*(follower.read_events(job_dir) for _ in range(3)))  # type: ignore[arg-type]
    assert [e["worker_job"] for e in follower.events.events] == ["1", "2"]
