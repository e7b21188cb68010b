"""How this kernel connects to a cluster, and why: Ray Client through the head, or as an
ordinary Ray driver through a Ray node of its own host (driver mode, ``client/drivernode.py``).

``connect = "auto"`` chooses driver mode when this kernel can be one of the cluster's nodes: it
runs in a Slurm job, or the cluster runs in the kernel's own allocation, or it runs outside
jobs on a host ``driver_hosts`` allows (every host by default: a login node on the cluster's
network) and reaches Slurm without SSH; the cluster's job dir is this user's and on this host's
filesystem, its node joined (so this host reaches the head's GCS), and every node of the
cluster's allocation reaches that node's ports (one run on each of the job's nodes, as its
scheduler runs one: ``nodes_reach``). Anything else means Ray Client, with the reason shown
beside the state.
"""

from __future__ import annotations

import asyncio
import fnmatch
import os
import random
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..bootstrap.jsr_wire import SETTINGS_FILE
from ..errors import SlurmRayError
from ..scheduler.interface import Scheduler
from ..scheduler.kinds import enclosing_job
from ..spec import ClusterSpec
from ..transport import LocalTransport, Transport

__all__ = [
    "CLIENT",
    "DRIVER",
    "DRIVER_HOSTS_DEFAULT",
    "ConnectMode",
    "KernelPlace",
    "allowed_driver_hosts",
    "driver_obstacle",
    "driver_precheck",
    "node_reaches_kernel",
    "nodes_reach",
    "remote_target",
]

CLIENT, DRIVER = "client", "driver"
# SlurmRay.driver_hosts when unset: auto tries driver mode on any host outside Slurm jobs (the
# two-way reach check decides); a site that keeps Ray's daemons off its login nodes sets []
DRIVER_HOSTS_DEFAULT: tuple[str, ...] = ("*",)
REACH_TIMEOUT = 30.0  # nodes_reach's run on the nodes, in all (s)
_MARK = "JSR-REACH"
# bash -c PROBE jsr-reach IP PORT: one line per node, whether it connected to IP:PORT
_PROBE = (
    'if timeout 5 bash -c \'exec 3<>"/dev/tcp/$0/$1"\' "$1" "$2" 2>/dev/null; '
    f'then echo "{_MARK} ok $JSR_NODE"; else echo "{_MARK} failed $JSR_NODE"; fi'
)


@dataclass(frozen=True)
class ConnectMode:
    """The way this process connects (``mode``: driver or client) and why."""

    mode: str
    reason: str

    @property
    def driver(self) -> bool:
        return self.mode == DRIVER

    def describe(self) -> str:
        """``Ray driver (auto: …)`` / ``Ray Client (auto: …)``."""
        return f"{'Ray driver' if self.driver else 'Ray Client'} ({self.reason})"


@dataclass(frozen=True)
class KernelPlace:
    """Where this kernel runs, as driver mode's choice needs it."""

    host: str
    slurm_job: str | None  # the Slurm job it runs in, if any
    driver_hosts: tuple[str, ...] = ()  # site setting: hosts outside jobs that may be Ray nodes

    @classmethod
    def here(
        cls,
        driver_hosts: Sequence[str] = DRIVER_HOSTS_DEFAULT,
        environ: Mapping[str, str] | None = None,
    ) -> KernelPlace:
        job = enclosing_job(environ)
        host = socket.gethostname().split(".")[0]
        return cls(host, job.job_id if job is not None else None, tuple(driver_hosts))

    def on_cluster_network(self) -> str | None:
        """Why this kernel may be one of a cluster's Ray nodes, the nodes' reach aside (None:
        it runs outside Slurm jobs on a host ``driver_hosts`` does not allow)."""
        if self.slurm_job:
            return f"this kernel runs in Slurm job {self.slurm_job} on {self.host}"
        if any(fnmatch.fnmatch(self.host, pattern) for pattern in self.driver_hosts):
            return f"this kernel runs on {self.host}, outside Slurm jobs"
        return None


def driver_obstacle(
    spec: ClusterSpec, job_dir: str, place: KernelPlace, remote: str | None = None
) -> str | None:
    """Why this kernel cannot be a Ray node of the cluster of ``job_dir`` (None: it may, if
    the nodes reach it). ``remote``: the target when Slurm is reached over SSH. Told in words
    for the status line."""
    kind = spec.scheduler_kind
    in_allocation = kind.in_allocation  # `up --here`: the kernel's own allocation
    if kind.on_this_machine:
        return f"{kind.system}: the head runs on this machine"
    if not in_allocation and place.on_cluster_network() is None:
        return (
            f"this kernel runs outside Slurm jobs on {place.host}, which driver_hosts does "
            "not allow"
        )
    if not in_allocation and not place.slurm_job and remote:
        return f"Slurm is reached through {remote}: this kernel is off the cluster"
    return job_dir_obstacle(job_dir)


async def driver_precheck(transport: Transport, job_dir_root: str) -> str | None:
    """Why ``connect = "driver"`` cannot work for a job dir under ``job_dir_root``, known
    before anything is submitted (None: it may, once the nodes reach this host)."""
    if not isinstance(transport, LocalTransport):
        return f"Slurm is reached through {transport.target}: the job dir is not on this host"
    if not Path(job_dir_root).is_dir():
        return f"the job dir root {job_dir_root} is not on this host's filesystem"
    answer = await transport.run(["id", "-u"])
    if answer.stdout.strip() != str(os.getuid()):
        return "the cluster's job dir would belong to another user (command_prefix)"
    return None


def remote_target(transport: Transport) -> str | None:
    """The SSH target Slurm is reached through (None: this host's own Slurm commands)."""
    return None if isinstance(transport, LocalTransport) else transport.target


def allowed_driver_hosts(setting: Sequence[str] | None) -> tuple[str, ...]:
    """``SlurmRay.driver_hosts`` as set (an empty list included), else the default."""
    return DRIVER_HOSTS_DEFAULT if setting is None else tuple(setting)


def job_dir_obstacle(job_dir: str) -> str | None:
    """The job dir must be here, and this user's: the driver node runs its bootstrap."""
    try:
        info = Path(job_dir, SETTINGS_FILE).stat()
    except OSError:
        return "the cluster's job dir is not on this host's filesystem"
    if info.st_uid != os.getuid():
        return "the cluster's job dir belongs to another user (command_prefix)"
    return None


async def nodes_reach(
    scheduler: Scheduler, job_id: str, nodes: int, ip: str, port: int, hosts: str | None = None
) -> str | None:
    """None once every node of the job's allocation (or ``hosts`` of them) connected to
    ``ip:port`` (one run on each node, ``Scheduler.run_on_nodes``); else which did not, or why
    the run failed."""
    argv = ["bash", "-c", _PROBE, "jsr-reach", ip, str(port)]
    check = f"the reach check ({scheduler.node_runner or scheduler.system})"
    try:
        result = await scheduler.run_on_nodes(
            job_id, argv, nodes=nodes, hosts=hosts, timeout=REACH_TIMEOUT
        )
    except SlurmRayError as exc:
        return f"{check} did not run: {exc}"
    said = [line.split()[1:] for line in result.stdout.splitlines() if line.startswith(_MARK)]
    said = [words for words in said if len(words) == 2]
    failed = sorted(node for verdict, node in said if verdict != "ok")
    if failed:
        return f"{', '.join(failed)} cannot reach this kernel's Ray node at {ip}:{port}"
    if len(said) < nodes:
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        why = lines[-1].strip() if lines else f"exit status {result.returncode}"
        return f"{check} answered for {len(said)} of {nodes} nodes: {why}"
    return None


def local_address_toward(ip: str) -> str | None:
    """This host's address on the route toward ``ip`` (a UDP "connect" sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((ip, 9))
            return str(probe.getsockname()[0])
        except OSError:
            return None


async def node_reaches_kernel(
    scheduler: Scheduler, job_id: str, toward: str, port_range: tuple[int, int]
) -> tuple[str, str | None]:
    """``doctor``: whether the job's node connects to a listener of this process on a port of
    ``port_range``, on this host's address toward ``toward`` (the node's): (where, None when
    it did, else why not)."""
    ip = local_address_toward(toward)
    if ip is None:
        return f"toward {toward}", f"this host has no route toward {toward}"
    low, high = port_range
    for port in random.sample(range(low, high + 1), min(50, high - low + 1)):
        try:
            server = await asyncio.start_server(_hang_up, ip, port)
        except OSError:
            continue
        try:
            return f"{ip}:{port}", await nodes_reach(scheduler, job_id, 1, ip, port)
        finally:
            server.close()
            await server.wait_closed()
    return ip, f"no free port in {low}-{high} on this host"


async def _hang_up(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.close()


def driver_reach_plan(
    spec: ClusterSpec, place: KernelPlace, remote: str | None = None
) -> str | None:
    """``doctor``: why driver mode is not checked from here (None: check it). ``remote``:
    the target when Slurm is reached over SSH."""
    if spec.connect == CLIENT:
        return "connect = client: clusters connect with Ray Client"
    if spec.scheduler_kind.on_this_machine:
        return f"{spec.scheduler_kind.system}: clusters connect with Ray Client to this machine"
    if spec.connect == "auto" and place.on_cluster_network() is None:
        return (
            f"auto connects with Ray Client from here: this kernel runs outside Slurm jobs on "
            f"{place.host}, which driver_hosts does not allow"
        )
    if spec.connect == "auto" and remote and not place.slurm_job:
        return f"auto connects with Ray Client from here: Slurm is reached through {remote}"
    return None


def driver_reach_verdict(
    skipped: str | None,
    node: str | None,
    reached: bool | None,
    where: str | None,
    error: str | None,
) -> tuple[str, str, str]:
    """``doctor``'s driver line: (status, detail, fix)."""
    if skipped:
        return "skip", skipped, ""
    if reached is None:
        return "skip", "not checked: the test job did not run the node's checks", ""
    if reached:
        return "ok", f"{node} reached this kernel at {where}: driver mode works from here", ""
    fix = (
        "ask the site which ports compute nodes may open toward this host (port_range), or "
        "connect = 'client' (Ray Client through the head)"
    )
    return "fail", f"{node} did not reach this kernel at {where}: {error}", fix
