"""The kernel host's own Ray node (driver mode): a node that runs no tasks, so that the notebook
kernel on this host is an ordinary Ray driver of the cluster.

``python JOB_DIR/bootstrap driver JOB_DIR --owner-pid PID --ray RAY`` is run by the kernel as
its child, in a session of its own. It joins the head as a worker of the allocation does
(``WorkerRun``: its own port block, the cluster's token, it follows a head that moved), with
``--num-cpus=0 --num-gpus=0``, no custom resource (the head counts the nodes that carry
``slurm_ray_node``: this one is not one of them), a temp dir of its own, RAY, the kernel's own
``ray`` (never the pack's or the container's: the kernel connects through it), and none of the
notebook job's Slurm variables (its memory sizes the object store, unless set).

Once its raylet registered with the GCS (Ray then writes the GCS address into
``ray_current_cluster`` in the node's temp dir) and the node manager's and object manager's
listeners are verified as its own Ray's, it prints one JSON line on stdout for the kernel,
``{"driver": "ready", "ip", "temp_dir", "gcs_address", "node_manager_port", ...}`` (or
``{"driver": "failed", "reason", "log"}``). It leaves when the kernel is gone (it is no longer
this process's parent), on SIGTERM, or when ``head.json`` stayed missing for HEAD_GONE_AFTER s.
Its events carry role ``driver`` and names of their own (``driver_starting``,
``driver_joined``, ``driver_retry``, ``driver_failed``, ``driver_stopped``): nothing that reads
the cluster's events takes them for the allocation's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import stat
import threading
import time
from pathlib import Path
from typing import Any

from jsr_base import BootstrapError, HeadMoved, command_path, gcs_address
from jsr_events import EventLog
from jsr_wire import (
    CONNECTION_FILE,
    EVENTS_FILE,
    HEAD_FILE,
    MIN_OBJECT_STORE_MB,
    DriverLine,
    Event,
    Role,
    TlsFiles,
    ray_memory_mb,
)
from listeners import OwnListeners
from nodeaddr import node_address
from noderun import TICK
from portblock import port_name
from procgroups import RayProcess
from rayargs import MIB, NodePlan, job_memory_mb, plan_node
from rayports import raylet_ports
from slurmenv import is_slurm_input
from tlsfiles import made_node_files
from trust import path_problem
from workerrun import WorkerRun

HEAD_GONE_AFTER = 15.0  # head.json missing this long once joined: the head ended (s)
OWNER_PERIOD = 0.2  # how often the kernel's presence is checked (s)
OWNER_GONE = "OWNER_GONE"  # SignalFlags.stop's value once the kernel is gone
VERIFIED = ("node_manager", "object_manager")  # what the kernel's Ray talks to on this node
KERNEL_MB = 500  # the notebook kernel beside the node (Python, IPython, ray imported): MiB


# the worker's events under the driver's own names
RENAMED = {
    Event.WORKER_STARTING: Event.DRIVER_STARTING,
    Event.WORKER_JOINED: Event.DRIVER_JOINED,
    Event.WORKER_RETRY: Event.DRIVER_RETRY,
    Event.WORKER_STOPPED: Event.DRIVER_STOPPED,
    Event.ERROR: Event.DRIVER_FAILED,
}


class DriverEvents(EventLog):
    """The worker's events under the driver's names; a failure also told to the kernel."""

    def emit(self, event: str, **extra: Any) -> None:
        super().emit(RENAMED.get(event, event), **extra)
        if event == Event.ERROR:
            tell_kernel(DriverLine.FAILED, reason=extra.get("reason"), log=extra.get("log") or [])


def tell_kernel(state: str, **fields: Any) -> None:
    """One JSON line on stdout, which the kernel reads (gone: nobody to tell)."""
    with contextlib.suppress(OSError):
        print(json.dumps({DriverLine.KEY: state, **fields}), flush=True)


class DriverRun(WorkerRun):
    """The kernel host's node: joins like a worker, runs nothing, tells the kernel when ready."""

    role = Role.DRIVER
    join_period = 0.05  # the kernel waits for this node: ask often (local files only)

    def __init__(self, job_dir: Path, owner_pid: int | None, ray: str | None) -> None:
        super().__init__(job_dir)
        self.events = DriverEvents(job_dir / EVENTS_FILE, self.role)
        self.owner_pid = owner_pid
        self.ray_command = ray
        self.own: OwnListeners | None = None
        self.head_missing_since: float | None = None
        self.left: str | None = None
        self.object_store: int | None = None
        if owner_pid is not None:
            threading.Thread(target=self.watch_owner, name="owner", daemon=True).start()

    def watch_owner(self) -> None:
        """The kernel is gone once this process is no longer its child: stop (the main loop
        acts on the flag as on a signal)."""
        while self.flags.stop is None:
            if os.getppid() != self.owner_pid:
                self.flags.stop = OWNER_GONE
                return
            time.sleep(OWNER_PERIOD)

    def stop_reason(self) -> str:
        if self.flags.stop == OWNER_GONE:
            return f"the kernel (pid {self.owner_pid}) is gone"
        return self.left or super().stop_reason()

    # ----- the head's node, when the head runs on this host

    def main(self) -> str:
        """Through the head's own node when the head runs on this host (``--here`` puts it on
        the kernel's node): a second Ray node there would only take CPU and memory, and the
        kernel would wait for it. Else a node of its own, joined as a worker joins."""
        self.load_config()
        head = self.read_head_json()
        while head is not None and self.head_is_here(head):
            try:
                connection = self.head_connection(head)
            except HeadMoved as moved:
                head = moved.head
                continue
            if connection is None:  # asked to stop, or the head is gone
                return self.left or self.stop_reason()
            if own_dir(str(connection.get("temp_dir", ""))):
                return self.through_the_head(head, connection)
            break  # its temp dir is not this user's here (a job's private /tmp): a node of its own
        return super().main() if head is not None else self.stop_reason()

    def head_is_here(self, head: dict[str, Any]) -> bool:
        """The head's address is the one this host's node would have (never for a container's
        head: its Ray and temp dir live in the container)."""
        assert self.config is not None
        if self.config.container:
            return False
        try:
            return node_address(self.config, str(head["head_ip"])) == head["head_ip"]
        except BootstrapError:
            return False  # a node of its own then says why, the way a worker would

    def through_the_head(self, head: dict[str, Any], connection: dict[str, Any]) -> str:
        """Tell the kernel to connect through the head's node; stay (a process to stop, as its
        own node's would be) until the kernel, a signal or the head ends it."""
        address = gcs_address(head)
        self.events.emit(Event.DRIVER_JOINED, ip=head["head_ip"], head=address, through="head")
        tls = head_tls_files(self.job_dir, connection)
        tell_kernel(
            DriverLine.READY,
            ip=head["head_ip"],
            host=str(connection.get("head_host", "")),
            temp_dir=str(connection["temp_dir"]),
            gcs_address=address,
            node_manager_port=int(connection["ports"]["node_manager"]),
            object_store_memory=0,
            pid=os.getpid(),
            through="head",
            **tls_fields(tls),
        )
        while not self.flags.stop:
            gone = self.head_gone()
            if gone:
                return gone
            time.sleep(TICK)
        return self.stop_reason()

    def head_connection(self, head: dict[str, Any]) -> dict[str, Any] | None:
        """The head's connection.json once this head answers (its node's ports checked as its
        own Ray's); None when asked to stop or when the head is gone meanwhile. HeadMoved if
        the head moved."""
        path = self.job_dir / CONNECTION_FILE
        while not self.flags.stop and not self.head_gone():
            self.check_head_moved(head)
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                said = json.loads(path.read_text())
                if said["gcs_address"] == gcs_address(head) and said["ports"]["node_manager"]:
                    return dict(said)
            if time.monotonic() > self.deadline:
                raise BootstrapError(f"the head at {gcs_address(head)} did not answer in time")
            time.sleep(self.join_period)
        return None

    # ----- what differs from a worker of the allocation

    def find_ray(self) -> str:
        """The kernel's own `ray` (the one it connects with); no pack, no container."""
        self.logs.mkdir(mode=0o700, exist_ok=True)
        if self.ray_command:
            if not os.access(self.ray_command, os.X_OK):
                raise BootstrapError(f"the kernel's ray command {self.ray_command} is missing")
            return self.ray_command
        return command_path("ray", "the kernel's environment must have ray[default] installed")

    def in_container(self, argv: list[str]) -> list[str]:
        return argv  # the kernel's host runs the kernel's Ray, whatever the nodes run

    def plan_node(self, toward: str | None) -> NodePlan:
        """A port block and an address as a worker's, a temp dir of its own, and nothing to
        run tasks with."""
        assert self.config is not None

        def lock_unavailable(reason: str) -> None:
            self.events.emit(Event.PORT_LOCK_UNAVAILABLE, reason=reason)

        plan = plan_node(
            self.config,
            toward,
            lock_unavailable,
            tuple(self.given_up),
            temp_name=f"d{os.getpid()}",
        )
        # sized once, from the notebook job's memory (Slurm's variables, removed below)
        self.object_store = self.object_store or driver_object_store(plan)
        self.plan = dataclasses.replace(
            plan, cpus=0, gpus=0, resources={}, object_store=self.object_store, memory=None
        )
        # this node's Ray is no step of the notebook's job: Slurm's variables stay out of it
        for name in [name for name in os.environ if is_slurm_input(name, in_own_job=False)]:
            del os.environ[name]
        block = self.plan.block
        names = {port: port_name(port - block.start) for port in block.ports_range}
        self.own = OwnListeners(self.session_pids, block.ports_range, names, ip=self.plan.ip)
        self.make_tls_files(self.plan)
        return self.plan

    def has_joined(self, head: dict[str, Any]) -> bool:
        """Ray says this node registered with the head's GCS, and the listeners the kernel's
        Ray will talk to are this node's own Ray's: then the kernel is told."""
        assert self.plan is not None and self.own is not None
        address = gcs_address(head)
        try:
            said = (self.plan.temp_dir / "ray_current_cluster").read_text().strip()
        except OSError:
            return False
        if said != address:
            return False
        self.own.scan()
        self.own.check_block()
        ports = {**self.plan.block.ports, **raylet_ports(self.plan.temp_dir)}
        if not all(ports[name] and self.own.verify(name, ports[name]) for name in VERIFIED):
            return False
        tell_kernel(
            DriverLine.READY,
            ip=self.plan.ip,
            host=self.plan.host,
            temp_dir=str(self.plan.temp_dir),
            gcs_address=address,
            node_manager_port=ports["node_manager"],
            object_store_memory=self.plan.object_store,
            pid=os.getpid(),
            **tls_fields(self.tls),
        )
        return True

    def leave_reason(self, process: RayProcess | None, head: dict[str, Any]) -> str | None:
        """Once joined: the head is gone when head.json stayed missing HEAD_GONE_AFTER s."""
        if process is None or self.left:
            return self.left
        return self.head_gone()

    def head_gone(self) -> str | None:
        """Why this node leaves: head.json stayed missing HEAD_GONE_AFTER s (else None)."""
        if self.left:
            return self.left
        if (self.job_dir / HEAD_FILE).exists():
            self.head_missing_since = None
            return None
        now = time.monotonic()
        self.head_missing_since = self.head_missing_since or now
        if now - self.head_missing_since >= HEAD_GONE_AFTER:
            self.left = f"head.json was missing for {HEAD_GONE_AFTER:g} s: the head is gone"
        return self.left

    def finish(self, reason: str, code: int) -> None:
        super().finish(reason, code)
        tell_kernel(DriverLine.STOPPED, reason=reason, exit_code=code)


def driver_object_store(plan: NodePlan) -> int:
    """The object store of the kernel's node: the node's share of the notebook job's memory,
    within what its Ray processes and the kernel beside them leave (a site that enforces
    memory kills the whole notebook job when they go over)."""
    memory_mb = job_memory_mb(dict(os.environ), plan.cpus)
    if not memory_mb:
        return plan.object_store
    left = memory_mb - ray_memory_mb(False, 1) - KERNEL_MB
    return min(plan.object_store, max(MIN_OBJECT_STORE_MB, left) * MIB)


def tls_fields(tls: TlsFiles | None) -> dict[str, str]:
    """What the kernel's Ray needs of this node's TLS files (its own gRPC server answers at
    this node's address: the node's certificate names it)."""
    if tls is None:
        return {}
    return {"tls_cert": str(tls.cert), "tls_key": str(tls.key), "tls_ca": str(tls.ca)}


def head_tls_files(job_dir: Path, connection: dict[str, Any]) -> TlsFiles | None:
    """The head node's certificate (its temp dir, this user's and seen here: the kernel
    runs on the head's host), when the cluster runs with TLS."""
    if not connection.get("tls"):
        return None
    return made_node_files(job_dir, Path(str(connection["temp_dir"])))


def own_dir(path: str) -> bool:
    """The head's temp dir as Ray leaves it (0777), seen from here: a directory of this
    user's whose parents no one else may change (the private /tmp/jsr-<uid> keeps others out,
    ``trust.user_temp_dir``)."""
    temp = Path(path)
    with contextlib.suppress(OSError):
        info = os.lstat(temp)
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid():
            return path_problem(temp.parent, os.getuid()) is None
    return False
