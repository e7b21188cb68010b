"""What Ray waits for, pure: the dashboard's ``api/cluster_status`` answer (Ray's autoscaler
state) parsed into pending tasks and actors, pending placement groups with their strategy, and
each node's use and free room; and how many new nodes of one shape would hold it.

Placement groups are counted as Ray's own autoscaler counts them: ``PACK`` and ``SPREAD``
bundles as separate demands, a ``STRICT_PACK`` group as one bundle (its bundles summed: one node
must hold it), a ``STRICT_SPREAD`` group's bundles each on a node of its own. A pending group
is all or nothing, so the part of it the nodes have room for now waits there for the rest: its
bundles go to that room first, and only what is left asks for new nodes. Tasks and actors are
counted without the room (Ray queues them only when they do not fit). Demands for a placement
group's own bundle resources (``CPU_group_<id>``: actors waiting for their group) are left out:
new nodes never hold them, the group's own demand does.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

MAX_BUNDLES = 1000  # demand instances packed at most (the maximum caps the nodes anyway)
# Resources Ray gives every node of the head's shape (its memory and object store: not sized).
IGNORED = ("objectStoreMemory", "object_store_memory")
_ALIASES = {"CPU": "CPU", "GPU": "GPU", "memory": "memory"}
# A placement group's bundle resources (``CPU_group_<pg>``, ``GPU_group_0_<pg>``, ``bundle``).
_GROUP_RESOURCE = re.compile(r"^(?:.+_group_(?:\d+_)?[0-9a-f]+|bundle)$")
STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")

Bundle = Mapping[str, float]
Demand = Sequence[tuple[Bundle, int]]


@dataclass(frozen=True)
class Shape:
    """One worker job's Ray node: what a new node brings."""

    cpus: float
    gpus: float = 0.0
    memory: float | None = None  # bytes, None: not sized

    def missing(self, bundle: Bundle) -> str | None:
        """Why one node of this shape cannot hold ``bundle`` (None: it can)."""
        for name, amount in bundle.items():
            if name in IGNORED or amount <= 0:
                continue
            have = self.capacity().get(_ALIASES.get(name, name))
            if have is None:
                return f"worker nodes have no {name} resource"
            if amount > have + 1e-9:
                return f"a worker node has {have:g} {name}, not {amount:g}"
        return None

    def capacity(self) -> dict[str, float]:
        room = {"CPU": self.cpus, "GPU": self.gpus}
        if self.memory is not None:
            room["memory"] = self.memory
        return room

    def describe(self) -> str:
        return f"{self.cpus:g} CPU, {self.gpus:g} GPU"


@dataclass(frozen=True)
class PlacementDemand:
    """``count`` pending placement groups of one strategy and the same bundles."""

    strategy: str  # one of STRATEGIES
    bundles: tuple[tuple[dict[str, float], int], ...]  # bundle, how many in the group
    count: int = 1

    def size(self) -> int:
        """Bundles in one group."""
        return sum(n for _, n in self.bundles)

    def placed_as(self) -> list[dict[str, float]]:
        """One group's bundles as Ray places them: a STRICT_PACK group as one bundle."""
        each = [bundle for bundle, n in self.bundles for _ in range(n)]
        if self.strategy != "STRICT_PACK":
            return each
        summed: dict[str, float] = {}
        for bundle in each:
            for name, amount in bundle.items():
                summed[name] = summed.get(name, 0.0) + amount
        return [summed]

    def describe(self) -> str:
        """``placement group STRICT_SPREAD of 3 × {CPU: 1, GPU: 1}`` (× count when several)."""
        parts = ", ".join(
            f"{n} × {{{', '.join(f'{k}: {v:g}' for k, v in sorted(b.items()))}}}"
            for b, n in self.bundles
        )
        times = f"{self.count} placement groups" if self.count > 1 else "placement group"
        return f"{times} {self.strategy} of {parts}"


@dataclass(frozen=True)
class RayView:
    """Ray's autoscaler state, as far as the policy needs it."""

    demand: tuple[tuple[dict[str, float], int], ...]  # bundle, count (tasks, actors, requests)
    busy: dict[str, bool]  # node IP -> it runs something (CPU or GPU in use)
    head_shape: Shape | None  # the head's node (a worker job is one node of its shape)
    at: float = 0.0  # when the autoscaler wrote it
    groups: tuple[PlacementDemand, ...] = ()  # pending placement groups
    room: dict[str, dict[str, float]] = field(default_factory=dict)  # node IP -> free CPU/GPU/mem

    @property
    def waiting(self) -> bool:
        """Something waits: a task, an actor, a placement group."""
        return bool(self.demand or self.groups)


def _bundles(entries: object) -> Iterable[tuple[dict[str, float], int]]:
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], dict):
            bundle, count = entry
            if isinstance(count, int) and count > 0:
                yield {str(k): float(v) for k, v in bundle.items() if _number(v)}, count


def _placement_groups(entries: object) -> Iterable[PlacementDemand]:
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], dict):
            group, count = entry
            bundles = tuple(_bundles(group.get("bundles")))
            strategy = str(group.get("strategy") or "PACK")
            if bundles:
                strategy = strategy if strategy in STRATEGIES else "PACK"
                yield PlacementDemand(strategy, bundles, count if isinstance(count, int) else 1)


def _for_new_nodes(bundle: Bundle) -> bool:
    """Not a demand for a placement group's own bundles (only its group's nodes have those)."""
    return not any(_GROUP_RESOURCE.match(name) for name in bundle)


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _used(usage: Mapping[str, Any], name: str) -> float:
    pair = usage.get(name)
    return float(pair[0]) if isinstance(pair, list) and pair and _number(pair[0]) else 0.0


def _total(usage: Mapping[str, Any], name: str) -> float | None:
    pair = usage.get(name)
    return float(pair[1]) if isinstance(pair, list) and len(pair) > 1 else None


def _room(usage: Mapping[str, Any]) -> dict[str, float]:
    free = {}
    for name in _ALIASES:
        total = _total(usage, name)
        if total is not None:
            free[name] = max(0.0, total - _used(usage, name))
    return free


def parse_cluster_status(data: Mapping[str, Any]) -> RayView:
    """The dashboard's ``api/cluster_status`` answer (its ``data``) → demand and node usage."""
    status = data.get("clusterStatus") or {}
    report = status.get("loadMetricsReport") or {}
    asked = [*_bundles(report.get("resourceDemand")), *_bundles(report.get("requestDemand"))]
    demand = tuple(pair for pair in asked if _for_new_nodes(pair[0]))
    busy: dict[str, bool] = {}
    room: dict[str, dict[str, float]] = {}
    head_shape = None
    for usage in (report.get("usageByNode") or {}).values():
        if not isinstance(usage, dict):
            continue
        ips = [
            key.split(":", 1)[1] for key in usage if key.startswith("node:") and key[5:6].isdigit()
        ]
        if "node:InternalHead" in usage or "node:__internal_head__" in usage:
            head_shape = Shape(
                _total(usage, "CPU") or 0.0, _total(usage, "GPU") or 0.0, _total(usage, "memory")
            )
        for ip in ips:
            busy[ip] = _used(usage, "CPU") > 0 or _used(usage, "GPU") > 0
            room[ip] = _room(usage)
    at = status.get("time")
    when = float(at) if isinstance(at, int | float) else 0.0
    groups = tuple(_placement_groups(report.get("pgDemand")))
    return RayView(demand, busy, head_shape, when, groups, room)


# -- nodes for the demand ----------------------------------------------------------------------
@dataclass
class _Node:
    free: dict[str, float]
    spread: set[int] = field(default_factory=set)  # STRICT_SPREAD groups with a bundle here

    def takes(self, need: Mapping[str, float], spread: int | None) -> bool:
        if spread is not None and spread in self.spread:
            return False
        return all(self.free.get(k, 0.0) + 1e-9 >= v for k, v in need.items())

    def take(self, need: Mapping[str, float], spread: int | None) -> None:
        for k, v in need.items():
            self.free[k] = self.free.get(k, 0.0) - v
        if spread is not None:
            self.spread.add(spread)


# One bundle to place, and the STRICT_SPREAD group it belongs to (None: any node will do).
_Item = tuple[dict[str, float], int | None]


def _sized(bundle: Bundle) -> dict[str, float]:
    return {_ALIASES[k]: v for k, v in bundle.items() if k in _ALIASES and v > 0}


def _largest_first(items: list[_Item]) -> list[_Item]:
    return sorted(items, key=lambda i: (i[0].get("GPU", 0.0), i[0].get("CPU", 0.0)), reverse=True)


def _group_items(groups: Sequence[PlacementDemand]) -> list[_Item]:
    items: list[_Item] = []
    for index, group in enumerate(groups):
        for copy in range(group.count):
            spread = index * MAX_BUNDLES + copy if group.strategy == "STRICT_SPREAD" else None
            items += [(_sized(b), spread) for b in group.placed_as()]
            if len(items) >= MAX_BUNDLES:
                return items[:MAX_BUNDLES]
    return items


def _left_over(items: list[_Item], room: Iterable[Mapping[str, float]]) -> list[_Item]:
    """The items that do not fit the nodes' free ``room`` (first fit, largest first)."""
    nodes = [_Node(dict(free)) for free in room]
    left = []
    for need, spread in _largest_first(items):
        node = next((n for n in nodes if n.takes(need, spread)), None)
        if node is None:
            left.append((need, spread))
        else:
            node.take(need, spread)
    return left


def nodes_for(
    demand: Demand,
    shape: Shape,
    groups: Sequence[PlacementDemand] = (),
    room: Iterable[Mapping[str, float]] = (),
) -> int:
    """How many new nodes of ``shape`` hold the tasks' ``demand`` and the pending ``groups``
    (their bundles first in the present nodes' free ``room``); first fit, largest first, a
    STRICT_SPREAD group's bundles on distinct nodes."""
    items: list[_Item] = []
    for bundle, count in demand:
        items += [(_sized(bundle), None)] * min(count, MAX_BUNDLES - len(items))
    items += _left_over(_group_items(groups), room)
    nodes: list[_Node] = []
    for need, spread in _largest_first(items):
        node = next((n for n in nodes if n.takes(need, spread)), None)
        if node is None:
            node = _Node(shape.capacity())
            nodes.append(node)
        node.take(need, spread)
    return len(nodes)


def describe_demand(demand: Demand, groups: Sequence[PlacementDemand] = ()) -> str:
    """``3 pending tasks/actors need 3 CPU``; ``placement group STRICT_SPREAD of 3 × {CPU: 1,
    GPU: 1} pending`` (both joined by ``; `` when both wait)."""
    parts = []
    if demand:
        count = sum(n for _, n in demand)
        totals: dict[str, float] = {}
        for bundle, n in demand:
            for name, amount in bundle.items():
                if name not in IGNORED:
                    totals[name] = totals.get(name, 0.0) + amount * n
        needs = ", ".join(f"{v:g} {k}" for k, v in sorted(totals.items())) or "nothing sized"
        parts.append(f"{count} pending task{'s' if count != 1 else ''}/actors need {needs}")
    parts += [f"{group.describe()} pending" for group in groups]
    return "; ".join(parts)
