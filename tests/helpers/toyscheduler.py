"""A toy scheduler for the tests (not shipped): the whole :class:`Scheduler` interface in one
file, as a second batch system would add it. A job is its script run by bash in the directory
its header names (``#TOY chdir=DIR``) as a child of this process; ids are ``toy-<n>``; it keeps
no history beyond this process. tests/fast/test_scheduler_conformance.py holds it to the same
contract as the package's own schedulers."""

from __future__ import annotations

import asyncio
import itertools
import re
from collections.abc import Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import ClassVar

from jupyter_slurm_ray.errors import SlurmError
from jupyter_slurm_ray.scheduler.interface import Scheduler
from jupyter_slurm_ray.scheduler.kind import EnclosingJob, JobRequest
from jupyter_slurm_ray.scheduler.records import JobInfo
from jupyter_slurm_ray.transport import Transport

_CHDIR = re.compile(r"^#TOY chdir=(\S+)$", re.M)


class ToyScheduler(Scheduler):
    source = "toy"
    system = "the toy scheduler"
    mode = "toy"  # what scheduler/kinds.register (or an entry point) registers it as
    decided = MappingProxyType({"partition": "the toy scheduler has one queue"})

    # the system's state, as a real one keeps it: every instance sees the same jobs
    _jobs: ClassVar[dict[str, asyncio.subprocess.Process]] = {}
    _cancelled: ClassVar[set[str]] = set()
    _ids: ClassVar[Iterator[int]] = itertools.count(1)

    def __init__(self, transport: Transport, *, timeout: float = 30.0) -> None:
        super().__init__(transport, timeout=timeout)

    @classmethod
    def refusal(cls, name: str, value: object, settings: Mapping[str, object]) -> str | None:
        return None if value is None else f"unset with the toy scheduler: {cls.decided[name]}"

    @classmethod
    def header(cls, request: JobRequest) -> list[str]:
        """Its own words: where the job runs, and what it is called (the rest it ignores)."""
        return [f"#TOY chdir={request.job_dir}", f"#TOY name={request.name}"]

    @classmethod
    def option_refusal(cls, name: str) -> str | None:
        return "the toy scheduler has one queue" if name == "--queue" else None

    @classmethod
    def enclosing(cls, environ: Mapping[str, str]) -> EnclosingJob | None:
        job = environ.get("TOY_JOB_ID")
        return EnclosingJob(job, 1) if job else None

    @classmethod
    def owns(cls, job_id: str) -> bool:
        return re.fullmatch(r"toy-[0-9]+", job_id) is not None

    async def submit(self, script: str, *, timeout: float = 60.0) -> str:
        chdir = _CHDIR.search(script)
        if chdir is None:
            raise SlurmError("the toy scheduler runs a script with #TOY chdir=DIR")
        self.commands_run += 1
        process = await asyncio.create_subprocess_exec(
            "bash", "-c", script, cwd=chdir.group(1), stdin=asyncio.subprocess.DEVNULL
        )
        job_id = f"toy-{next(self._ids)}"
        self._jobs[job_id] = process
        return job_id

    async def cancel(
        self, job_id: str, *, signal: str | None = None, batch_only: bool = False
    ) -> None:
        process = self._jobs.get(job_id)
        if process is None:
            raise SlurmError(f"the toy scheduler has no job {job_id}")
        if process.returncode is None:
            self._cancelled.add(job_id)
            process.terminate()

    async def query(self, job_ids: Iterable[str], *, max_age: float = 0.0) -> dict[str, JobInfo]:
        answers = {}
        for job_id in job_ids:
            process = self._jobs.get(job_id)
            if process is None:
                continue
            code = process.returncode
            if code is None:
                state = "RUNNING"
            elif job_id in self._cancelled:
                state = "CANCELLED"
            else:
                state = "COMPLETED" if code == 0 else "FAILED"
            answers[job_id] = JobInfo(job_id, state, exit_code=code, source=self.source)
        return answers
