"""Which nodes of the cluster are alive: joins, losses and rejoins by Ray node id, told as
events and in ``nodes.json`` (the workers read there whether they joined)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dashapi import AliveNode
from jsr_wire import Event

Emit = Callable[..., None]  # EventLog.emit(event, **fields)


class NodeWatch:
    """The alive node set the head sees, and the `nodes` / `node_lost` events it changes into.

    Nodes are told apart by their Ray node id: two nodes of the cluster may share a host (a
    worker job on the head's node). `nodes` (joined, wanted, hosts, node_ids) follows every
    change of the alive set; `node_lost` (hosts, node_ids, reason, joined, wanted, log) names
    each node that left; a node that comes back and leaves again is reported again.
    """

    def __init__(self, wanted: int, emit: Emit, logs: Callable[[list[str]], list[str]]) -> None:
        self.wanted = wanted
        self.emit = emit
        self.logs = logs  # hosts -> log lines explaining a loss
        self.hosts: dict[str, str] = {}  # ip -> host name
        self.alive: dict[str, str] = {}  # node id -> ip, alive now
        self.known: dict[str, str] = {}  # node id -> ip, every node seen
        self.lost: set[str] = set()  # node ids reported lost and not back
        self.leaving: set[str] = set()  # node ids of worker jobs leaving on purpose (scaled in)

    def host(self, ip: str) -> str:
        return self.hosts.get(ip, ip)

    def names(self, node_ids: list[str]) -> list[str]:
        return sorted(self.host(self.known.get(node, node)) for node in node_ids)

    @property
    def joined(self) -> list[AliveNode]:
        return sorted(AliveNode(ip, node) for node, ip in self.alive.items())

    def note(self, alive: list[AliveNode]) -> bool:
        """A new alive set: a `nodes` event if it changed (True then)."""
        now = {node.node_id: node.ip for node in alive}
        if now == self.alive:
            return False
        came = set(now) - set(self.alive)
        self.alive = now
        self.known.update(now)
        self.lost -= came  # back again: a later loss counts
        self.emit(Event.NODES, **self.counts())
        return True

    def counts(self) -> dict[str, Any]:
        ids = sorted(self.alive)
        return {
            "joined": len(ids),
            "wanted": self.wanted,
            "hosts": self.names(ids),
            "node_ids": ids,
        }

    def check_lost(self, alive: list[AliveNode]) -> bool:
        """After ready: every node that left and was not reported yet becomes a node_lost.
        True when the alive set changed."""
        now = {node.node_id for node in alive}
        left = sorted(set(self.alive) - now - self.lost - self.leaving)
        changed = self.note(alive)
        if left:
            hosts = self.names(left)
            reason = f"{len(left)} node(s) left the cluster: {', '.join(hosts)}"
            self.report_lost(left, reason)
        return changed

    def report_lost(self, node_ids: list[str], reason: str, hosts: list[str] | None = None) -> None:
        self.lost.update(node_ids)
        hosts = hosts if hosts is not None else self.names(node_ids)
        left = len([node for node in self.alive if node not in self.lost])
        joined = {"joined": left, "wanted": self.wanted}  # the state API may not know yet
        self.emit(
            Event.NODE_LOST,
            reason=reason,
            hosts=hosts,
            node_ids=sorted(node_ids),
            log=self.logs(hosts),
            **joined,
        )

    def report_lost_hosts(self, hosts: list[str], reason: str) -> None:
        """The nodes on ``hosts`` are gone (their step ended), whatever the state API says."""
        on_hosts = [node for node, ip in self.alive.items() if self.host(ip) in hosts]
        self.report_lost(sorted(set(on_hosts) - self.lost), reason, hosts=sorted(hosts))

    def lost_hosts(self) -> set[str]:
        return set(self.names(sorted(self.lost)))

    def missing(self) -> list[str]:
        """Hosts known (from their events) that have not joined."""
        joined = {self.host(ip) for ip in self.alive.values()}
        return sorted(set(self.hosts.values()) - joined)
