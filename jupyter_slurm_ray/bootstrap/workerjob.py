"""A worker job's batch step: join the running head from this node, leave on purpose.

A worker job is an extra Slurm job of one node that the client submits to scale a cluster
out. It joins like a worker of the head's own allocation, and it leaves by itself when the
owner's lease is stale, when the head is gone (head.json missing for HEAD_GONE_AFTER s), or
when the client asks it to drain (the file ``drain-<job id>`` in the job dir, holding the drain
timeout in seconds): Ray is asked to drain the node (`ray drain-node`, reason PREEMPTION: no
new work is placed there and the raylet exits once idle), then Ray is stopped at the latest
after the timeout.
"""

from __future__ import annotations

import os
import subprocess
import time
from typing import Any

from jsr_base import gcs_address, job_id
from jsr_events import LeaseWatch, owner_gone
from jsr_wire import HEAD_FILE, WORKER_JOB_FIELD, Event, drain_file
from noderun import TICK
from procgroups import RayProcess
from rayargs import ray_environment
from workerrun import WorkerRun

HEAD_GONE_AFTER = 15.0  # head.json missing this long: the head ended (s)
CHECK_PERIOD = 1.0  # how often the lease, head.json and the drain request are looked at (s)
DEFAULT_DRAIN_TIMEOUT = 60.0


def drain_timeout(text: str) -> float:
    """The drain request's timeout (seconds), DEFAULT_DRAIN_TIMEOUT when unreadable."""
    try:
        value = float(text.strip())
    except ValueError:
        return DEFAULT_DRAIN_TIMEOUT
    return value if 0 <= value <= 24 * 3600 else DEFAULT_DRAIN_TIMEOUT


class WorkerJobRun(WorkerRun):
    """The batch step of a one-node worker job (events tagged with worker_job)."""

    def __init__(self, job_dir: Any) -> None:
        super().__init__(job_dir)
        self.events.fields = {WORKER_JOB_FIELD: job_id()}
        self.lease = LeaseWatch(job_dir, 0.0)
        self.drain_file = job_dir / drain_file(job_id())
        self.left: str | None = None
        self.head_missing_since: float | None = None
        self.next_check = 0.0

    def main(self) -> str:
        config = self.load_config()
        self.events.emit(Event.WORKER_JOB_STARTED, nodes=os.environ.get("SLURM_JOB_NUM_NODES"))
        owner_timeout = float(config.owner_timeout)
        gone = owner_gone(self.job_dir, owner_timeout, lambda: self.flags.stop is not None)
        if gone:
            self.events.emit(Event.OWNER_GONE, **gone)
            return "owner_gone"
        if not (self.job_dir / HEAD_FILE).exists():
            reason = "head.json is missing: the cluster's head is not running"
            self.events.emit(Event.HEAD_GONE, reason=reason)
            return "head_gone"
        self.lease = LeaseWatch(self.job_dir, owner_timeout)
        return super().main()

    def stop_reason(self) -> str:
        return self.left or super().stop_reason()

    def leave_reason(self, process: RayProcess | None, head: dict[str, Any]) -> str | None:
        now = time.monotonic()
        if self.left or now < self.next_check:
            return self.left
        self.next_check = now + CHECK_PERIOD
        reason = self.why_leave(process, head, now)
        if reason:
            self.left = reason
        return self.left

    def why_leave(self, process: RayProcess | None, head: dict[str, Any], now: float) -> str | None:
        if self.lease.stale():
            self.leaving("the owner's lease went stale")
            self.events.emit(Event.LEASE_STALE, owner_timeout=self.lease.owner_timeout)
            return "lease_stale"
        if (self.job_dir / HEAD_FILE).exists():
            self.head_missing_since = None
        else:
            self.head_missing_since = self.head_missing_since or now
            if now - self.head_missing_since >= HEAD_GONE_AFTER:
                reason = f"head.json was missing for {HEAD_GONE_AFTER:g} s: the head is gone"
                self.leaving(reason)
                self.events.emit(Event.HEAD_GONE, reason=reason)
                return "head_gone"
        if process is not None and self.drain_file.exists():
            return self.drain(process, head)
        return None

    def leaving(self, reason: str) -> None:
        ip = self.plan.ip if self.plan else None
        self.events.emit(Event.WORKER_LEAVING, reason=reason, ip=ip, node_id=self.node_id)

    def drain(self, process: RayProcess, head: dict[str, Any]) -> str:
        """Ask Ray to drain this node, then wait (bounded) until its raylet exited."""
        assert self.plan is not None
        try:
            timeout = drain_timeout(self.drain_file.read_text())
        except OSError:
            timeout = DEFAULT_DRAIN_TIMEOUT
        self.leaving("scaled in: draining")
        node_id = self.node_id  # this node's own Ray's (another node may share the host)
        accepted = node_id is not None and self.request_drain(node_id, head, timeout)
        self.events.emit(
            Event.WORKER_DRAINING,
            ip=self.plan.ip,
            node_id=node_id,
            accepted=accepted,
            timeout=timeout,
        )
        deadline = time.monotonic() + timeout
        next_look = time.monotonic() + CHECK_PERIOD
        while accepted and process.exit_code() is None and not self.flags.stop:
            if time.monotonic() > deadline:
                return "drain timeout: stopped"
            if time.monotonic() >= next_look:
                next_look = time.monotonic() + CHECK_PERIOD
                alive = self.alive_ids(head)
                if node_id is not None and alive is not None and node_id not in alive:
                    break  # its raylet exited once idle (the head no longer sees it alive)
            time.sleep(TICK)
        return "drained: scaled in"

    def request_drain(self, node_id: str, head: dict[str, Any], timeout: float) -> bool:
        """`ray drain-node` (a developer command of Ray, the API autoscaler v2 uses)."""
        assert self.plan is not None and self.config is not None
        argv = [
            self.find_ray(), "drain-node", f"--address={gcs_address(head)}",
            f"--node-id={node_id}", "--reason=DRAIN_NODE_REASON_PREEMPTION",
            "--reason-message=scaled in by jupyter-slurm-ray",
            f"--deadline-remaining-seconds={max(1, int(timeout))}",
        ]  # fmt: skip
        env = ray_environment(self.config, self.job_dir, self.plan.block.ports, self.tls)
        try:
            done = subprocess.run(
                self.in_container(argv),
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            self.events.emit(Event.WORKER_DRAIN_FAILED, reason=str(exc))
            return False
        if done.returncode != 0:
            lines = (done.stdout + done.stderr).splitlines()[-10:]
            self.events.emit(Event.WORKER_DRAIN_FAILED, reason=f"exit {done.returncode}", log=lines)
        return done.returncode == 0
