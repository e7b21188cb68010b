"""Start, watch and stop a Ray cluster inside a Slurm allocation.

``python bootstrap.py head JOB_DIR`` is the batch step's main process on the first node. It
starts ``ray start --head`` and, at the same moment, one ``srun`` step running
``python bootstrap.py worker JOB_DIR`` on every other node. The client writes into JOB_DIR
before ``sbatch``:

    bootstrap.json   settings (see Config)          ray_token   token (RAY_AUTH_TOKEN_PATH)
    lease            rewritten by the owner          detached    optional: ignore the lease

and this module writes:

    events.jsonl     one JSON object per line, appended: phase, nodes, ready, error, ...
    head.json        the head's address and ports, for the workers (atomic)
    connection.json  what a client needs to connect, once every node joined (atomic, 0600)
    logs/ray-head-<host>.log, logs/ray-worker-<host>.log, logs/srun-workers.log

Only the standard library is used; Ray is driven through its ``ray`` command, since the
cluster's Python may not have the ray package. ``ray stop`` is never used (it kills every Ray
process of the user on the node): each node stops its own process session and nothing else.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import random
import re
import secrets
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.request
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

PORT_NAMES = (
    "gcs",
    "node_manager",
    "object_manager",
    "client",
    "dashboard",
    "dashboard_agent_listen",
    "dashboard_agent_grpc",
    "runtime_env_agent",
    "metrics_export",
    "autoscaler_metrics",
    "dashboard_metrics",
)
DEFAULT_LOCK_DIR = "/tmp/jupyter-slurm-ray-ports"
NODE_RESOURCE = "slurm_ray_node"
TICK = 0.25  # main loop period (s)
API_PERIOD = 0.5  # readiness poll period (s)
WATCH_PERIOD = 2.0  # node-count poll period once ready (s)
LEASE_PERIOD = 1.0
HTTP_TIMEOUT = 1.0  # short: a stop signal must be handled well within Slurm's KillWait
KILL_GRACE = 2.0  # SIGTERM -> SIGKILL
LOG_LINES = 40
RETRY_MIN_TIME = 20.0  # a worker retries `ray start` once if this much start time is left
MAX_TEMP_DIR = 43  # Ray's unix socket paths below it must stay within 107 bytes
MIB = 1024 * 1024


class BootstrapError(Exception):
    """A failure with one clear sentence for the user and the log lines that explain it."""

    def __init__(self, reason: str, log: list[str] | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.log = (log or [])[-LOG_LINES:]


class RayExitedEarly(BootstrapError):
    """A worker's `ray start` gave up before joining (e.g. Ray's own 30 s raylet wait)."""


# ---------------------------------------------------------------- settings and small helpers


@dataclass
class Config:
    """bootstrap.json, written by the client."""

    cluster_id: str
    nodes: int = 1
    port_strategy: str = "random"
    port_range: tuple[int, int] = (20000, 32000)
    fixed_port_base: int | None = None
    worker_ports: int = 32
    network_interface: str | None = None
    node_ip_address_command: str | None = None
    ray_start_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    object_store_memory: int | None = None
    idle_timeout: float = 600.0
    start_timeout: float = 300.0
    lock_dir: str | None = None

    @classmethod
    def load(cls, path: Path) -> Config:
        try:
            raw = json.loads(path.read_text())
            config = cls(cluster_id=str(raw["cluster_id"]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise BootstrapError(f"cannot read the settings {path}: {exc}") from exc
        for item in fields(cls):
            if raw.get(item.name) is not None:
                setattr(config, item.name, raw[item.name])
        config.port_range = (int(config.port_range[0]), int(config.port_range[1]))
        if config.port_strategy not in ("random", "fixed"):
            raise BootstrapError(
                f"port_strategy must be random or fixed, not {config.port_strategy!r}"
            )
        if config.port_strategy == "fixed" and config.fixed_port_base is None:
            raise BootstrapError("port_strategy fixed needs fixed_port_base")
        return config


def short_hostname() -> str:
    return socket.gethostname().split(".")[0]


def job_id() -> str:
    return os.environ.get("SLURM_JOB_ID", f"pid{os.getpid()}")


def tail(path: Path, lines: int = LOG_LINES) -> list[str]:
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, os.fstat(handle.fileno()).st_size - 64 * 1024))
            text = handle.read().decode(errors="replace")
    except OSError:
        return []
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)  # Ray colours its output even into files
    return [f"{path.name}: {line}" for line in text.splitlines()[-lines:] if line.strip()]


def write_json_atomic(path: Path, data: dict[str, Any], mode: int = 0o600) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def run_text(argv: list[str], timeout: float = 10.0) -> str:
    """stdout of a short command, or "" if it is missing, fails or hangs."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout if done.returncode == 0 else ""


class EventLog:
    """Appends one JSON object per line to events.jsonl (one write per line, O_APPEND)."""

    def __init__(self, path: Path, role: str) -> None:
        self.path = path
        self.role = role
        self.host = short_hostname()

    def emit(self, event: str, **extra: Any) -> None:
        record = {"t": time.time(), "event": event, "host": self.host, "role": self.role, **extra}
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (json.dumps(record, default=str) + "\n").encode())
        finally:
            os.close(fd)
        summary = " ".join(f"{k}={v}" for k, v in extra.items() if k not in ("log", "ports"))
        print(f"[bootstrap {self.role}@{self.host}] {event} {summary}", file=sys.stderr, flush=True)

    def phase(self, phase: str, **extra: Any) -> None:
        self.emit("phase", phase=phase, **extra)


class EventTail:
    """Reads the events other nodes append after this process started."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except OSError:
            return []
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        events = []
        for line in complete.splitlines():
            with contextlib.suppress(ValueError):
                events.append(json.loads(line))
        return events


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
        return self

    def _on_stop(self, signum: int, _frame: object) -> None:
        self.stop = self.stop or signal.Signals(signum).name

    def _on_usr1(self, _signum: int, _frame: object) -> None:
        self.walltime_warnings += 1


# ---------------------------------------------------------------------------- port blocks


@dataclass
class PortBlock:
    """Consecutive ports claimed for one node: the named ports, then the worker port range."""

    start: int
    size: int
    claim_file: Path | None = None

    @property
    def ports(self) -> dict[str, int]:
        named = {name: self.start + i for i, name in enumerate(PORT_NAMES)}
        if self.size > len(PORT_NAMES):
            named["min_worker"] = self.start + len(PORT_NAMES)
            named["max_worker"] = self.start + self.size - 1
        return named

    def release(self) -> None:
        if self.claim_file is not None:
            with contextlib.suppress(OSError):
                self.claim_file.unlink()
            self.claim_file = None


def port_name(offset: int) -> str:
    return PORT_NAMES[offset] if offset < len(PORT_NAMES) else "worker"


def ranges_overlap(start: int, size: int, other_start: int, other_size: int) -> bool:
    return start < other_start + other_size and other_start < start + size


def ephemeral_port_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def port_is_free(port: int) -> bool:
    """True if a TCP listener could bind the port on every address (no SO_REUSEADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("", port))
        except OSError:
            return False
    return True


def first_busy_port(start: int, size: int) -> int | None:
    return next((p for p in range(start, start + size) if not port_is_free(p)), None)


def process_start_time(pid: int) -> int | None:
    """Start time of a live (non-zombie) process in clock ticks, None if there is none."""
    try:
        after_name = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if after_name[0] in ("Z", "X") else int(after_name[19])


def claim_is_live(claim: dict[str, Any]) -> bool:
    started = process_start_time(int(claim.get("pid", 0)))
    return started is not None and claim.get("pid_start") in (None, started)


def ensure_shared_dir(path: Path) -> None:
    """A directory every user can create files in, like /tmp (mode 1777 regardless of umask)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o1777)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise BootstrapError(f"the port lock dir {path} is not a directory")
    if info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) != 0o1777:
        os.chmod(path, 0o1777)


@contextlib.contextmanager
def port_lock(lock_dir: Path, timeout: float = 30.0) -> Iterator[None]:
    """Exclusive flock on lock_dir/lock, shared by all users of the node."""
    ensure_shared_dir(lock_dir)
    fd = os.open(lock_dir / "lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    try:
        if os.fstat(fd).st_uid == os.getuid():
            os.fchmod(fd, 0o666)
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise BootstrapError(f"the port lock {lock_dir}/lock stayed busy") from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)


def live_claims(lock_dir: Path) -> list[dict[str, Any]]:
    """Claims of live processes; stale claim files are removed where permitted."""
    claims = []
    for path in lock_dir.glob("*.claim"):
        try:
            claim = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if claim_is_live(claim):
            claims.append(claim)
        else:
            with contextlib.suppress(OSError):
                path.unlink()
    return claims


def write_claim(lock_dir: Path, start: int, size: int, job: str) -> PortBlock:
    pid = os.getpid()
    claim = {"start": start, "size": size, "job_id": job, "pid": pid, "host": short_hostname()}
    claim.update(pid_start=process_start_time(pid), uid=os.getuid(), t=time.time())
    path = lock_dir / f"{start}-{pid}-{secrets.token_hex(3)}.claim"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as handle:
        json.dump(claim, handle)
    return PortBlock(start, size, path)


def candidate_starts(
    port_range: tuple[int, int], size: int, taken: list[dict[str, Any]]
) -> list[int]:
    """Block starts in port_range that avoid the ephemeral range and every live claim."""
    low, high = port_range
    eph_low, eph_high = ephemeral_port_range()
    blocked = [(eph_low, eph_high - eph_low + 1)] + [(c["start"], c["size"]) for c in taken]
    return [
        start
        for start in range(low, high - size + 2)
        if not any(ranges_overlap(start, size, s, n) for s, n in blocked)
    ]


def check_fixed_block(start: int, size: int, taken: list[dict[str, Any]]) -> None:
    for claim in taken:
        if ranges_overlap(start, size, claim["start"], claim["size"]):
            raise BootstrapError(
                f"ports {start}-{start + size - 1} overlap ports claimed by job "
                f"{claim.get('job_id')} (pid {claim.get('pid')}) on {claim.get('host')}"
            )
    busy = first_busy_port(start, size)
    if busy is not None:
        raise BootstrapError(
            f"port {busy} ({port_name(busy - start)}) is already in use on {short_hostname()}; "
            f"choose another fixed_port_base than {start} or use port_strategy random"
        )


def claim_port_block(
    size: int,
    *,
    strategy: str,
    port_range: tuple[int, int],
    fixed_base: int | None,
    lock_dir: Path,
    job: str,
    attempts: int = 64,
    rng: random.Random | None = None,
) -> PortBlock:
    """Claim `size` consecutive free ports under the node-wide lock; release() removes the claim."""
    with port_lock(lock_dir):
        taken = live_claims(lock_dir)
        if strategy == "fixed":
            assert fixed_base is not None
            check_fixed_block(fixed_base, size, taken)
            return write_claim(lock_dir, fixed_base, size, job)
        starts = candidate_starts(port_range, size, taken)
        for start in (rng or random.Random()).sample(starts, min(attempts, len(starts))):
            if first_busy_port(start, size) is None:
                return write_claim(lock_dir, start, size, job)
    low, high = port_range
    raise BootstrapError(
        f"no free block of {size} consecutive ports in {low}-{high} on {short_hostname()} "
        f"(outside the ephemeral range {ephemeral_port_range()}, after {attempts} attempts)"
    )


# --------------------------------------------------------------------------- node address


def ipv4_addresses(ip_output: str) -> list[str]:
    """Non-loopback IPv4 addresses in `ip -o -4 addr show` output, in order."""
    found = re.findall(r"\binet (\d+\.\d+\.\d+\.\d+)/", ip_output)
    return [address for address in found if usable_address(address)]


def usable_address(address: str) -> bool:
    return bool(address) and not address.startswith(("127.", "0.")) and address != "localhost"


def slurmctld_host(config_output: str) -> str | None:
    """The controller's address (or name) from `scontrol show config`."""
    values = dict(re.findall(r"^(\S+)\s*=\s*(.*?)\s*$", config_output, re.MULTILINE))
    addr = values.get("SlurmctldAddr", "")
    if addr and addr != "(null)":
        return addr
    host = values.get("SlurmctldHost[0]", "")
    match = re.fullmatch(r"([^()\s]+)(?:\(([^()\s]+)\))?", host)
    if not match:
        return None
    return match.group(2) or match.group(1)


def resolve_ipv4(name: str) -> str | None:
    if re.fullmatch(r"\d+\.\d+\.\d+\.\d+", name):
        return name
    try:
        return socket.getaddrinfo(name, None, socket.AF_INET)[0][4][0]
    except (OSError, IndexError):
        return None


def route_source_address(target: str) -> str | None:
    """The local address the kernel would use toward target (UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((target, 9))
            return probe.getsockname()[0]
        except OSError:
            return None


def address_from_command(command: str) -> str:
    try:
        done = subprocess.run(
            ["sh", "-c", command], capture_output=True, text=True, timeout=20, check=False
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise BootstrapError(f"node_ip_address_command {command!r} failed: {exc}") from exc
    words = done.stdout.split()
    if done.returncode != 0 or not words or not usable_address(words[0]):
        raise BootstrapError(
            f"node_ip_address_command {command!r} gave no usable address "
            f"(exit {done.returncode}, output {done.stdout.strip()[:80]!r})",
            done.stderr.splitlines(),
        )
    return words[0]


def interface_address(interface: str) -> str:
    found = ipv4_addresses(run_text(["ip", "-o", "-4", "addr", "show", "dev", interface]))
    if not found:
        raise BootstrapError(f"network_interface {interface} has no IPv4 address on this node")
    return found[0]


def node_address(config: Config, toward: str | None) -> str:
    """This node's address for Ray: site command, interface, route toward a peer, any global."""
    if config.node_ip_address_command:
        return address_from_command(config.node_ip_address_command)
    if config.network_interface:
        return interface_address(config.network_interface)
    target = resolve_ipv4(toward) if toward else None
    source = route_source_address(target) if target else None
    if source and usable_address(source):
        return source
    found = ipv4_addresses(run_text(["ip", "-o", "-4", "addr", "show", "scope", "global"]))
    if found:
        return found[0]
    raise BootstrapError(
        "cannot find this node's IPv4 address; set network_interface or node_ip_address_command"
    )


# ---------------------------------------------------------------- what Ray is started with


def require_command(name: str, why: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise BootstrapError(
            f"the `{name}` command is not on PATH ({os.environ.get('PATH', '')}); {why}"
        )
    return path


def allocated_cpus(env: dict[str, str]) -> int:
    for key in ("SLURM_CPUS_ON_NODE", "SLURM_CPUS_PER_TASK"):
        value = env.get(key, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return os.cpu_count() or 1


def visible_gpus(env: dict[str, str]) -> int:
    value = env.get("CUDA_VISIBLE_DEVICES", "").strip()
    if value in ("", "NoDevFiles") or value.startswith("-"):
        return 0
    return len([item for item in value.split(",") if item.strip()])


def job_memory_mb(env: dict[str, str], cpus: int) -> int | None:
    if env.get("SLURM_MEM_PER_NODE", "").isdigit() and int(env["SLURM_MEM_PER_NODE"]) > 0:
        return int(env["SLURM_MEM_PER_NODE"])
    if env.get("SLURM_MEM_PER_CPU", "").isdigit():
        return int(env["SLURM_MEM_PER_CPU"]) * cpus
    return None


def object_store_bytes(configured: int | None, env: dict[str, str], cpus: int) -> int:
    """The configured size, else 30 % of the job's memory on the node, within 80 MB..2 GiB."""
    if configured:
        return int(configured)
    memory_mb = job_memory_mb(env, cpus) or 2048
    return max(80 * MIB, min(2048 * MIB, int(memory_mb * MIB * 0.3)))


def private_dir(path: Path) -> Path:
    """path as a directory only this user can enter (refuses one owned by someone else)."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise BootstrapError(f"{path} exists and is not a directory of this user")
    if stat.S_IMODE(info.st_mode) != 0o700:
        os.chmod(path, 0o700)
    return path


def node_temp_dir(job: str, host: str) -> Path:
    """Ray's node-local dir, short enough for its unix sockets.

    Ray makes its temp dir and session dirs world-writable (0777); the private parent
    /tmp/jsr-<uid> keeps other users out of them.
    """
    parent = private_dir(Path(f"/tmp/jsr-{os.getuid()}"))
    for name in (f"{job}-{host}", f"{job}-{zlib.crc32(host.encode()):08x}"):
        path = parent / name
        if len(str(path)) <= MAX_TEMP_DIR:
            path.mkdir(mode=0o700, exist_ok=True)
            return path
    return Path(tempfile.mkdtemp(dir=parent))


@dataclass
class NodePlan:
    """Everything one node's `ray start` needs."""

    host: str
    ip: str
    block: PortBlock
    temp_dir: Path
    cpus: int
    gpus: int
    object_store: int

    def common_args(self, config: Config) -> list[str]:
        ports = self.block.ports
        args = [
            f"--node-ip-address={self.ip}",
            f"--num-cpus={self.cpus}",
            f"--num-gpus={self.gpus}",
            f"--object-store-memory={self.object_store}",
            f"--resources={json.dumps({NODE_RESOURCE: 1})}",
            f"--temp-dir={self.temp_dir}",
            "--disable-usage-stats",
            f"--node-manager-port={ports['node_manager']}",
            f"--object-manager-port={ports['object_manager']}",
            f"--dashboard-agent-listen-port={ports['dashboard_agent_listen']}",
            f"--dashboard-agent-grpc-port={ports['dashboard_agent_grpc']}",
            f"--runtime-env-agent-port={ports['runtime_env_agent']}",
            f"--metrics-export-port={ports['metrics_export']}",
        ]
        if "min_worker" in ports:
            args += [f"--min-worker-port={ports['min_worker']}"]
            args += [f"--max-worker-port={ports['max_worker']}"]
        return args

    def head_argv(self, ray: str, config: Config) -> list[str]:
        ports = self.block.ports
        return [
            ray, "start", "--head", "--block",
            f"--port={ports['gcs']}",
            f"--ray-client-server-port={ports['client']}",
            "--include-dashboard=true",
            f"--dashboard-host={self.ip}",
            f"--dashboard-port={ports['dashboard']}",
            *self.common_args(config),
            *config.ray_start_args,
        ]  # fmt: skip

    def worker_argv(self, ray: str, config: Config, head_address: str) -> list[str]:
        return [
            ray, "start", f"--address={head_address}", "--block",
            *self.common_args(config), *config.ray_start_args,
        ]  # fmt: skip


def plan_node(config: Config, toward: str | None) -> NodePlan:
    """Claim this node's ports, find its address, and size it from the allocation."""
    size = len(PORT_NAMES) + max(0, int(config.worker_ports))
    block = claim_port_block(
        size,
        strategy=config.port_strategy,
        port_range=config.port_range,
        fixed_base=config.fixed_port_base,
        lock_dir=Path(config.lock_dir or DEFAULT_LOCK_DIR),
        job=job_id(),
    )
    try:
        ip = node_address(config, toward)
        host = short_hostname()
        env = dict(os.environ)
        cpus = allocated_cpus(env)
        object_store = object_store_bytes(config.object_store_memory, env, cpus)
        temp_dir = node_temp_dir(job_id(), host)
    except BaseException:
        block.release()
        raise
    return NodePlan(host, ip, block, temp_dir, cpus, visible_gpus(env), object_store)


def ray_environment(config: Config, job_dir: Path, ports: dict[str, int]) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN_PATH=str(job_dir / "ray_token"),
        RAY_USAGE_STATS_ENABLED="0",
        AUTOSCALER_METRIC_PORT=str(ports["autoscaler_metrics"]),
        DASHBOARD_METRIC_PORT=str(ports["dashboard_metrics"]),
    )
    env.update({str(k): str(v) for k, v in config.env.items()})
    return env


def ray_interpreter(ray: str) -> str | None:
    """The Python that runs the `ray` script, from its shebang (pip's sh trampoline too)."""
    try:
        with open(ray, "rb") as handle:
            head = handle.read(1024).decode(errors="replace").splitlines()
    except OSError:
        return None
    if not head or not head[0].startswith("#!"):
        return None
    words = shlex.split(head[0][2:])
    if words and Path(words[0]).name == "env":
        words = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
        return shutil.which(words[0]) if words else None
    if words and Path(words[0]).name in ("sh", "bash") and len(head) > 1:
        match = re.match(r"'''exec' (\S+)", head[1])
        return match.group(1) if match else None
    return words[0] if words else None


def ray_versions(ray: str) -> tuple[str | None, str | None]:
    """(Ray version, Python version) of the interpreter behind `ray`, without importing ray."""
    python = ray_interpreter(ray)
    if python:
        probe = "import importlib.metadata as m, platform as p\n"
        probe += "print(m.version('ray'), p.python_version())"
        words = run_text([python, "-c", probe], timeout=30).split()
        if len(words) == 2:
            return words[0], words[1]
    match = re.search(r"version (\S+)", run_text([ray, "--version"], timeout=60))
    return (match.group(1) if match else None), None


# ------------------------------------------------------------------------------ processes


def die_with_parent() -> None:
    """In the child before exec: get SIGTERM if the bootstrap itself dies (Linux)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class RayProcess:
    """A child in its own session (so its process group and session id are its pid)."""

    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.popen = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def exit_code(self) -> int | None:
        return self.popen.poll()

    def tail(self) -> list[str]:
        return tail(self.log_path)


def own_processes() -> dict[int, tuple[int, int]]:
    """pid -> (ppid, session id) of this user's live processes."""
    table = {}
    uid = os.getuid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            fields_ = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields_[0] not in ("Z", "X"):
            table[int(entry.name)] = (int(fields_[1]), int(fields_[3]))
    return table


def cmdline(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def processes_to_stop(roots: Iterable[int], markers: Iterable[str]) -> set[int]:
    """The sessions led by roots, their descendants, and processes naming a marker path."""
    table = own_processes()
    root_set = set(roots)
    chosen = {pid for pid, (_ppid, sid) in table.items() if sid in root_set}
    frontier = set(root_set)
    while frontier:
        frontier = {pid for pid, (ppid, _sid) in table.items() if ppid in frontier} - chosen
        chosen |= frontier
    paths = [re.compile(re.escape(m) + r"(?=[/\s]|$)") for m in markers if m]
    chosen |= {pid for pid in table if any(p.search(cmdline(pid)) for p in paths)}
    chosen |= root_set & table.keys()
    chosen.discard(os.getpid())
    return chosen


def signal_all(pids: Iterable[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signum)


def stop_processes(roots: list[int], markers: list[str], deadline: float) -> list[str]:
    """SIGTERM the sessions and their leftovers, SIGKILL whatever is still there at deadline.

    Returns the command lines of the processes that needed SIGKILL.
    """
    signal_all(processes_to_stop(roots, markers), signal.SIGTERM)
    while time.monotonic() < deadline:
        time.sleep(0.1)
        if not processes_to_stop(roots, markers):
            return []
    left = processes_to_stop(roots, markers)
    names = [cmdline(pid)[:120] for pid in left]
    signal_all(left, signal.SIGKILL)
    return names


# ------------------------------------------------------------------------- the dashboard


def node_rows(payload: Any) -> list[dict[str, Any]]:
    """The node list in a /api/v0/nodes reply: {"data": {"result": {"result": [...]}}}."""
    found = payload
    for key in ("data", "result", "result"):
        if isinstance(found, dict):
            found = found.get(key)
    return [row for row in found if isinstance(row, dict)] if isinstance(found, list) else []


def alive_slurm_nodes(rows: list[dict[str, Any]]) -> list[str]:
    """IPs of ALIVE nodes that carry the slurm_ray_node resource, sorted."""
    return sorted(
        str(row.get("node_ip"))
        for row in rows
        if row.get("state") == "ALIVE" and NODE_RESOURCE in (row.get("resources_total") or {})
    )


class Dashboard:
    """The head's state API, asked with the cluster token and without any proxy."""

    def __init__(self, ip: str, port: int, token: str) -> None:
        self.url = f"http://{ip}:{port}/api/v0/nodes?limit=1000"
        self.headers = {"X-Ray-Authorization": f"Bearer {token}"}
        self.opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def alive_nodes(self) -> list[str] | None:
        """Alive node IPs, or None while the dashboard does not answer."""
        request = urllib.request.Request(self.url, headers=self.headers)
        try:
            with self.opener.open(request, timeout=HTTP_TIMEOUT) as reply:
                return alive_slurm_nodes(node_rows(json.loads(reply.read())))
        except (OSError, ValueError):
            return None


def port_open(ip: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((ip, port), timeout=HTTP_TIMEOUT):
        return True
    return False


# ----------------------------------------------------------------------- shared node logic


class NodeRun:
    """What head and worker share: settings, events, signals, one Ray process, clean stop."""

    role = "node"

    def __init__(self, job_dir: Path) -> None:
        self.job_dir = job_dir
        self.started = time.monotonic()
        self.events = EventLog(job_dir / "events.jsonl", self.role)
        self.flags = SignalFlags().install()
        self.logs = job_dir / "logs"
        self.plan: NodePlan | None = None
        self.ray: RayProcess | None = None
        self.config: Config | None = None
        self.exit_code = 0
        self.exit_log: list[str] = []
        self.killed: list[str] = []

    @property
    def deadline(self) -> float:
        assert self.config is not None
        return self.started + float(self.config.start_timeout)

    def setup(self) -> str:
        """Settings, log dir, and the `ray` command; fails fast when ray is missing."""
        self.config = Config.load(self.job_dir / "bootstrap.json")
        self.logs.mkdir(mode=0o700, exist_ok=True)
        return require_command(
            "ray",
            "the job's setup lines must activate an environment that has ray[default] installed",
        )

    def token(self) -> str:
        try:
            return (self.job_dir / "ray_token").read_text().strip()
        except OSError as exc:
            raise BootstrapError(f"cannot read the cluster token: {exc}") from exc

    def start_ray(self, argv: list[str], log_name: str) -> RayProcess:
        assert self.plan is not None and self.config is not None
        env = ray_environment(self.config, self.job_dir, self.plan.block.ports)
        self.ray = RayProcess(argv, env, self.logs / log_name)
        return self.ray

    def stop(self) -> None:
        """Stop this node's Ray session (and leftovers naming its temp dir) within KILL_GRACE."""
        roots = [self.ray.pid] if self.ray else []
        marker = str(self.plan.temp_dir) if self.plan else ""
        self.killed = stop_processes(roots, [marker], time.monotonic() + KILL_GRACE)
        if self.killed:
            print(f"[bootstrap] SIGKILL needed for: {self.killed}", file=sys.stderr, flush=True)
        if self.ray:
            self.ray.exit_code()  # reap
        if self.plan:
            self.plan.block.release()
            shutil.rmtree(self.plan.temp_dir, ignore_errors=True)

    def run(self) -> int:
        reason, code = "finished", 0
        try:
            reason = self.main()
            code = self.exit_code
        except BootstrapError as exc:
            self.events.emit("error", reason=exc.reason, log=exc.log)
            reason, code = "error", 1
        except Exception as exc:
            lines = traceback.format_exc().splitlines()
            self.events.emit("error", reason=f"the bootstrap crashed: {exc!r}", log=lines)
            reason, code = "error", 1
        finally:
            self.finish(reason, code)
        return code

    def main(self) -> str:
        raise NotImplementedError

    def finish(self, reason: str, code: int) -> None:
        self.stop()


# ---------------------------------------------------------------------------------- head


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


def slurmctld_address() -> str | None:
    return slurmctld_host(run_text(["scontrol", "show", "config"]))


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
    argv += [sys.executable, str(job_dir / "bootstrap.py"), "worker", str(job_dir)]
    with open(job_dir / "logs" / "srun-workers.log", "ab") as log:
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=die_with_parent,
        )  # fmt: skip


class LeaseWatch:
    """Stale when the lease file's content did not change for idle_timeout (own clock)."""

    def __init__(self, job_dir: Path, idle_timeout: float) -> None:
        self.path = job_dir / "lease"
        self.detached = job_dir / "detached"
        self.idle_timeout = idle_timeout
        self.content = self.read()
        self.changed_at = time.monotonic()
        self.checked_at = 0.0

    def read(self) -> bytes | None:
        try:
            return self.path.read_bytes()
        except OSError:
            return None

    def stale(self) -> bool:
        now = time.monotonic()
        if self.idle_timeout <= 0 or now - self.checked_at < LEASE_PERIOD:
            return False
        self.checked_at = now
        content = self.read()
        if content != self.content or self.detached.exists():
            self.content, self.changed_at = content, now
            return False
        return now - self.changed_at > self.idle_timeout


# -------------------------------------------------------------------------------- worker


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


# ---------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bootstrap.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "role", choices=["head", "worker"], help="head: the batch step; worker: srun tasks"
    )
    parser.add_argument(
        "job_dir", type=Path, help="the cluster's job dir (bootstrap.json, ray_token, ...)"
    )
    args = parser.parse_args(argv)
    job_dir = args.job_dir.resolve()
    run = HeadRun(job_dir) if args.role == "head" else WorkerRun(job_dir)
    return run.run()


if __name__ == "__main__":
    sys.exit(main())
