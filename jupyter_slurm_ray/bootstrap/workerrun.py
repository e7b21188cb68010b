"""One task of the worker step: join the head from this node, follow it if it moves, stop.

The head writes ``head.json`` only once it verified the GCS's listener as its own Ray's: a
worker starts Ray toward that GCS (TLS with the cluster's CA), and it has joined once the
head's ``nodes.json`` lists this node's Ray node id among the nodes alive (the id of this
node's own Ray, from its session dir: another node on the same host is another id). A
worker sends the token to nothing else: it asks no dashboard.
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

from dashapi import port_open
from jsr_base import (
    BUSY_RETRIES,
    RETRY_MIN_TIME,
    BootstrapError,
    HeadMoved,
    PortConflict,
    RayExitedEarly,
    gcs_address,
    ray_startup_timed_out,
)
from jsr_wire import HEAD_FILE, NODES_FILE, Event, Role, ray_log
from noderun import API_PERIOD, TICK, NodeRun
from procgroups import RayProcess
from rayports import node_id

HEAD_CHECK = 2.0  # once joined: how often head.json is read for a move (s)


class WorkerRun(NodeRun):
    """One task of the worker step: join the head, bounded by start_timeout, stop on SIGTERM."""

    role = Role.WORKER
    join_period = API_PERIOD  # how often wait_until_joined asks whether it joined (s)
    node_id: str | None = None  # this node's Ray node id, once its Ray wrote it

    def main(self) -> str:
        self.load_config()
        ray = self.find_ray()
        head = self.read_head_json()
        if head is None:
            return self.stop_reason()
        self.plan_node(head["head_ip"])
        early_retries = 0
        while True:
            try:
                return self.join(ray, head)
            except HeadMoved as moved:
                reason = f"the head moved to {moved} (ports of its first block were taken)"
                self.events.emit(Event.WORKER_RETRY, reason=reason)
                head = moved.head
                self.stop()
            except PortConflict as conflict:
                self.give_up_ports(conflict)
            except RayExitedEarly as exc:
                # once; twice when Ray's own start-up wait ran out (a busy node: the other
                # nodes' start is over by then)
                allowed = BUSY_RETRIES if ray_startup_timed_out(exc.log) else 1
                if early_retries >= allowed or self.deadline - time.monotonic() < RETRY_MIN_TIME:
                    raise
                early_retries += 1
                self.events.emit(Event.WORKER_RETRY, reason=exc.reason, log=exc.log)
                self.stop()
            self.plan_node(head["head_ip"])

    def join(self, ray: str, head: dict[str, Any]) -> str:
        """Start Ray toward the head, wait until it joined, then stay until asked to stop."""
        assert self.plan is not None and self.config is not None
        address = gcs_address(head)
        self.node_id = None  # this attempt's Ray tells its own
        self.events.emit(
            Event.WORKER_STARTING,
            ip=self.plan.ip,
            ports=self.plan.block.ports,
            head=address,
            temp_dir=str(self.plan.temp_dir),
        )
        if not self.wait_for_gcs(head):
            return self.stop_reason()
        argv = self.plan.worker_argv(ray, self.config, address)
        process = self.start_ray(argv, ray_log(self.role, self.plan.host))
        stop = self.wait_until_joined(process, head)
        if stop:
            return stop
        self.plan.block.publish()  # Ray bound its ports: the claim may be seen
        self.node_id = node_id(self.plan.temp_dir)
        self.events.emit(Event.WORKER_JOINED, ip=self.plan.ip, head=address, node_id=self.node_id)
        next_check = time.monotonic() + HEAD_CHECK
        while not self.flags.stop:
            leave = self.leave_reason(process, head)
            if leave:
                return leave
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + HEAD_CHECK
                self.check_head_moved(head)
                self.watch_block()
                self.memory_kills(fatal=False)
            code = process.exit_code()
            if code is not None:  # after joining: the head reports node_lost
                self.check_head_moved(head)
                self.exit_code, self.exit_log = 1, process.tail()
                return self.memory_kills(fatal=True) or f"`ray start` exited with status {code}"
            time.sleep(TICK)
        return self.stop_reason()

    def stop_reason(self) -> str:
        return f"signal {self.flags.stop}"

    def leave_reason(self, process: RayProcess | None, head: dict[str, Any]) -> str | None:
        """Once joined: why this node leaves on its own (a worker job's checks), else None."""
        return None

    def latest_head(self) -> dict[str, Any] | None:
        """What head.json says now (None while it is missing or unreadable)."""
        with contextlib.suppress(OSError, ValueError):
            head = json.loads((self.job_dir / HEAD_FILE).read_text())
            if isinstance(head, dict) and "head_ip" in head and "gcs_port" in head:
                return head
        return None

    def check_head_moved(self, head: dict[str, Any]) -> None:
        """HeadMoved if head.json now names another GCS address (a missing file is no move)."""
        now = self.latest_head()
        if now is not None and gcs_address(now) != gcs_address(head):
            raise HeadMoved(now)

    def alive_ids(self, head: dict[str, Any]) -> set[str] | None:
        """The node ids the head saw alive last (``nodes.json``); None while it names no
        nodes of this head."""
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            said = json.loads((self.job_dir / NODES_FILE).read_text())
            if said["gcs_address"] == gcs_address(head):
                return {str(node["node_id"]) for node in said["nodes"]}
        return None

    def wait_for_gcs(self, head: dict[str, Any]) -> bool:
        """Start Ray once the head's GCS listens: each failed join attempt costs ~5 s."""
        ip, port = head["head_ip"], int(head["gcs_port"])
        while not self.flags.stop:
            if self.leave_reason(None, head):
                return False
            self.check_head_moved(head)
            if port_open(ip, port):
                return True
            if time.monotonic() > self.deadline:
                raise BootstrapError(f"the head's GCS at {ip}:{port} did not open in time")
            time.sleep(0.2)
        return False

    def read_head_json(self) -> dict[str, Any] | None:
        """head.json, waited for (the head writes it once its GCS listens and is verified);
        None when asked to stop meanwhile."""
        path = self.job_dir / HEAD_FILE
        while not self.flags.stop:
            head = self.latest_head()
            if head is not None:
                return head
            if time.monotonic() > self.deadline:
                raise BootstrapError(f"the head's address file {path} did not appear in time")
            time.sleep(0.2)
        return None

    def wait_until_joined(self, process: RayProcess, head: dict[str, Any]) -> str | None:
        assert self.plan is not None
        address = gcs_address(head)
        while not self.flags.stop:
            self.check_ports()
            code = process.exit_code()
            if code is not None:
                self.check_ports()  # its last words may name a taken port
                self.check_head_moved(head)
                oom = self.memory_kills(fatal=True)
                if oom:
                    raise BootstrapError(oom, process.tail())
                reason = f"`ray start` exited with status {code} before joining {address}"
                raise RayExitedEarly(f"{reason} from {self.plan.host}", process.tail())
            if time.monotonic() > self.deadline:
                reason = f"{self.plan.host} did not join the head at {address} within start_timeout"
                raise BootstrapError(reason, process.tail())
            self.check_head_moved(head)
            if self.has_joined(head):
                return None
            time.sleep(self.join_period)
        return self.stop_reason()

    def has_joined(self, head: dict[str, Any]) -> bool:
        """This node's own Ray (its node id) is among the nodes the head sees alive."""
        assert self.plan is not None
        self.node_id = self.node_id or node_id(self.plan.temp_dir)
        return self.node_id is not None and self.node_id in (self.alive_ids(head) or set())

    def finish(self, reason: str, code: int) -> None:
        self.stop()
        self.events.emit(Event.WORKER_STOPPED, reason=reason, exit_code=code, log=self.exit_log)
