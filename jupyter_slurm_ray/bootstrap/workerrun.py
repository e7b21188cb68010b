"""The worker step: how the head starts it with srun, and what each of its tasks does."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from dashapi import Dashboard, port_open
from jsr_base import BootstrapError, RayExitedEarly, short_hostname
from noderun import API_PERIOD, KILL_GRACE, TICK, NodeRun
from procgroups import RayProcess, die_with_parent, stop_processes
from rayargs import plan_node

RETRY_MIN_TIME = 20.0  # a worker retries `ray start` once if this much start time is left


def worker_step_cpus(env: dict[str, str]) -> int | None:
    """The fewest CPUs the job has on a worker node (SLURM_JOB_CPUS_PER_NODE, head first)."""
    counts: list[int] = []
    for item in env.get("SLURM_JOB_CPUS_PER_NODE", "").split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if match:
            counts += [int(match.group(1))] * int(match.group(2) or 1)
    workers = counts[1:] or counts
    return min(workers) if workers else None


def start_worker_step(srun: str, job_dir: Path, workers: int) -> subprocess.Popen[bytes]:
    """One srun step with one bootstrap worker task on every node but this one."""
    argv = [
        srun, "--overlap", f"--nodes={workers}", f"--ntasks={workers}", "--ntasks-per-node=1",
        f"--exclude={os.environ.get('SLURMD_NODENAME', short_hostname())}",
        "--kill-on-bad-exit=0",
    ]  # fmt: skip
    cpus = worker_step_cpus(dict(os.environ))
    if cpus:
        argv.append(f"--cpus-per-task={cpus}")
    argv += [sys.executable, str(job_dir / "bootstrap"), "worker", str(job_dir)]
    with open(job_dir / "logs" / "srun-workers.log", "ab") as log:
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=die_with_parent,
        )  # fmt: skip


class WorkerRun(NodeRun):
    """One task of the worker step: join the head, bounded by start_timeout, stop on SIGTERM."""

    role = "worker"

    def main(self) -> str:
        ray = self.setup()
        assert self.config is not None
        head = self.read_head_json()
        self.plan = plan_node(self.config, head["head_ip"])
        head_address = f"{head['head_ip']}:{head['gcs_port']}"
        self.events.emit(
            "worker_starting",
            ip=self.plan.ip,
            ports=self.plan.block.ports,
            head=head_address,
            temp_dir=str(self.plan.temp_dir),
        )
        if not self.wait_for_gcs(head["head_ip"], int(head["gcs_port"])):
            return f"signal {self.flags.stop}"
        argv = self.plan.worker_argv(ray, self.config, head_address)
        dashboard = Dashboard(head["head_ip"], int(head["dashboard_port"]), self.token())
        stop: str | None = None
        for attempt in (1, 2):
            process = self.start_ray(argv, f"ray-worker-{self.plan.host}.log")
            try:
                stop = self.wait_until_joined(process, dashboard, head_address)
                break
            except RayExitedEarly as exc:
                if attempt == 2 or self.deadline - time.monotonic() < RETRY_MIN_TIME:
                    raise
                self.events.emit("worker_retry", reason=exc.reason, log=exc.log)
                stop_processes([process.pid], [], time.monotonic() + KILL_GRACE)
        if stop:
            return stop
        self.events.emit("worker_joined", ip=self.plan.ip)
        while not self.flags.stop:
            code = process.exit_code()
            if code is not None:  # after joining: the head reports node_lost
                self.exit_code, self.exit_log = 1, process.tail()
                return f"`ray start` exited with status {code}"
            time.sleep(TICK)
        return f"signal {self.flags.stop}"

    def wait_for_gcs(self, ip: str, port: int) -> bool:
        """Start Ray once the head's GCS listens: each failed join attempt costs ~5 s."""
        while not self.flags.stop:
            if port_open(ip, port):
                return True
            if time.monotonic() > self.deadline:
                raise BootstrapError(f"the head's GCS at {ip}:{port} did not open in time")
            time.sleep(0.2)
        return False

    def read_head_json(self) -> dict[str, Any]:
        path = self.job_dir / "head.json"
        for _ in range(100):  # a shared filesystem may show the file a little late
            with contextlib.suppress(OSError, ValueError):
                return json.loads(path.read_text())
            time.sleep(0.1)
        raise BootstrapError(f"the head's address file {path} is missing")

    def wait_until_joined(
        self, process: RayProcess, dashboard: Dashboard, head_address: str
    ) -> str | None:
        assert self.plan is not None
        while not self.flags.stop:
            code = process.exit_code()
            if code is not None:
                reason = f"`ray start` exited with status {code} before joining {head_address}"
                raise RayExitedEarly(f"{reason} from {self.plan.host}", process.tail())
            if time.monotonic() > self.deadline:
                reason = (
                    f"{self.plan.host} did not join the head at {head_address} within start_timeout"
                )
                raise BootstrapError(reason, process.tail())
            if self.plan.ip in (dashboard.alive_nodes() or []):
                return None
            time.sleep(API_PERIOD)
        return f"signal {self.flags.stop}"

    def finish(self, reason: str, code: int) -> None:
        self.stop()
        self.events.emit("worker_stopped", reason=reason, exit_code=code, log=self.exit_log)
