"""A node too busy for Ray's own start-up wait: `ray start` gives up when its raylet has not
registered with the GCS within a fixed 30 s (Ray's node.py; no setting changes it). On a
shared node under load that happens to a healthy start; the bootstrap starts Ray once more.

The fault is real: the head's first raylet is paused (SIGSTOP) as soon as it exists, so it
never registers; Ray's own `ray start --head` gives up, and the bootstrap says so
(``head_retry``) and starts the head again on another port block with a new token.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .helpers.bootstrap import (
    JobDir,
    cancel_and_check_cleanup,
    cancel_leftovers,
    log,
    run_ray_client,
)
from .helpers.clusters import processes_of

RAYLET = "/raylet/raylet"


@pytest.fixture
def jobs(testbed) -> Iterator[list[JobDir]]:
    created: list[JobDir] = []
    yield created
    cancel_leftovers(created)


def is_raylet(pid: int) -> bool:
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0]
    except OSError:
        return False
    return argv0.decode(errors="replace").endswith(RAYLET)


class RayletPauser(threading.Thread):
    """Pauses the first raylet of the cluster in ``job_dir`` the moment it appears; lets it go
    (SIGCONT) when told to stop, whatever became of it."""

    def __init__(self, job_dir: Path, timeout: float) -> None:
        super().__init__(daemon=True)
        self.job_dir, self.deadline = str(job_dir), time.monotonic() + timeout
        self.paused: int | None = None
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set() and time.monotonic() < self.deadline:
            raylets = [pid for pid in processes_of(self.job_dir) if is_raylet(pid)]
            if raylets:
                os.kill(raylets[0], signal.SIGSTOP)
                self.paused = raylets[0]
                return
            time.sleep(0.02)

    def release(self) -> None:
        self.done.set()
        self.join(timeout=5)
        if self.paused is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.paused, signal.SIGCONT)


@pytest.mark.testbed
@pytest.mark.ray
def test_a_head_whose_raylet_misses_rays_start_up_wait_is_started_once_more(
    jobs: list[JobDir],
) -> None:
    job = JobDir.create(nodes=1, start_timeout=180.0)
    jobs.append(job)
    pauser = RayletPauser(job.path, timeout=240)
    pauser.start()
    try:
        job.submit(extra_sbatch=["--nodelist=node3"])
        retry = job.wait_for_event(lambda e: e["event"] == "head_retry", 150)
        assert pauser.paused is not None
        connection = job.wait_ready(150)
    finally:
        pauser.release()
    log(f"head_retry: {retry['reason']}")
    assert retry["reason"] == (
        "`ray start --head` exited with status 1: its raylet did not register in Ray's 30 s"
    )
    assert any("timed out during startup" in line for line in retry["log"])
    assert not Path(f"/proc/{pauser.paused}").exists() or not is_raylet(pauser.paused)
    ports = [e["ports"] for e in job.events() if e.get("phase") == "ports"]
    assert len(ports) == 2 and ports[0] != ports[1]  # another block, as after a taken port
    assert [e["event"] for e in job.events() if e["event"] in ("head_retry", "error")] == [
        "head_retry"
    ]
    assert run_ray_client(job)["hosts"] == ["node3"]
    assert connection["node_count"] == 1
    cancel_and_check_cleanup(job)
