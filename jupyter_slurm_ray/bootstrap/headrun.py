"""The batch step on the first node: head, worker step, readiness, connection.json, supervision.

The cluster token goes only to listeners verified as this job's own Ray (``listeners.py``):
``head.json`` names the GCS once its listener is verified (and the dashboard once its is),
the dashboard is asked only by this process and only over a connection its verified
listener accepted, and ``connection.json`` records the listeners verified. Clients on other
hosts reach the dashboard through the relay (``dashrelay.py``: TLS with this node's
certificate); Ray's own channels are TLS with the cluster's CA (``tlsfiles.py``). The nodes
the head sees alive go to ``nodes.json`` (Ray node ids: the workers read there whether they
joined). With a port block (port_strategy other than 'kernel'), a listener of someone else
on a port of the block loses the block before clients are told (Ray starts again on another,
with a new token); after, a taken worker port degrades the cluster (``ports_taken``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
from pathlib import Path

from allocationend import AllocationEnd
from container import container_versions
from dashapi import AliveNode, Dashboard
from dashrelay import DashboardRelay
from jsr_base import (
    BUSY_RETRIES,
    RETRY_MIN_TIME,
    BootstrapError,
    PortConflict,
    RayExitedEarly,
    job_id,
    ray_startup_timed_out,
    renew_token,
    run_text,
    short_hostname,
    write_json_atomic,
)
from jsr_events import EventTail, LeaseWatch, owner_gone
from jsr_wire import (
    CONNECTION_FILE,
    EVENTS_FILE,
    HEAD_FILE,
    LOCAL_MODE_VARIABLE,
    NODES_FILE,
    TOKEN_FILE,
    WORKER_JOB_FIELD,
    Event,
    Phase,
    Role,
    ray_log,
)
from listeners import OwnListeners, still_listening
from nodeaddr import slurmctld_address
from noderun import API_PERIOD, KILL_GRACE, TICK, NodeRun
from nodewatch import NodeWatch
from portblock import port_name
from rayargs import ray_environment, ray_versions, require_command
from rayports import dashboard_port, gcs_port, node_id, raylet_ports
from slurmenv import own_job_environment
from workerstep import HereWorkers, WorkerStep

WATCH_PERIOD = 2.0  # node-count poll period once ready (s)
JOINING_WATCH = 60.0  # after a worker job's worker_starting: polled every API_PERIOD this long
# Ray's and Python's versions as the nodes run them, and the seconds `import ray` takes there
Versions = tuple[str | None, str | None, float | None]


class HeadRun(NodeRun):
    """The batch step: head node, worker step, readiness, connection.json, supervision."""

    role = Role.HEAD

    def __init__(self, job_dir: Path) -> None:
        super().__init__(job_dir)
        self.worker_step = WorkerStep(self.logs)
        self.tail = EventTail(job_dir / EVENTS_FILE)
        self.nodes = NodeWatch(0, self.events.emit, self.worker_step.log_lines)
        self.lease = LeaseWatch(job_dir, 0.0)
        self.worker_step_reported = False
        self.worker_jobs: set[str] = set()  # extra worker jobs that wrote events
        self.own: OwnListeners | None = None  # this attempt's listeners, as verified
        self.dashboard: Dashboard | None = None  # once its port is known
        self.relay: DashboardRelay | None = None  # once the dashboard is verified (tls)
        self.gcs: int | None = None  # the GCS's port (kernel-assigned), once verified
        self.head_json: dict[str, object] = {}
        self.clients_told = False  # connection.json written for this attempt (head_ready)
        self.allocation_end: AllocationEnd | None = None  # mode 'here': the walltime warning
        self.joining_until = 0.0  # a worker job started: alive nodes asked often until then
        self.head_retries = 0  # times `ray start --head` was started again (head_retry)

    def main(self) -> str:
        self.events.phase(Phase.BOOTSTRAP, job_id=job_id(), pid=os.getpid(), python=sys.executable)
        config = self.load_config()
        owner_timeout = float(config.owner_timeout)
        gone = owner_gone(self.job_dir, owner_timeout, lambda: self.flags.stop is not None)
        if gone:
            self.events.emit(Event.OWNER_GONE, **gone)
            return "owner_gone"
        self.forget_head()
        if self.flags.stop:
            return f"signal {self.flags.stop}"
        self.nodes.wanted = self.wanted
        self.lease = LeaseWatch(self.job_dir, owner_timeout)
        srun = (
            require_command("srun", "it starts Ray on the other nodes") if self.wanted > 1 else ""
        )
        if config.here_hosts:  # steps of the kernel's own allocation: its end warns
            allocation = os.environ.get("SLURM_JOB_ID", "")
            self.allocation_end = AllocationEnd(allocation, float(config.walltime_warning))
        if self.wanted > 1:  # first: the workers unpack a pack (if any) while this node does
            self.logs.mkdir(mode=0o700, exist_ok=True)
            self.events.phase(Phase.WORKERS_STARTING, workers=self.wanted - 1)
            self.worker_step.start(srun, self.job_dir, self.wanted - 1, self.here_workers())
        ray = self.find_ray()
        # local mode (slurm/localjobs.py: one node, no Slurm) has no controller to route toward
        toward = None if os.environ.get(LOCAL_MODE_VARIABLE) == "1" else slurmctld_address()
        self.start_head(ray, toward)
        versions = self.probe_versions(ray)
        while True:
            try:
                stop = self.wait_until_ready(versions)
                break
            except PortConflict as conflict:
                self.move_head(conflict, ray, toward)
            except RayExitedEarly as exited:
                self.restart_head(exited, ray, toward)
        if stop:
            return stop
        self.write_connection(versions)
        self.announce_ready()
        return self.supervise()

    def here_workers(self) -> HereWorkers | None:
        """In the kernel's own allocation (mode 'here'): the worker step's nodes (the
        cluster's others), its name and CPUs; None in a job of its own."""
        assert self.config is not None
        if not self.config.here_hosts:
            return None
        me = os.environ.get("SLURMD_NODENAME") or short_hostname()
        others = tuple(host for host in self.config.here_hosts if host != me)
        return HereWorkers(others, job_id(), self.config.cpus_per_node)

    def move_head(self, conflict: PortConflict, ray: str, toward: str | None) -> None:
        """A port of the block was lost: Ray again on another block (BootstrapError when none
        is left, or when clients were told of the listener someone else now holds)."""
        if self.clients_told and conflict.by_uids:
            raise stopped_for_clients(conflict)
        self.forget_head()  # the workers wait for the new head.json
        # Before clients were told (head_ready), the old token may have gone only to this
        # block: a new one costs nothing. After, clients hold it and nothing of ours sent it
        # to a port that was not verified: it is kept.
        renew = not self.clients_told
        if renew:
            renew_token(self.job_dir / TOKEN_FILE)
        self.give_up_ports(conflict, new_token=renew)
        self.start_head(ray, toward)

    def restart_head(self, exited: RayExitedEarly, ray: str, toward: str | None) -> None:
        """Ray's own start-up wait ran out (a busy node): Ray again (BUSY_RETRIES times at
        most), on a new block and with a new token, if start_timeout leaves time; else
        BootstrapError."""
        if self.head_retries >= BUSY_RETRIES or self.deadline - time.monotonic() < RETRY_MIN_TIME:
            raise BootstrapError(exited.reason, exited.log)
        self.head_retries += 1
        self.events.emit(
            Event.HEAD_RETRY, reason=exited.reason, log=exited.log, attempt=self.head_retries + 1
        )
        self.forget_head()
        renew_token(self.job_dir / TOKEN_FILE)  # clients were not told: nothing holds it
        self.stop()
        self.start_head(ray, toward)

    def forget_head(self) -> None:
        """No head.json, connection.json or nodes.json: nothing names a head that is not
        verified."""
        self.head_json = {}
        if self.relay is not None:
            self.relay.stop()
            self.relay = None
        for stale in (CONNECTION_FILE, HEAD_FILE, NODES_FILE):
            with contextlib.suppress(OSError):
                (self.job_dir / stale).unlink()

    def start_head(self, ray: str, toward: str | None) -> None:
        """Claim ports and start `ray start --head`; head.json waits for verified listeners."""
        assert self.config is not None
        plan = self.plan_node(toward)
        if self.config.here_hosts and not self.config.here_kernel_tasks:
            plan.cpus = plan.gpus = 0  # the kernel's node: Ray's head, no tasks
        self.events.phase(Phase.PORTS, ports=plan.block.ports, strategy=self.config.port_strategy)
        self.nodes.hosts[plan.ip] = plan.host
        names = {port: port_name(port - plan.block.start) for port in plan.block.ports_range}
        names[plan.block.ports["client"]] = "client"
        self.own = OwnListeners(self.session_pids, plan.block.ports_range, names, ip=plan.ip)
        self.dashboard = None
        self.gcs = None
        self.clients_told = False
        self.events.phase(Phase.HEAD_STARTING, head_ip=plan.ip, temp_dir=str(plan.temp_dir))
        self.start_ray(plan.head_argv(ray, self.config), ray_log(self.role, plan.host))

    def probe_versions(self, ray: str) -> Versions:
        """Ray's and Python's versions, and the cost of `import ray` that each of Ray's Python
        processes pays (measured while the head starts; ``doctor`` reports it when slow)."""
        assert self.plan is not None and self.config is not None
        env = ray_environment(self.config, self.job_dir, self.plan.block.ports, self.tls)
        if self.config.container:
            versions = container_versions(self.in_container([]), env)
        else:
            versions = ray_versions(ray, env)
        self.events.emit(Event.IMPORT_RAY, seconds=versions[2], ray_version=versions[0])
        return versions

    @property
    def wanted(self) -> int:
        assert self.config is not None
        return int(self.config.nodes)

    def write_head_json(self) -> None:
        """head.json for the workers: the GCS once verified (they start Ray toward it), the
        dashboard once verified."""
        assert self.plan is not None and self.config is not None and self.own is not None
        plan, verified = self.plan, self.own.ports()
        head: dict[str, object] = {"cluster_id": self.config.cluster_id, "job_id": job_id()}
        head.update(head_host=plan.host, head_ip=plan.ip, gcs_port=verified["gcs"])
        if "dashboard" in verified:
            head["dashboard_port"] = verified["dashboard"]
        head["verified"] = sorted(verified)
        if head != self.head_json:
            write_json_atomic(self.job_dir / HEAD_FILE, head)
            self.head_json = head

    # ----- whose listeners answer on the head's ports

    @property
    def dashboard_port(self) -> int | None:
        """The dashboard's port: the block's, or where Ray bound it (port 0), once known."""
        assert self.plan is not None
        return self.plan.block.ports["dashboard"] or dashboard_port(self.plan.temp_dir)

    def check_listeners(self) -> None:
        """Until clients are told: PortConflict if someone else listens on a port of the block.
        The GCS's port (which Ray announces once bound) and the dashboard's verified and told
        in head.json; the relay started in front of the dashboard. (Once clients are told,
        ``supervise`` watches the verified listeners and the block.)"""
        assert self.own is not None and self.plan is not None
        self.own.scan()
        if not self.clients_told:
            self.own.check_block()
        if self.gcs is None:
            port = gcs_port(self.plan.temp_dir)
            if port is None or not self.own.verify("gcs", port):
                return
            self.gcs = port
        dashboard = self.dashboard_port
        if dashboard is not None and self.own.verify("dashboard", dashboard):
            self.open_dashboard(dashboard)
        self.write_head_json()

    def open_dashboard(self, port: int) -> None:
        """This process's way to the verified dashboard, and the relay for everyone else's."""
        assert self.plan is not None and self.own is not None
        if self.dashboard is None:
            ip, own = self.plan.ip, self.own

            def accepted_by_ours() -> bool:
                target = own.target("dashboard")
                return target is not None and still_listening(ip, target[0], target[1])

            self.dashboard = Dashboard(ip, port, self.token(), accepted_by_ours)
        if self.relay is None and self.tls is not None:
            self.relay = DashboardRelay(self.plan.ip, self.tls, self.dashboard_target).start()

    def dashboard_target(self) -> tuple[int, frozenset[int]] | None:
        """The verified dashboard (port, sockets) for the relay, while it is still ours."""
        return self.own.target("dashboard") if self.own is not None else None

    def alive_nodes(self) -> list[AliveNode] | None:
        """The dashboard's alive nodes, asked (with the token) only over a connection that the
        listener verified as ours accepted; None while it is not there yet."""
        assert self.own is not None and self.plan is not None
        if self.gcs is None or self.dashboard is None:
            return None
        return self.dashboard.alive_nodes()

    def note_nodes(self, alive: list[AliveNode], after_ready: bool) -> None:
        """The alive set noted (and node_lost told once ready); nodes.json rewritten when it
        changed, for the workers that wait to see themselves there."""
        changed = self.nodes.check_lost(alive) if after_ready else self.nodes.note(alive)
        if changed or not (self.job_dir / NODES_FILE).exists():
            self.write_nodes_json()

    def write_nodes_json(self) -> None:
        assert self.plan is not None
        nodes = [node.to_json() for node in self.nodes.joined]
        payload = {"gcs_address": f"{self.plan.ip}:{self.gcs}", "nodes": nodes}
        write_json_atomic(self.job_dir / NODES_FILE, payload)

    # ----- checks shared by the start and the supervision loops

    def stop_requested(self) -> str | None:
        """Walltime warnings become events; a stop signal or a stale lease ends the run."""
        if self.allocation_end is not None and self.allocation_end.warning_due():
            self.flags.walltime_warnings += 1
        while self.flags.walltime_warnings:
            self.flags.walltime_warnings -= 1
            self.events.emit(Event.WALLTIME_WARNING, job_id=job_id())
        if self.flags.stop:
            return f"signal {self.flags.stop}"
        if self.lease.stale():
            self.events.emit(Event.LEASE_STALE, owner_timeout=self.lease.owner_timeout)
            return "lease_stale"
        return None

    def check_head_alive(self) -> None:
        assert self.ray is not None
        code = self.ray.exit_code()
        if code is not None:
            self.check_ports()  # its last words may name a taken port
            reason = self.memory_kills(fatal=True)  # the job's memory limit: say so, not Ray's
            said = f"`ray start --head` exited with status {code}"
            tail = self.ray.tail()
            if not reason and not self.clients_told and ray_startup_timed_out(tail):
                raise RayExitedEarly(f"{said}: its raylet did not register in Ray's 30 s", tail)
            raise BootstrapError(reason or said, tail)

    def read_worker_events(self, ready: bool) -> None:
        for event in self.tail.read():
            if event.get("role") != Role.WORKER:
                continue
            if event.get("ip") and event.get("host"):
                self.nodes.hosts[str(event["ip"])] = str(event["host"])
            if event.get(WORKER_JOB_FIELD):  # an extra worker job: its own business, not a failure
                self.note_worker_job(event)
                continue
            if event.get("event") == Event.ERROR and not ready:
                reason = f"the worker on {event.get('host')} failed: {event.get('reason')}"
                raise BootstrapError(reason, list(event.get("log") or []))

    def note_worker_job(self, event: dict[str, object]) -> None:
        """Worker jobs seen (cancelled when the head ends); nodes leaving on purpose."""
        self.worker_jobs.add(str(event[WORKER_JOB_FIELD]))
        if event.get("event") == Event.WORKER_STARTING:
            self.joining_until = time.monotonic() + JOINING_WATCH
        node = event.get("node_id")
        if event.get("event") == Event.WORKER_LEAVING and isinstance(node, str):
            self.nodes.leaving.add(node)
        elif event.get("event") == Event.WORKER_JOINED and isinstance(node, str):
            self.nodes.leaving.discard(node)

    def cancel_worker_jobs(self) -> None:
        """The head ends: so do the worker jobs that joined it (they would leave anyway
        once head.json is gone; this is sooner)."""
        scancel = shutil.which("scancel")
        if self.worker_jobs and scancel:
            run_text([scancel, *sorted(self.worker_jobs)], timeout=10, env=own_job_environment())

    # ----- start

    def wait_until_ready(self, versions: Versions) -> str | None:
        """Poll until every node is alive; returns a stop reason if asked to stop meanwhile.

        As soon as the head answers (dashboard and Ray Client port, both verified ours),
        connection.json is written and ``head_ready`` told: clients connect while the
        workers still join.
        """
        assert self.plan is not None and self.own is not None
        head_up = head_ready = False
        while True:
            self.read_worker_events(ready=False)
            self.check_ports()
            self.check_listeners()
            self.check_head_alive()
            self.check_worker_step_before_ready()
            stop = self.stop_requested()
            if stop:
                return stop
            if time.monotonic() > self.deadline:
                raise self.start_timeout_error(head_up)
            alive = self.alive_nodes()
            if alive is not None:
                if not head_up:
                    head_up = True
                    self.events.phase(Phase.HEAD_UP, dashboard_port=self.dashboard_port)
                    self.events.phase(
                        Phase.WAITING_FOR_NODES, joined=len(alive), wanted=self.wanted
                    )
                self.note_nodes(alive, after_ready=False)
                client_ours = self.own.verify("client", self.plan.block.ports["client"])
                if client_ours and not head_ready:
                    head_ready = self.clients_told = True
                    self.write_connection(versions)
                    self.plan.block.publish()  # Ray bound its ports: the claim may be seen
                    # (port_strategy 'kernel': Ray Client's port no longer held for it)
                    self.events.emit(Event.HEAD_READY, joined=len(alive), wanted=self.wanted)
                if len(alive) >= self.wanted and client_ours:
                    return None
            time.sleep(API_PERIOD)

    def check_worker_step_before_ready(self) -> None:
        code = self.worker_step.exit_code()
        if code is None:
            return
        time.sleep(0.2)
        self.read_worker_events(ready=False)
        raise BootstrapError(
            f"the worker step (srun) exited with status {code} before all nodes joined",
            self.worker_step.log_lines(),
        )

    def start_timeout_error(self, head_up: bool) -> BootstrapError:
        assert self.config is not None and self.ray is not None and self.plan is not None
        timeout = self.config.start_timeout
        if self.gcs is None:
            reason = f"Ray's GCS did not start within start_timeout ({timeout} s)"
            return BootstrapError(reason, self.ray.tail())
        if not head_up:
            dash = f"http://{self.plan.ip}:{self.dashboard_port or '(port not bound yet)'}"
            reason = (
                f"the Ray dashboard at {dash} did not answer within start_timeout ({timeout} s)"
            )
            return BootstrapError(reason, self.ray.tail())
        missing = self.nodes.missing()
        reason = (
            f"only {len(self.nodes.joined)} of {self.wanted} nodes joined within start_timeout "
            f"({timeout} s)" + (f"; not joined: {', '.join(missing)}" if missing else "")
        )
        return BootstrapError(reason, self.worker_step.log_lines())

    def write_connection(self, versions: Versions) -> None:
        """connection.json: what a client needs to connect, with the nodes joined so far, and
        the listeners verified as this job's Ray (clients talk to no other address)."""
        assert self.plan is not None and self.config is not None and self.own is not None
        ports = self.bound_ports()
        nodes = [
            {"host": self.nodes.host(node.ip), "ip": node.ip, "node_id": node.node_id}
            for node in self.nodes.joined
        ]
        listeners = self.own.ports()
        if self.relay is not None:
            listeners["relay"] = self.relay.port  # this process's own listener
        connection = {
            "cluster_id": self.config.cluster_id,
            "job_id": job_id(),
            "head_host": self.plan.host,
            "head_ip": self.plan.ip,
            "head_node_id": node_id(self.plan.temp_dir),
            "gcs_address": f"{self.plan.ip}:{self.gcs}",
            "client_port": ports["client"],
            # what clients use: the relay (https) with tls, the dashboard itself without
            "dashboard_port": self.relay.port if self.relay is not None else ports["dashboard"],
            "tls": self.relay is not None,
            "ports": ports,
            "verified": {"uid": os.getuid(), "listeners": listeners},
            "ray_version": versions[0],
            "python_version": versions[1],
            "import_ray_seconds": versions[2],
            "node_count": len(nodes),
            "nodes": nodes,
            "temp_dir": str(self.plan.temp_dir),
            "ready_at": time.time(),
        }
        write_json_atomic(self.job_dir / CONNECTION_FILE, connection)

    def bound_ports(self) -> dict[str, int]:
        """The head's ports as Ray bound them: the block's, or (port 0) where Ray says it
        bound them, the raylet's verified as this job's Ray's."""
        assert self.plan is not None and self.own is not None
        ports = {**self.plan.block.ports, "gcs": self.gcs or 0}
        ports["dashboard"] = self.dashboard_port or 0
        for name, port in raylet_ports(self.plan.temp_dir).items():
            if not ports.get(name) and self.own.verify(name, port):
                ports[name] = port
        return ports

    def announce_ready(self) -> None:
        assert self.plan is not None
        joined, elapsed = len(self.nodes.joined), round(time.monotonic() - self.started, 2)
        gcs = f"{self.plan.ip}:{self.gcs}"
        self.events.phase(Phase.READY, joined=joined, wanted=self.wanted)
        self.events.emit(Event.READY, gcs_address=gcs, node_count=joined, elapsed=elapsed)

    # ----- supervision

    def supervise(self) -> str:
        next_poll = time.monotonic() + WATCH_PERIOD
        while True:
            stop = self.stop_requested()
            if stop:
                return stop
            self.check_head_alive()
            self.read_worker_events(ready=True)
            self.check_worker_step_after_ready()
            if time.monotonic() >= next_poll:
                # a worker job starting waits for nodes.json to name it: asked more often then
                joining = time.monotonic() < self.joining_until
                next_poll = time.monotonic() + (API_PERIOD if joining else WATCH_PERIOD)
                self.check_still_ours()
                self.watch_block()
                self.memory_kills(fatal=False)
                alive = self.alive_nodes()
                if alive is not None:
                    self.note_nodes(alive, after_ready=True)
            time.sleep(TICK)

    def check_still_ours(self) -> None:
        """Once ready: the listeners clients were told about are still this job's Ray's;
        otherwise the cluster stops, so that no client sends its token to another's."""
        assert self.own is not None
        self.own.scan()
        for name, port in self.own.ports().items():
            try:
                ours = self.own.verify(name, port)
            except PortConflict as taken:
                raise stopped_for_clients(taken) from None
            if not ours:
                self.check_head_alive()  # its process died: Ray's own words say why

    def check_worker_step_after_ready(self) -> None:
        assert self.plan is not None
        code = self.worker_step.exit_code()
        if code is None or self.worker_step_reported:
            return
        self.worker_step_reported = True
        workers = set(self.nodes.hosts.values()) - {self.plan.host} - self.nodes.lost_hosts()
        reason = f"the worker step (srun) exited with status {code}: no Ray worker nodes left"
        if workers:
            self.nodes.report_lost_hosts(sorted(workers), reason)

    def finish(self, reason: str, code: int) -> None:
        self.events.phase(Phase.STOPPING, reason=reason)
        step_deadline = time.monotonic() + KILL_GRACE + 1.0
        self.worker_step.ask_to_stop()
        if self.relay is not None:
            self.relay.stop()
            self.relay = None
        self.stop()
        self.worker_step.stop(step_deadline)
        for gone in (HEAD_FILE, NODES_FILE):
            with contextlib.suppress(OSError):
                (self.job_dir / gone).unlink()
        self.read_worker_events(ready=True)
        self.cancel_worker_jobs()
        self.events.phase(Phase.STOPPED, reason=reason)
        self.events.emit(Event.STOPPED, reason=reason, exit_code=code, killed=len(self.killed))


def stopped_for_clients(taken: PortConflict) -> BootstrapError:
    """Someone else listens where clients were told the head is: the cluster ends."""
    why = "the cluster stops so that no client sends its token there"
    return BootstrapError(f"{taken.reason}; {why}", taken.log)
