"""A request against the user's accounting: the account and QOS must be the user's, and the
job within the QOS's and the association's per-job limits (MaxWall, MaxTRES…, MinTRES…).

Pure: the answer of ``accounting.load_accounting`` in, a SpecError / LimitError naming Slurm's
own limit out. As in Slurm, a limit the QOS sets wins over the association's of the same kind.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import LimitError, SpecError
from ..scheduler.records import Partition
from ..spec import ClusterSpec, format_walltime
from .accounting import Accounting
from .formats import tres_amount

__all__ = ["Request", "check_against_accounting"]

# The TRES a request sets, as sacctmgr names them, and how a count of each reads.
_NOUNS = {"node": ("node", "nodes"), "cpu": ("CPU", "CPUs"), "gres/gpu": ("GPU", "GPUs")}


@dataclass(frozen=True)
class Request:
    """What a spec asks Slurm for, in TRES terms (None: left to Slurm, not checked)."""

    nodes: int
    cpus_per_node: int | None
    gpus_per_node: int
    mem_per_node: int | None  # megabytes
    seconds: int | None

    @classmethod
    def of(cls, spec: ClusterSpec, partition: Partition | None = None) -> Request:
        cpus = spec.cpus_per_node
        if cpus is None:  # one task per node: one CPU, or the whole node with --exclusive
            whole = partition.cpus_per_node if partition and partition.cpus_per_node else None
            cpus = whole if spec.exclusive else 1
        return cls(spec.nodes, cpus, spec.gpus_per_node, spec.mem_per_node, spec.time_seconds)

    def per_node(self, tres: str) -> int | None:
        return {
            "node": 1,
            "cpu": self.cpus_per_node,
            "gres/gpu": self.gpus_per_node,
            "mem": self.mem_per_node,
        }.get(tres)

    def per_job(self, tres: str) -> int | None:
        if tres == "node":
            return self.nodes
        each = self.per_node(tres)
        return None if each is None else each * self.nodes


def check_against_accounting(
    spec: ClusterSpec, accounting: Accounting, partition: Partition | None = None
) -> None:
    """SpecError / LimitError when Slurm would refuse the job, or never start it, because of
    its account, its QOS or their per-job limits. Nothing is checked when accounting is not
    known."""
    if not accounting.known:
        return
    part = partition.name if partition else None
    account = _checked_account(spec, accounting, part)
    if account is None:
        return
    qos_name = _checked_qos(spec, accounting, account, part)
    qos = accounting.qos.get(qos_name) if qos_name else None
    request = Request.of(spec, partition)
    qos_sets: set[str] = set()
    if qos is not None:
        label = repr(qos.name) + ("" if spec.qos else " (your default QOS)")
        qos_sets = _check_owner(
            "qos",
            qos.name,
            label,
            request,
            max_wall=qos.max_wall,
            per_job=qos.max_tres_per_job,
            per_node=qos.max_tres_per_node,
            min_per_job=qos.min_tres_per_job,
            names=("MaxWall", "MaxTRESPerJob", "MaxTRESPerNode", "MinTRESPerJob"),
        )
    user = accounting.user or "you"
    for association in accounting.associations_of(account, part):
        label = f"{account!r} (the association of {user})"
        _check_owner(
            "account",
            account,
            label,
            request,
            max_wall=None if "wall" in qos_sets else association.max_wall,
            per_job={k: v for k, v in association.max_tres.items() if k not in qos_sets},
            per_node={k: v for k, v in association.max_tres_per_node.items() if k not in qos_sets},
            min_per_job={},
            names=("MaxWall", "MaxTRES", "MaxTRESPerNode", "MinTRES"),
        )


def _checked_account(spec: ClusterSpec, accounting: Accounting, part: str | None) -> str | None:
    account = spec.account or accounting.default_account
    if account is None:
        return None
    user = accounting.user or "this user"
    accounts = accounting.accounts()
    if account not in accounts:
        listed = ", ".join(
            name + (" (default)" if name == accounting.default_account else "") for name in accounts
        )
        raise SpecError(
            "account",
            account,
            f"an account of {user}: {listed} (sacctmgr shows no association of {user} with "
            f"account {account})",
        )
    if not accounting.associations_of(account, part):
        raise SpecError(
            "account",
            account,
            f"an account {user} may use in partition {part}: sacctmgr shows associations of "
            f"{user} with {account} in other partitions only",
        )
    return account


def _checked_qos(
    spec: ClusterSpec, accounting: Accounting, account: str, part: str | None
) -> str | None:
    allowed = accounting.qos_names(account, part)
    if spec.qos is None:
        return accounting.default_qos(account, part)
    if allowed and spec.qos not in allowed:
        default = accounting.default_qos(account, part)
        listed = ", ".join(q + (" (default)" if q == default else "") for q in allowed)
        user = accounting.user or "this user"
        raise SpecError("qos", spec.qos, f"a QOS of {user} under account {account}: {listed}")
    return spec.qos


def _check_owner(
    field: str,
    value: str,
    label: str,
    request: Request,
    *,
    max_wall: int | None,
    per_job: Mapping[str, str],
    per_node: Mapping[str, str],
    min_per_job: Mapping[str, str],
    names: tuple[str, str, str, str],
) -> set[str]:
    """Check one QOS's or association's limits; return the kinds it sets (``wall``, TRES)."""
    wall_name, job_name, node_name, min_name = names
    seconds = request.seconds
    if max_wall is not None and seconds is not None and seconds > max_wall:
        limit = format_walltime(max_wall)
        raise LimitError(
            field,
            value,
            f"{label} allows at most {limit} per job ({wall_name}={limit}); "
            f"you asked for {format_walltime(seconds)}",
        )
    for tres, raw in per_job.items():
        _at_most(field, value, label, tres, raw, request.per_job(tres), "job", job_name, request)
    for tres, raw in per_node.items():
        _at_most(field, value, label, tres, raw, request.per_node(tres), "node", node_name, None)
    for tres, raw in min_per_job.items():
        least, asked = tres_amount(tres, raw), request.per_job(tres)
        if least is not None and asked is not None and asked < least:
            raise LimitError(
                field,
                value,
                f"{label} needs at least {_count(tres, least)} per job ({min_name}={tres}={raw}); "
                f"you asked for {_asked(tres, asked, request)}",
            )
    return ({"wall"} if max_wall is not None else set()) | set(per_job) | set(per_node)


def _at_most(
    field: str,
    value: str,
    label: str,
    tres: str,
    raw: str,
    asked: int | None,
    per: str,
    name: str,
    request: Request | None,
) -> None:
    most = tres_amount(tres, raw)
    if most is None or asked is None or asked <= most:
        return
    shown = _asked(tres, asked, request) if request is not None else str(asked)
    raise LimitError(
        field,
        value,
        f"{label} allows at most {_count(tres, most)} per {per} ({name}={tres}={raw}); "
        f"you asked for {shown}",
    )


def _count(tres: str, amount: int) -> str:
    if tres == "mem":
        return f"{amount} MB of memory"
    one, many = _NOUNS.get(tres, (tres, tres))
    return f"{amount} {one if amount == 1 else many}"


def _asked(tres: str, amount: int, request: Request | None) -> str:
    """``2``, or ``8 (2 nodes × 4)`` for a per-job total made of per-node amounts."""
    if request is None or tres == "node" or request.nodes == 1:
        return str(amount)
    return f"{amount} ({request.nodes} nodes × {amount // request.nodes})"
