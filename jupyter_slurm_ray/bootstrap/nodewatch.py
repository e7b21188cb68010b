"""Which nodes of the cluster are alive: joins, losses and rejoins, told as events."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jsr_wire import Event

Emit = Callable[..., None]  # EventLog.emit(event, **fields)


class NodeWatch:
    """The alive node set the head sees, and the `nodes` / `node_lost` events it changes into.

    `nodes` (joined, wanted, hosts) follows every change of the alive set; `node_lost`
    (hosts, reason, joined, wanted, log) names each host that left; a host that comes back
    and leaves again is reported again.
    """

    def __init__(self, wanted: int, emit: Emit, logs: Callable[[list[str]], list[str]]) -> None:
        self.wanted = wanted
        self.emit = emit
        self.logs = logs  # hosts -> log lines explaining a loss
        self.hosts: dict[str, str] = {}  # ip -> host name
        self.joined: list[str] = []  # alive ips, sorted
        self.lost: set[str] = set()  # host names reported lost and not back
        self.leaving: set[str] = set()  # hosts of worker jobs leaving on purpose (scaled in)

    def host(self, ip: str) -> str:
        return self.hosts.get(ip, ip)

    def names(self, ips: list[str]) -> list[str]:
        return sorted(self.host(ip) for ip in ips)

    def note(self, alive: list[str]) -> None:
        """A new alive set (ips): a `nodes` event if it changed."""
        if sorted(alive) != self.joined:
            came = set(alive) - set(self.joined)
            self.joined = sorted(alive)
            self.lost -= set(self.names(sorted(came)))  # back again: a later loss counts
            self.emit(Event.NODES, **self.counts())

    def counts(self) -> dict[str, Any]:
        return {"joined": len(self.joined), "wanted": self.wanted, "hosts": self.names(self.joined)}

    def check_lost(self, alive: list[str]) -> None:
        """After ready: every host that left and was not reported yet becomes a node_lost."""
        left = self.names(sorted(set(self.joined) - set(alive)))
        hosts = [h for h in left if h not in self.lost and h not in self.leaving]
        self.note(alive)
        if hosts:
            reason = f"{len(hosts)} node(s) left the cluster: {', '.join(hosts)}"
            self.report_lost(hosts, reason)

    def report_lost(self, hosts: list[str], reason: str) -> None:
        self.lost.update(hosts)
        left = len([ip for ip in self.joined if self.host(ip) not in self.lost])
        joined = {"joined": left, "wanted": self.wanted}  # the state API may not know yet
        self.emit(Event.NODE_LOST, reason=reason, hosts=hosts, log=self.logs(hosts), **joined)

    def missing(self) -> list[str]:
        """Hosts known (from their events) that have not joined."""
        return sorted(set(self.hosts.values()) - set(self.names(self.joined)))
