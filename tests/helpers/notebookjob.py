"""A notebook kernel inside a Slurm job, as batchspawner and Open OnDemand run one: a Python
program of ``tests/resources/`` run as the test user by ``sbatch -N1 -c1 --mem=1G`` (or more
memory) on node1 (or a node of another partition), which reports each step as one JSON line in
``WORK/report.jsonl``; or the same program as the test user's own process on the login node
(``LoginKernel``)."""

from __future__ import annotations

import json
import shlex
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .bootstrap import run_as_user, write_as_user
from .jobs import in_queue
from .paths import REPO, VENV_PYTHON
from .testbed import USER, runuser
from .waiting import wait_for

NOTEBOOK_JOB = """#!/bin/bash
#SBATCH --job-name=jsr-notebook
#SBATCH --nodes=1 --cpus-per-task=1 --mem={mem} --partition={partition} --nodelist={node} --time=15
#SBATCH --output={work}/notebook.out --error={work}/notebook.out
{python} {program} {args}
{after}
"""


@dataclass
class NotebookJob:
    """One notebook job: its work dir (the test user's, 0700), its Slurm job id."""

    work: Path
    job_id: str = ""
    named: set[str] = field(default_factory=set)  # jobs its reports named (its clusters')

    @classmethod
    def submit(
        cls,
        program: str,
        *args: str,
        node: str = "node1",
        partition: str = "debug",
        server: bool = False,
        mem: str = "1G",
    ) -> NotebookJob:
        """Run ``tests/resources/<program>`` with ``WORK *args`` in the job, submitted from a
        plain login environment, as a hub would. With ``server`` the job goes on after the
        program ends, as a Jupyter server outlives a kernel that was killed or restarted."""
        job = cls(Path(f"/home/{USER}/.jsr-notebook-{uuid.uuid4().hex[:8]}"))
        run_as_user("mkdir", "-m", "700", str(job.work))
        script = NOTEBOOK_JOB.format(
            mem=mem,
            node=node,
            partition=partition,
            work=job.work,
            python=VENV_PYTHON,
            program=REPO / "tests" / "resources" / program,
            args=shlex.join([str(job.work), *args]),
            after="exec sleep 600" if server else "",
        )
        write_as_user(job.work / "notebook.sbatch", script)
        login = [f"HOME=/home/{USER}", f"USER={USER}", "PATH=/usr/local/bin:/usr/bin:/bin"]
        submit = run_as_user(
            "env", "-i", *login, f"PYTHONPATH={REPO}", "LANG=C.UTF-8",
            "sbatch", "--parsable", "--export=ALL", str(job.work / "notebook.sbatch"),
        )  # fmt: skip
        job.job_id = submit.stdout.strip().split(";")[0]
        return job

    def events(self) -> list[dict[str, Any]]:
        path = self.work / "report.jsonl"
        if not path.exists():
            return []
        found = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        self.named |= {str(event["job_id"]) for event in found if event.get("job_id")}
        return found

    where = "the notebook job"  # the kernel's place, in the tests' messages

    def running(self) -> bool:
        return in_queue(self.job_id)

    def output(self) -> Path:
        """Where the program's own output goes."""
        return self.work / "notebook.out"

    def event(self, name: str) -> dict[str, Any] | None:
        """The program's ``name`` line; AssertionError at its ``error`` line, or once it
        ended without it."""
        events = self.events()
        for event in events:
            if event["event"] == "error":
                raise AssertionError(f"the kernel in {self.where} failed:\n{event['error']}")
        found = next((event for event in events if event["event"] == name), None)
        if found is None and not self.running():
            out = self.output()
            text = out.read_text(errors="replace") if out.exists() else ""
            raise AssertionError(f"{self.where} ended before {name!r}:\n{text[-3000:]}")
        return found

    def wait(self, name: str, timeout: float) -> dict[str, Any]:
        return wait_for(lambda: self.event(name), timeout, f"the kernel's {name!r}")

    def clean_up(self) -> None:
        """Cancel the notebook job and every job it named; remove the work dir."""
        self.events()
        jobs = sorted({self.job_id, *self.named} - {""})
        subprocess.run(["scancel", *jobs], check=False, capture_output=True)
        subprocess.run(["rm", "-rf", "--", str(self.work)], check=False)


@dataclass
class LoginKernel(NotebookJob):
    """The same program as a kernel on the login node: the test user's own process there,
    outside any Slurm job, in a plain login environment (no ``SLURM_*``)."""

    process: subprocess.Popen[bytes] | None = None

    @classmethod
    def start(cls, program: str, *args: str) -> LoginKernel:  # type: ignore[override]
        kernel = cls(Path(f"/home/{USER}/.jsr-login-kernel-{uuid.uuid4().hex[:8]}"))
        run_as_user("mkdir", "-m", "700", str(kernel.work))
        login = [f"HOME=/home/{USER}", f"USER={USER}", "PATH=/usr/local/bin:/usr/bin:/bin"]
        argv = [
            *runuser(USER), "env", "-i", *login, f"PYTHONPATH={REPO}", "LANG=C.UTF-8",
            str(VENV_PYTHON), str(REPO / "tests" / "resources" / program), str(kernel.work), *args,
        ]  # fmt: skip
        with open(kernel.output(), "wb") as out:
            kernel.process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        return kernel

    where = "the login node's process"

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def output(self) -> Path:
        return self.work.with_name(self.work.name + ".out")  # beside its work dir

    def clean_up(self) -> None:
        """Stop the kernel (it takes its cluster down), cancel what it named, remove its files."""
        if self.process is not None and self.running():
            self.process.terminate()
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.events()
        if self.named:
            subprocess.run(["scancel", *sorted(self.named)], check=False, capture_output=True)
        subprocess.run(["rm", "-rf", "--", str(self.work), str(self.output())], check=False)
