"""What head and worker share: settings, events, signal flags, one Ray process, a clean stop."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
import traceback
from pathlib import Path

from container import ray_command_prefix
from jsr_base import BootstrapError, Config, PortConflict, short_hostname
from jsr_events import EventLog
from jsr_wire import EVENTS_FILE, LOGS_DIR, SETTINGS_FILE, TOKEN_FILE, Event, Role, TlsFiles
from listeners import block_strangers, listeners, user_name
from memcgroup import OomWatch
from portblock import port_name
from portconflict import ConflictScan
from procgroups import RayProcess, session_processes, stop_processes
from rayargs import NodePlan, plan_node, ray_environment, require_command
from tlsfiles import node_files
from trust import check_job_dir
from unpack import activate_pack

TICK = 0.25  # main loop period (s)
API_PERIOD = 0.5  # readiness poll period (s)
KILL_GRACE = 2.0  # SIGTERM -> SIGKILL
PORT_ATTEMPTS = 3  # port blocks tried in all when `ray start` finds a port taken


class SignalFlags:
    """Signal handlers only set flags; the main loop acts on them."""

    def __init__(self) -> None:
        self.stop: str | None = None
        self.walltime_warnings = 0

    def install(self) -> SignalFlags:
        # SIGUSR2 too: the head stops the worker step with it, since srun forwards SIGUSR2
        # as it is but turns a SIGTERM into a SIGKILL of its tasks.
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR2):
            signal.signal(signum, self._on_stop)
        signal.signal(signal.SIGUSR1, self._on_usr1)
        if os.environ.pop("JSR_WALLTIME_WARNED", "0") == "1":  # came before (job script, __main__)
            self.walltime_warnings += 1
        return self

    def _on_stop(self, signum: int, _frame: object) -> None:
        self.stop = self.stop or signal.Signals(signum).name

    def _on_usr1(self, _signum: int, _frame: object) -> None:
        self.walltime_warnings += 1


class NodeRun:
    """What head and worker share: settings, events, signals, one Ray process, clean stop."""

    role = "node"

    def __init__(self, job_dir: Path) -> None:
        self.job_dir = job_dir
        self.started = time.monotonic()
        self.events = EventLog(job_dir / EVENTS_FILE, self.role)
        self.flags = SignalFlags().install()
        self.logs = job_dir / LOGS_DIR
        self.plan: NodePlan | None = None
        self.tls: TlsFiles | None = None  # this node's certificate (setting tls)
        self.ray: RayProcess | None = None
        self.config: Config | None = None
        self.exit_code = 0
        self.exit_log: list[str] = []
        self.killed: list[str] = []
        self.scan: ConflictScan | None = None
        self.given_up: list[tuple[int, int]] = []  # port blocks left after a conflict
        self.taken_ports: list[int] = []  # ports of the block others listen on (watch_block)
        self.oom = OomWatch(None)  # the job's memory kills (load_config starts it)
        self.oom_told = 0  # kills told in out_of_memory events

    @property
    def deadline(self) -> float:
        assert self.config is not None
        return self.started + float(self.config.start_timeout)

    def load_config(self) -> Config:
        """The settings, once the job dir proved that only this user (or root) can change it.
        The job's memory kills so far are counted (before Ray runs)."""
        check_job_dir(self.job_dir)
        self.config = Config.load(self.job_dir / SETTINGS_FILE)
        self.oom = OomWatch.start()
        return self.config

    def memory_kills(self, fatal: bool) -> str | None:
        """Why Ray is short of memory, when the kernel killed processes of this job for its
        memory limit since the node started: told once per new kill (``out_of_memory``), and
        returned when ``fatal`` (Ray itself ended: the reason of the error) or new."""
        kills, limit = self.oom.since()
        if kills <= 0 or (kills <= self.oom_told and not fatal):
            return None
        host = self.plan.host if self.plan else short_hostname()
        reason = out_of_memory_reason(host, kills, limit, fatal)
        if kills > self.oom_told:
            self.oom_told = kills
            self.events.emit(
                Event.OUT_OF_MEMORY,
                host=host,
                kills=kills,
                limit_mb=limit,
                fatal=fatal,
                reason=reason,
            )
        return reason

    def find_ray(self) -> str:
        """The log dir and the `ray` command (the environment pack's, if the job has one:
        unpacked on this node first); fails fast when ray is missing."""
        self.logs.mkdir(mode=0o700, exist_ok=True)
        activate_pack(self.events.emit, self.job_dir)
        if self.config and self.config.container:
            ray_command_prefix(self.config, self.job_dir, False)  # fails fast when unusable
            return "ray"  # the image's
        return require_command(
            "ray",
            "the job's setup lines must activate an environment that has ray[default] installed",
        )

    def plan_node(self, toward: str | None) -> NodePlan:
        """Claim a port block (not one given up before) and plan this node's `ray start`."""
        assert self.config is not None

        def lock_unavailable(reason: str) -> None:
            self.events.emit(Event.PORT_LOCK_UNAVAILABLE, reason=reason)

        head = self.role == Role.HEAD
        avoid = tuple(self.given_up)
        self.plan = plan_node(self.config, toward, lock_unavailable, avoid, head=head)
        self.make_tls_files(self.plan)
        return self.plan

    def make_tls_files(self, plan: NodePlan) -> None:
        """This node's certificate for Ray's TLS (the cluster's CA made first if need be)."""
        assert self.config is not None
        if self.config.tls and self.tls is None:
            self.tls = node_files(self.job_dir, plan.temp_dir, plan.ip, plan.host)

    def token(self) -> str:
        try:
            return (self.job_dir / TOKEN_FILE).read_text().strip()
        except OSError as exc:
            raise BootstrapError(f"cannot read the cluster token: {exc}") from exc

    def start_ray(self, argv: list[str], log_name: str) -> RayProcess:
        assert self.plan is not None and self.config is not None
        env = ray_environment(self.config, self.job_dir, self.plan.block.ports, self.tls)
        log_path = self.logs / log_name
        self.scan = ConflictScan(
            self.plan.block, log_path, self.plan.temp_dir / "session_latest" / "logs"
        )
        self.ray = RayProcess(self.in_container(argv), env, log_path)
        return self.ray

    def in_container(self, argv: list[str]) -> list[str]:
        """A Ray command as this node runs it: through the runtime when `container` is set."""
        assert self.config is not None
        gpus = bool(self.plan and self.plan.gpus)
        return [*ray_command_prefix(self.config, self.job_dir, gpus), *argv]

    def watch_block(self) -> None:
        """Once running, with a port block: a port of it that someone else listens on now
        (freed by a worker that ended, then taken) is told once (``ports_taken``: Ray can no
        longer start workers there; the cluster is degraded while it lasts), and told again
        once none is (``ports_freed``)."""
        if self.plan is None or not self.plan.block.ports_range:
            return
        strangers = block_strangers(listeners(), self.plan.block.ports_range)
        taken = sorted({found.port for found in strangers})
        if taken == self.taken_ports:
            return
        self.taken_ports = taken
        if not taken:
            self.events.emit(Event.PORTS_FREED, host=self.plan.host, ip=self.plan.ip)
            return
        uids = sorted({found.uid for found in strangers})
        block = self.plan.block
        self.events.emit(
            Event.PORTS_TAKEN,
            host=self.plan.host,
            ip=self.plan.ip,
            ports=taken,
            port_names=[port_name(port - block.start) for port in taken],
            of=block.size,
            by_uids=uids,
            by=[user_name(uid) for uid in uids],
        )

    def check_ports(self) -> None:
        """While Ray starts: raise PortConflict if one of its ports was taken after the probe."""
        conflict = self.scan.check() if self.scan else None
        if conflict:
            raise conflict

    def session_pids(self) -> set[int]:
        """The processes of this node's Ray (its session, descendants, temp dir users)."""
        if self.ray is None or self.plan is None:
            return set()
        return session_processes([self.ray.pid], [str(self.plan.temp_dir)])

    def give_up_ports(self, conflict: PortConflict, new_token: bool = False) -> None:
        """Stop this node's Ray and leave its port block; BootstrapError if no block is left.

        new_token: the event says the cluster's token is renewed before the next attempt."""
        assert self.plan is not None and self.config is not None
        block = self.plan.block
        self.given_up.append((block.start, block.size))
        if self.config.port_strategy == "fixed":
            raise BootstrapError(
                f"{conflict.reason}; port_strategy fixed has no other ports: choose another "
                f"fixed_port_base than {block.start} or use port_strategy random",
                conflict.log,
            )
        if len(self.given_up) >= PORT_ATTEMPTS:
            reason = f"{conflict.reason} ({PORT_ATTEMPTS} port blocks tried)"
            raise BootstrapError(reason, conflict.log)
        self.events.emit(
            Event.PORTS_RETRY,
            ports=conflict.ports,
            port_names=conflict.names,
            reason=conflict.reason,
            attempt=len(self.given_up) + 1,
            attempts=PORT_ATTEMPTS,
            by_uids=conflict.by_uids,
            new_token=new_token,
            log=conflict.log,
        )
        self.stop()

    def stop(self) -> None:
        """Stop this node's Ray session (and leftovers naming its temp dir) within KILL_GRACE."""
        roots = [self.ray.pid] if self.ray else []
        marker = str(self.plan.temp_dir) if self.plan else ""
        self.killed = stop_processes(roots, [marker], time.monotonic() + KILL_GRACE)
        if self.killed:
            print(f"[bootstrap] SIGKILL needed for: {self.killed}", file=sys.stderr, flush=True)
        if self.ray:
            self.ray.exit_code()  # reap
        self.ray, self.scan = None, None
        if self.plan:
            self.plan.block.release()
            shutil.rmtree(self.plan.temp_dir, ignore_errors=True)
            self.tls = None  # it was in the temp dir

    def run(self) -> int:
        reason, code = "finished", 0
        try:
            reason = self.main()
            code = self.exit_code
        except BootstrapError as exc:
            self.events.emit(Event.ERROR, reason=exc.reason, log=exc.log)
            reason, code = "error", 1
        except Exception as exc:
            lines = traceback.format_exc().splitlines()
            self.events.emit(Event.ERROR, reason=f"the bootstrap crashed: {exc!r}", log=lines)
            reason, code = "error", 1
        finally:
            self.finish(reason, code)
        return code

    def main(self) -> str:
        raise NotImplementedError

    def finish(self, reason: str, code: int) -> None:
        self.stop()


def out_of_memory_reason(host: str, kills: int, limit: int | None, fatal: bool) -> str:
    """One line: where, what the kernel killed, the limit, and what to ask for."""
    limit_text = f"the job's limit of {limit} MB" if limit else "the job's memory limit"
    more = f", e.g. --mem {suggested_memory(limit)}" if limit else ""
    if fatal:
        what = f"the kernel killed Ray's processes that went over {limit_text}"
    else:
        what = (
            f"the kernel killed a process of Ray's (a task's worker, most likely) that went "
            f"over {limit_text} ({kills} so far)"
        )
    return f"out of memory on {host}: {what}; ask for more with --mem (mem_per_node){more}"


def suggested_memory(limit_mb: int) -> str:
    """Half as much again, rounded up to half a gigabyte: ``1.5G`` for 1024 MB."""
    half_gigs = -(-(limit_mb * 3 // 2) // 512)
    return f"{half_gigs // 2}G" if half_gigs % 2 == 0 else f"{half_gigs / 2:g}G"
