"""What one node's `ray start` is run with: ports, address, resources, temp dir, env, versions."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from dashhttp import grpc_exemptions
from jsr_base import Config, command_path, job_id, run_text, short_hostname
from jsr_wire import (
    GROUP_VARIABLE,
    METRICS_VARIABLE,
    NODE_RESOURCE,
    PORT_NAMES,
    PROGRAM_DIR,
    SITE_PATH,
    TOKEN_FILE,
    TlsFiles,
    default_object_store_mb,
    group_resource,
    ray_memory_mb,
)
from kernelports import KernelPorts
from nodeaddr import node_address
from portblock import PortBlock, claim_port_block
from portlock import Notify
from trust import user_temp_dir

MAX_TEMP_DIR = 43  # Ray's unix socket paths below it must stay within 107 bytes
MIB = 1024 * 1024
# Ports Ray 2.60 binds itself when given 0 (the kernel assigns a free one at bind time) and
# then announces (port files in the session dir, the GCS's node table): nobody can bind them
# first, whatever port_strategy says. Ray's own processes connect to these as soon as they
# start, before anyone could check whose listener answers there (measured: the GCS sends a
# HealthCheck to the metrics agent's port within 30 ms of its start); with a pinned port,
# another user who binds it first would be talked to. The GCS is one of them: its port would
# be on `ray start`'s command line (readable by every user) seconds before the GCS binds it.
# With port_strategy 'kernel' every other port is the kernel's choice too (kernelports.py).
KERNEL_ASSIGNED = (
    "--dashboard-agent-listen-port=0",
    "--dashboard-agent-grpc-port=0",
    "--runtime-env-agent-port=0",
    "--metrics-export-port=0",
)


def require_command(name: str, why: str) -> str:
    path = os.environ.get("PATH", "")
    return command_path(name, f"the `{name}` command is not on PATH ({path}); {why}")


def allocated_cpus(env: dict[str, str], usable: int | None = None) -> int:
    """The job's CPUs on this node: Slurm's count, and never more than this process may run on
    (``usable``, default its CPU affinity: a site that constrains cores binds the job to them;
    Ray would count the machine's)."""
    if usable is None and hasattr(os, "sched_getaffinity"):
        usable = len(os.sched_getaffinity(0))
    for key in ("SLURM_CPUS_ON_NODE", "SLURM_CPUS_PER_TASK"):
        value = env.get(key, "")
        if value.isdigit() and int(value) > 0:
            return min(int(value), usable) if usable else int(value)
    return usable or os.cpu_count() or 1


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


def object_store_bytes(
    configured: int | None, env: dict[str, str], cpus: int, head: bool = False
) -> int:
    """The configured size, else 30 % of the job's memory on the node, within 80 MB..2 GiB and
    what Ray's processes leave of it (``jsr_wire.default_object_store_mb``)."""
    if configured:
        return int(configured)
    memory_mb = job_memory_mb(env, cpus) or 2048
    return default_object_store_mb(memory_mb, ray_memory_mb(head, cpus)) * MIB


def ray_memory_bytes(env: dict[str, str], cpus: int, object_store: int, head: bool) -> int | None:
    """Ray's ``memory`` resource on this node: what the job has there, less the object store and
    Ray's own processes (Ray would count the machine's); None when the job's memory is not
    known."""
    memory_mb = job_memory_mb(env, cpus)
    if not memory_mb:
        return None
    left = memory_mb * MIB - object_store - ray_memory_mb(head, cpus) * MIB
    return max(MIB, left)


def node_temp_dir(job: str, host: str) -> Path:
    """Ray's node-local dir, short enough for its unix sockets.

    Ray makes its temp dir and session dirs world-writable (0777); the private parent
    /tmp/jsr-<uid> (``trust.user_temp_dir``) keeps other users out of them.
    """
    parent = user_temp_dir()
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
    block: PortBlock | KernelPorts
    temp_dir: Path
    cpus: int
    gpus: int
    object_store: int
    # ours (slurm_ray_node, which the head counts) and the worker group's; none on a driver's
    resources: dict[str, int] = field(default_factory=lambda: node_resources())
    memory: int | None = None  # Ray's `memory` resource: the job's, less the store and Ray's

    def common_args(self, config: Config) -> list[str]:
        ports = self.block.ports
        args = [
            f"--node-ip-address={self.ip}",
            f"--num-cpus={self.cpus}",
            f"--num-gpus={self.gpus}",
            f"--object-store-memory={self.object_store}",
            f"--resources={json.dumps(self.resources)}",
            f"--temp-dir={self.temp_dir}",
            "--disable-usage-stats",
            f"--node-manager-port={ports['node_manager']}",
            f"--object-manager-port={ports['object_manager']}",
            *KERNEL_ASSIGNED,
        ]
        if "min_worker" in ports:
            args += [f"--min-worker-port={ports['min_worker']}"]
            args += [f"--max-worker-port={ports['max_worker']}"]
        if self.memory is not None:
            args += [f"--memory={self.memory}"]
        return args

    def head_argv(self, ray: str, config: Config) -> list[str]:
        ports = self.block.ports
        return [
            ray, "start", "--head", "--block",
            "--port=0",  # the GCS: kernel-assigned (KERNEL_ASSIGNED), rayports.gcs_port()
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


def node_resources() -> dict[str, int]:
    """The custom Ray resources of this node: ours, and its worker group's (a worker job's
    script sets JSR_WORKER_GROUP): ``group:<name>``, for tasks sent to a group."""
    resources = {NODE_RESOURCE: 1}
    group = os.environ.get(GROUP_VARIABLE, "")
    if group:
        resources[group_resource(group)] = 1
    return resources


def plan_node(
    config: Config,
    toward: str | None,
    notify: Notify | None = None,
    avoid: tuple[tuple[int, int], ...] = (),
    temp_name: str | None = None,
    head: bool = False,
) -> NodePlan:
    """Claim this node's ports, find its address, and size it from the allocation.

    notify(reason): the port lock or claims could not be used; avoid: blocks given up before;
    temp_name: the temp dir's name (default: the job id; a driver's node has its own);
    head: the head's node (with port_strategy 'kernel' it holds Ray Client's port).
    """
    ip = node_address(config, toward)
    block = node_ports(config, ip, head, notify, avoid)
    try:
        host = short_hostname()
        env = dict(os.environ)
        cpus = allocated_cpus(env)
        object_store = object_store_bytes(config.object_store_memory, env, cpus, head)
        memory = ray_memory_bytes(env, cpus, object_store, head)
        temp_dir = node_temp_dir(temp_name or job_id(), host)
    except BaseException:
        block.release()
        raise
    gpus = visible_gpus(env)
    return NodePlan(host, ip, block, temp_dir, cpus, gpus, object_store, memory=memory)


def node_ports(
    config: Config,
    ip: str,
    head: bool,
    notify: Notify | None,
    avoid: tuple[tuple[int, int], ...],
) -> PortBlock | KernelPorts:
    """The kernel's ports ('kernel'), else a block of port_range claimed by the strategy."""
    if config.port_strategy == "kernel":
        return KernelPorts.for_node(ip, head)
    return claim_port_block(
        len(PORT_NAMES) + max(0, int(config.worker_ports)),
        strategy=config.port_strategy,
        port_range=config.port_range,
        fixed_base=config.fixed_port_base,
        lock_dir=config.lock_dir,
        job=job_id(),
        notify=notify,
        avoid=avoid,
    )


def ray_environment(
    config: Config, job_dir: Path, ports: dict[str, int], tls: TlsFiles | None = None
) -> dict[str, str]:
    """The environment of this node's Ray processes: token auth on, TLS with the node's
    certificate (``tlsfiles.py``), the metric ports (and, unless ``ray_metrics``, Ray's
    metrics off), gRPC's fork handlers off, the user's ``env``, and ``sitepath/`` first on
    PYTHONPATH (its sitecustomize defers imports that cost seconds in each of Ray's
    processes, and guards Ray Client's proxier; see there).

    Ray's metrics: its exporter and its three Prometheus endpoints answer anyone who can
    reach the node, and nothing of ours reads them; ``ray_metrics`` turns them on for a site
    that scrapes them (``sitepath/jsr_metrics.py`` keeps the two that no setting of Ray turns
    off closed otherwise).

    gRPC's fork support: the Ray Client proxier forks (then execs) a server per client while
    its gRPC threads are busy; with fork support on, gRPC's handlers start threads in the
    child before its exec, and now and then the child dies of SIGSEGV there, which Ray Client
    reports as "Starting Ray client server failed" 15-40 s later. Traced on the testbed
    (strace -f on the proxier): on, 47 of 60 children started threads before their exec and
    one died so; off, none of 40. The dashboard's forked module processes and the Jobs API
    work with it off (the real tests use them)."""
    env = dict(os.environ)
    env.update(
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN_PATH=str(job_dir / TOKEN_FILE),
        RAY_USAGE_STATS_ENABLED="0",
        AUTOSCALER_METRIC_PORT=str(ports["autoscaler_metrics"]),
        DASHBOARD_METRIC_PORT=str(ports["dashboard_metrics"]),
        GRPC_ENABLE_FORK_SUPPORT="0",
    )
    if not config.ray_metrics:
        env.update({METRICS_VARIABLE: "0", "RAY_enable_metrics_collection": "0"})
    if tls is not None:
        env.update(tls.environment())
    env.update({str(k): str(v) for k, v in config.env.items()})
    env.update(grpc_exemptions(env))  # Ray's metrics exporter: no proxy for its token
    site = str(job_dir / PROGRAM_DIR / SITE_PATH)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (site, env.get("PYTHONPATH", "")) if p)
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


def ray_versions(
    ray: str, env: dict[str, str] | None = None
) -> tuple[str | None, str | None, float | None]:
    """(Ray version, Python version, seconds ``import ray`` took) of the interpreter behind
    `ray`, in the environment of Ray's processes (``env``): the import every one of them pays."""
    python = ray_interpreter(ray)
    if python:
        probe = "import platform, time\nstarted = time.perf_counter()\nimport ray\n"
        probe += "print(ray.__version__, platform.python_version(), time.perf_counter() - started)"
        words = run_text([python, "-c", probe], timeout=60, env=env).split()
        if len(words) == 3:
            return words[0], words[1], round(float(words[2]), 3)
    match = re.search(r"version (\S+)", run_text([ray, "--version"], timeout=60))
    return (match.group(1) if match else None), None, None
