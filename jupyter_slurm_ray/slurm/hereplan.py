"""Ray in the kernel's own Slurm allocation (``mode = "here"``): which allocation, which of its
nodes, and whether the request fits them, read from Slurm before anything starts.

A kernel inside an allocation (an Open OnDemand app of several nodes, a batchspawner profile,
``salloc -N 4`` then Jupyter) has ``SLURM_JOB_ID`` in its environment: that id is all that is
taken from there. What the allocation is (its owner, state, nodes, and the CPUs, memory and
GPUs it holds on each) is what ``scontrol show job -d`` says; the steps then name it with
``--jobid`` (every Slurm command runs without the kernel's own Slurm variables:
``bootstrap/slurmenv.py``). Refusals are SpecErrors naming the setting to change.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..errors import SlurmError, SpecError
from ..spec import ClusterSpec
from ..transport import Transport
from .client import SlurmClient
from .formats import expand_hostlist

__all__ = [
    "AllocatedNode",
    "Allocation",
    "HerePlan",
    "allocation_id",
    "choose_hosts",
    "head_step",
    "parse_allocation",
    "plan_here",
    "planned_spec",
]

_OUTSIDE = (
    "a kernel inside a running Slurm allocation of yours (start Jupyter in it: salloc -N 4 "
    "then jupyter lab, or an Open OnDemand / batchspawner session of several nodes); "
    "else mode 'slurm' for a job of its own"
)
_JOB_ID = re.compile(r"[0-9]+(?:_[0-9]+)?", re.ASCII)
# scontrol's Key=Value words (keys such as AllocNode:Sid or CPUs/Task included)
_WORD = re.compile(r"(?:^|\s)([A-Za-z_][\w:/]*)=(\S*)")
_GPUS = re.compile(r"gpu(?::[^:(,]+)?:([0-9]+)")


@dataclass(frozen=True)
class AllocatedNode:
    """What the allocation holds on one node (None: Slurm did not say)."""

    host: str
    cpus: int | None = None
    mem_mb: int | None = None
    gpus: int = 0


@dataclass(frozen=True)
class Allocation:
    """One job as ``scontrol show job -d -o`` describes it."""

    job_id: str
    state: str
    user: str
    nodes: tuple[AllocatedNode, ...]

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(node.host for node in self.nodes)

    def node(self, host: str) -> AllocatedNode:
        return next(node for node in self.nodes if node.host == host)


@dataclass(frozen=True)
class HerePlan:
    """Where the cluster runs: the allocation, its chosen nodes (the head first), the CPUs
    each node's step gets, and the kernel's node (None when it is not one of the allocation's:
    Jupyter on a login node after ``salloc``)."""

    allocation: str
    hosts: tuple[str, ...]
    cpus: int | None
    kernel_node: str | None

    @property
    def head(self) -> str:
        return self.hosts[0]

    @property
    def kernel_is_head(self) -> bool:
        return self.kernel_node == self.head

    def notes(self, spec: ClusterSpec) -> tuple[str, ...]:
        """What the plan means, in words, for the user before anything starts."""
        head = f"{self.head} (this kernel's node)" if self.kernel_is_head else self.head
        others = ", ".join(self.hosts[1:])
        nodes = f"head {head}" + (f", workers {others}" if others else "")
        cpus = f", {self.cpus} CPUs per node" if self.cpus else ""
        notes = [
            f"--here: Ray in allocation {self.allocation} on {len(self.hosts)} of its nodes "
            f"({nodes}{cpus}), as steps of it; the allocation's walltime applies and `down` "
            "leaves the allocation running"
        ]
        if self.kernel_is_head and not spec.here_kernel_tasks:
            notes.append(f"{self.head} runs Ray's head only: no tasks (here_kernel_tasks off)")
        elif self.kernel_node is None:
            notes.append("this kernel runs outside the allocation's nodes: no Ray node here")
        elif self.kernel_node not in self.hosts:
            notes.append(f"this kernel's node {self.kernel_node} runs no Ray (not in here_nodes)")
        return tuple(notes)


def allocation_id(environ: Mapping[str, str]) -> str:
    """The allocation this kernel runs in (``SLURM_JOB_ID``); SpecError (``mode``) outside."""
    job = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID") or ""
    if not job:
        raise SpecError("mode", "here", f"{_OUTSIDE} (SLURM_JOB_ID is not set here)")
    if not _JOB_ID.fullmatch(job):
        raise SpecError("mode", "here", f"{_OUTSIDE} (SLURM_JOB_ID={job!r} is not a job id)")
    return job


def kernel_node(environ: Mapping[str, str]) -> str:
    """This kernel's node as Slurm names it (``SLURMD_NODENAME`` inside a job's step)."""
    return environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


async def plan_here(
    transport: Transport, spec: ClusterSpec, environ: Mapping[str, str] | None = None
) -> HerePlan:
    """The plan of ``spec`` (mode 'here') in this kernel's allocation, or SpecError naming the
    setting that does not fit: outside an allocation, not the user's or not running
    (``mode``), nodes it does not have (``here_nodes``), more CPUs, memory or GPUs per node than
    it holds (``cpus_per_node``, ``mem_per_node``, ``gpus_per_node``)."""
    environ = os.environ if environ is None else environ
    job = allocation_id(environ)
    allocation = await read_allocation(transport, job)
    user = (await transport.run(["id", "-un"])).stdout.strip()
    if allocation.user != user:
        owner = f"job {job} (SLURM_JOB_ID here) belongs to {allocation.user}, not to {user}"
        raise SpecError("mode", "here", f"{_OUTSIDE}; {owner}")
    if allocation.state != "RUNNING":
        raise SpecError("mode", "here", f"{_OUTSIDE}; job {job} is {allocation.state}")
    kernel = kernel_node(environ)
    hosts = choose_hosts(allocation, spec.here_nodes, kernel)
    cpus = fitting_cpus(spec, allocation, hosts)
    return HerePlan(job, hosts, cpus, kernel if kernel in allocation.hosts else None)


async def _show_job(transport: Transport, job_id: str) -> str:
    """``scontrol show job -d -o`` of one job (SlurmError in Slurm's words)."""
    if not re.fullmatch(r"[0-9]+(?:_[0-9]+)?", job_id):
        raise SlurmError(f"not a Slurm job id: {job_id!r}")
    return await SlurmClient(transport).output(["scontrol", "show", "job", "-d", "-o", job_id])


async def read_allocation(transport: Transport, job: str) -> Allocation:
    try:
        out = await _show_job(transport, job)
    except SlurmError as exc:
        if "invalid job id" not in str(exc).lower():
            raise
        raise SpecError("mode", "here", f"{_OUTSIDE}; Slurm does not know job {job}") from None
    allocation = parse_allocation(out)
    if allocation is None or allocation.job_id != job:
        raise SlurmError(f"scontrol show job {job} gave no job: {out.strip()[:200]!r}")
    return allocation


def parse_allocation(text: str) -> Allocation | None:
    """The first job of ``scontrol show job -d -o`` (its ``Nodes=… CPU_IDs=… Mem=… GRES=…``
    details per group of nodes; without them, the job's totals shared out evenly)."""
    first = next((line for line in text.splitlines() if line.strip()), "")
    words = [(match.group(1), match.group(2)) for match in _WORD.finditer(first)]
    job = {key: value for key, value in words}
    if "JobId" not in job:
        return None
    hosts = expand_hostlist(job.get("NodeList", ""))
    nodes = {host: AllocatedNode(host) for host in hosts}
    details = _node_details(words)
    if details:
        nodes.update({node.host: node for node in details if node.host in nodes})
    elif hosts:
        nodes = {host: _even_share(host, job, len(hosts)) for host in hosts}
    user = job.get("UserId", "").split("(")[0]
    state = job.get("JobState", "UNKNOWN")
    return Allocation(job["JobId"], state, user, tuple(nodes[host] for host in hosts))


def _node_details(words: Sequence[tuple[str, str]]) -> list[AllocatedNode]:
    """``Nodes=node[1-2] CPU_IDs=0-1 Mem=1024 GRES=gpu:1(IDX:0)`` groups, one node each."""
    groups: list[dict[str, str]] = []
    for key, value in words:
        if key == "Nodes":
            groups.append({})
        if groups:
            groups[-1].setdefault(key, value)
    return [
        AllocatedNode(
            host,
            _count_ids(group.get("CPU_IDs", "")),
            int(group["Mem"]) if group.get("Mem", "").isdigit() else None,
            sum(int(n) for n in _GPUS.findall(group.get("GRES", ""))),
        )
        for group in groups
        for host in expand_hostlist(group["Nodes"])
    ]


def _even_share(host: str, job: Mapping[str, str], count: int) -> AllocatedNode:
    cpus = job.get("NumCPUs", "")
    tres = dict(item.partition("=")[::2] for item in job.get("TRES", "").split(",") if item)
    gpus = tres.get("gres/gpu", "0")
    return AllocatedNode(
        host,
        int(cpus) // count if cpus.isdigit() else None,
        None,
        int(gpus) // count if gpus.isdigit() else 0,
    )


def _count_ids(ids: str) -> int | None:
    """``0-1,4`` → 3."""
    total = 0
    for item in filter(None, ids.split(",")):
        low, _, high = item.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            return None
        total += int(high or low) - int(low) + 1
    return total or None


def choose_hosts(allocation: Allocation, selection: str | None, kernel: str) -> tuple[str, ...]:
    """The allocation's nodes the cluster runs on, the head first: the kernel's node when it
    is chosen, then the others in the allocation's order. ``selection``: None (all), a count,
    or a host list (SpecError ``here_nodes`` when it names more or other nodes)."""
    names = allocation.hosts
    ordered = ([kernel] if kernel in names else []) + [host for host in names if host != kernel]
    have = f"allocation {allocation.job_id} has {len(names)}: {', '.join(names)}"
    if selection is None:
        return tuple(ordered)
    if selection.isdigit():
        if int(selection) > len(names):
            raise SpecError("here_nodes", selection, f"at most {len(names)} nodes ({have})")
        return tuple(ordered[: int(selection)])
    wanted = list(dict.fromkeys(expand_hostlist(selection)))
    unknown = [host for host in wanted if host not in names]
    if unknown:
        allowed = f"nodes of the allocation ({have}); not in it: {', '.join(unknown)}"
        raise SpecError("here_nodes", selection, allowed)
    return tuple(sorted(wanted, key=lambda host: host != kernel))


def fitting_cpus(spec: ClusterSpec, allocation: Allocation, hosts: Sequence[str]) -> int | None:
    """The CPUs each node's step gets (``cpus_per_node``, else the fewest the allocation holds
    on a chosen node); SpecError when the spec asks more of a node than the allocation holds."""
    nodes = [allocation.node(host) for host in hosts]
    where = f"allocation {allocation.job_id} holds"

    def fewest(values: list[tuple[int, str]], field: str, asked: int, unit: str) -> None:
        if values and asked > min(values)[0]:
            least, host = min(values)
            allowed = f"at most {least}: {where} {least} {unit} on {host}"
            raise SpecError(field, asked, allowed)

    cpus = [(node.cpus, node.host) for node in nodes if node.cpus]
    mems = [(node.mem_mb, node.host) for node in nodes if node.mem_mb]
    fewest(cpus, "cpus_per_node", spec.cpus_per_node or 0, "CPUs")
    fewest(mems, "mem_per_node", spec.mem_per_node or 0, "MB")
    fewest([(node.gpus, node.host) for node in nodes], "gpus_per_node", spec.gpus_per_node, "GPUs")
    return spec.cpus_per_node or (min(cpus)[0] if cpus else None)


def planned_spec(spec: ClusterSpec, plan: HerePlan) -> ClusterSpec:
    """``spec`` as it runs: its nodes the chosen hosts (head first), its CPUs per node the
    plan's, and the kernel's node idle only when it is the head."""
    return spec.replace(
        nodes=len(plan.hosts),
        here_nodes=",".join(plan.hosts),
        cpus_per_node=plan.cpus,
        here_kernel_tasks=spec.here_kernel_tasks or not plan.kernel_is_head,
    )


@dataclass(frozen=True)
class HeadStep:
    """What ``submit`` starts: the head's step in ``allocation`` (srun's ``options`` for its
    one task), for a cluster on ``hosts`` (the head first)."""

    allocation: str
    hosts: tuple[str, ...]
    options: tuple[str, ...]

    def srun_options(self) -> list[str]:
        return ["--overlap", *self.options, "--kill-on-bad-exit=0"]


def head_step(plan: HerePlan, spec: ClusterSpec) -> HeadStep:
    """The head's step of ``spec`` (as planned): one task on the head node with the CPUs,
    memory and GPUs each node's step gets (without ``gpus_per_node``, all the allocation
    holds there, as srun gives a step by default)."""
    options = ["--nodes=1", "--ntasks=1", f"--nodelist={plan.head}"]
    if spec.cpus_per_node:
        options.append(f"--cpus-per-task={spec.cpus_per_node}")
    if spec.mem_per_node:
        options.append(f"--mem={spec.mem_per_node}M")
    if spec.gpus_per_node:
        options.append(f"--gres=gpu:{spec.gpus_per_node}")
    return HeadStep(plan.allocation, plan.hosts, tuple(options))
