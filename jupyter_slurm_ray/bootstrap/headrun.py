"""The batch step on the first node: head, worker step, readiness, connection.json, supervision."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from dashapi import Dashboard, port_open
from jsr_base import LOG_LINES, BootstrapError, job_id, tail, write_json_atomic
from jsr_events import EventTail, LeaseWatch
from nodeaddr import slurmctld_address
from noderun import API_PERIOD, KILL_GRACE, TICK, NodeRun
from procgroups import stop_processes
from rayargs import plan_node, ray_versions, require_command
from workerrun import start_worker_step

WATCH_PERIOD = 2.0  # node-count poll period once ready (s)


class HeadRun(NodeRun):
    """The batch step: head node, worker step, readiness, connection.json, supervision."""

    role = "head"

    def __init__(self, job_dir: Path) -> None:
        super().__init__(job_dir)
        self.worker_step: subprocess.Popen[bytes] | None = None
        self.tail = EventTail(job_dir / "events.jsonl")
        self.hosts: dict[str, str] = {}
        self.joined: list[str] = []
        self.lease = LeaseWatch(job_dir, 0.0)
        self.worker_step_reported = False
        self.lost: set[str] = set()

    def main(self) -> str:
        self.events.phase("bootstrap", job_id=job_id(), pid=os.getpid(), python=sys.executable)
        for stale in ("connection.json", "head.json"):
            with contextlib.suppress(OSError):
                (self.job_dir / stale).unlink()
        ray = self.setup()
        assert self.config is not None
        self.lease = LeaseWatch(self.job_dir, float(self.config.idle_timeout))
        srun = (
            require_command("srun", "it starts Ray on the other nodes") if self.wanted > 1 else ""
        )
        self.plan = plan_node(self.config, slurmctld_address())
        self.events.phase("ports", ports=self.plan.block.ports)
        self.hosts[self.plan.ip] = self.plan.host
        self.write_head_json()
        self.events.phase("head_starting", head_ip=self.plan.ip, temp_dir=str(self.plan.temp_dir))
        self.start_ray(self.plan.head_argv(ray, self.config), f"ray-head-{self.plan.host}.log")
        if self.wanted > 1:
            self.events.phase("workers_starting", workers=self.wanted - 1)
            self.worker_step = start_worker_step(srun, self.job_dir, self.wanted - 1)
        versions = ray_versions(ray)
        dashboard = Dashboard(self.plan.ip, self.plan.block.ports["dashboard"], self.token())
        stop = self.wait_until_ready(dashboard)
        if stop:
            return stop
        self.write_connection(versions)
        return self.supervise(dashboard)

    @property
    def wanted(self) -> int:
        assert self.config is not None
        return int(self.config.nodes)

    def write_head_json(self) -> None:
        assert self.plan is not None and self.config is not None
        ports = self.plan.block.ports
        head = {
            "cluster_id": self.config.cluster_id,
            "job_id": job_id(),
            "head_host": self.plan.host,
        }
        head.update(head_ip=self.plan.ip, gcs_port=ports["gcs"], dashboard_port=ports["dashboard"])
        write_json_atomic(self.job_dir / "head.json", head)

    # ----- checks shared by the start and the supervision loops

    def stop_requested(self) -> str | None:
        """Walltime warnings become events; a stop signal or a stale lease ends the run."""
        while self.flags.walltime_warnings:
            self.flags.walltime_warnings -= 1
            self.events.emit("walltime_warning", job_id=job_id())
        if self.flags.stop:
            return f"signal {self.flags.stop}"
        if self.lease.stale():
            self.events.emit("lease_stale", idle_timeout=self.lease.idle_timeout)
            return "lease_stale"
        return None

    def check_head_alive(self) -> None:
        assert self.ray is not None
        code = self.ray.exit_code()
        if code is not None:
            raise BootstrapError(f"`ray start --head` exited with status {code}", self.ray.tail())

    def read_worker_events(self, ready: bool) -> None:
        for event in self.tail.read():
            if event.get("role") != "worker":
                continue
            if event.get("ip") and event.get("host"):
                self.hosts[str(event["ip"])] = str(event["host"])
            if event.get("event") == "error" and not ready:
                reason = f"the worker on {event.get('host')} failed: {event.get('reason')}"
                raise BootstrapError(reason, list(event.get("log") or []))

    def worker_logs(self, hosts: Iterable[str] | None = None) -> list[str]:
        paths = sorted(self.logs.glob("ray-worker-*.log"))
        if hosts is not None:
            paths = [self.logs / f"ray-worker-{host}.log" for host in hosts]
        lines = [line for path in paths for line in tail(path, 10)]
        return (lines + tail(self.logs / "srun-workers.log", 10))[-LOG_LINES:]

    def worker_step_exit(self) -> int | None:
        return self.worker_step.poll() if self.worker_step else None

    # ----- start

    def wait_until_ready(self, dashboard: Dashboard) -> str | None:
        """Poll until every node is alive; returns a stop reason if asked to stop meanwhile."""
        assert self.plan is not None
        head_up = False
        while True:
            self.read_worker_events(ready=False)
            self.check_head_alive()
            self.check_worker_step_before_ready()
            stop = self.stop_requested()
            if stop:
                return stop
            if time.monotonic() > self.deadline:
                raise self.start_timeout_error(head_up)
            alive = dashboard.alive_nodes()
            if alive is not None:
                if not head_up:
                    head_up = True
                    self.events.phase("head_up", dashboard_port=self.plan.block.ports["dashboard"])
                    self.events.phase("waiting_for_nodes", joined=len(alive), wanted=self.wanted)
                self.note_nodes(alive)
                if len(alive) >= self.wanted and port_open(
                    self.plan.ip, self.plan.block.ports["client"]
                ):
                    return None
            time.sleep(API_PERIOD)

    def check_worker_step_before_ready(self) -> None:
        code = self.worker_step_exit()
        if code is None:
            return
        time.sleep(0.2)
        self.read_worker_events(ready=False)
        raise BootstrapError(
            f"the worker step (srun) exited with status {code} before all nodes joined",
            self.worker_logs(),
        )

    def start_timeout_error(self, head_up: bool) -> BootstrapError:
        assert self.config is not None and self.ray is not None and self.plan is not None
        timeout = self.config.start_timeout
        if not head_up:
            dash = f"http://{self.plan.ip}:{self.plan.block.ports['dashboard']}"
            reason = (
                f"the Ray dashboard at {dash} did not answer within start_timeout ({timeout} s)"
            )
            return BootstrapError(reason, self.ray.tail())
        missing = sorted(set(self.hosts.values()) - {self.hosts.get(ip) for ip in self.joined})
        reason = (
            f"only {len(self.joined)} of {self.wanted} nodes joined within start_timeout "
            f"({timeout} s)" + (f"; not joined: {', '.join(missing)}" if missing else "")
        )
        return BootstrapError(reason, self.worker_logs())

    def note_nodes(self, alive: list[str]) -> None:
        if len(alive) != len(self.joined):
            self.events.emit("nodes", joined=len(alive), wanted=self.wanted)
        self.joined = alive

    def write_connection(self, versions: tuple[str | None, str | None]) -> None:
        assert self.plan is not None and self.config is not None
        ports = self.plan.block.ports
        nodes = [{"host": self.hosts.get(ip, ip), "ip": ip} for ip in self.joined]
        connection = {
            "cluster_id": self.config.cluster_id,
            "job_id": job_id(),
            "head_host": self.plan.host,
            "head_ip": self.plan.ip,
            "gcs_address": f"{self.plan.ip}:{ports['gcs']}",
            "client_port": ports["client"],
            "dashboard_port": ports["dashboard"],
            "ports": ports,
            "ray_version": versions[0],
            "python_version": versions[1],
            "node_count": len(self.joined),
            "nodes": nodes,
            "temp_dir": str(self.plan.temp_dir),
            "ready_at": time.time(),
        }
        write_json_atomic(self.job_dir / "connection.json", connection)
        elapsed = round(time.monotonic() - self.started, 2)
        self.events.phase("ready", joined=len(self.joined), wanted=self.wanted)
        self.events.emit(
            "ready", gcs_address=connection["gcs_address"], node_count=len(nodes), elapsed=elapsed
        )

    # ----- supervision

    def supervise(self, dashboard: Dashboard) -> str:
        next_poll = time.monotonic() + WATCH_PERIOD
        while True:
            stop = self.stop_requested()
            if stop:
                return stop
            self.check_head_alive()
            self.read_worker_events(ready=True)
            self.check_worker_step_after_ready()
            if time.monotonic() >= next_poll:
                next_poll = time.monotonic() + WATCH_PERIOD
                alive = dashboard.alive_nodes()
                if alive is not None:
                    self.check_lost_nodes(alive)
            time.sleep(TICK)

    def check_worker_step_after_ready(self) -> None:
        assert self.plan is not None
        code = self.worker_step_exit()
        if code is None or self.worker_step_reported:
            return
        self.worker_step_reported = True
        hosts = sorted(set(self.hosts.values()) - {self.hosts.get(self.plan.ip)} - self.lost)
        self.lost.update(hosts)
        reason = f"the worker step (srun) exited with status {code}: no Ray worker nodes left"
        self.events.emit("node_lost", reason=reason, hosts=hosts, log=self.worker_logs(hosts))

    def check_lost_nodes(self, alive: list[str]) -> None:
        """A node that left the cluster and was not reported yet becomes a node_lost event."""
        left = sorted(set(self.joined) - set(alive))
        self.note_nodes(alive)
        hosts = [self.hosts.get(ip, ip) for ip in left if self.hosts.get(ip, ip) not in self.lost]
        if hosts:
            self.lost.update(hosts)
            reason = f"{len(hosts)} node(s) left the cluster: {', '.join(hosts)}"
            self.events.emit("node_lost", reason=reason, hosts=hosts, log=self.worker_logs(hosts))

    def finish(self, reason: str, code: int) -> None:
        self.events.phase("stopping", reason=reason)
        step_deadline = time.monotonic() + KILL_GRACE + 1.0
        if self.worker_step and self.worker_step.poll() is None:
            self.worker_step.send_signal(signal.SIGUSR2)  # srun forwards it to the workers
        self.stop()
        self.stop_worker_step(step_deadline)
        with contextlib.suppress(OSError):
            (self.job_dir / "head.json").unlink()
        self.events.phase("stopped", reason=reason)
        self.events.emit("stopped", reason=reason, exit_code=code, killed=len(self.killed))

    def stop_worker_step(self, deadline: float) -> None:
        """Give the workers time to stop their own Ray, then kill the step if still there."""
        if self.worker_step is None:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.worker_step.wait(max(0.0, deadline - time.monotonic()))
        stop_processes([self.worker_step.pid], [], time.monotonic() + 0.5)
        self.worker_step.poll()
