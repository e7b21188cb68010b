"""The job dir of one cluster on the cluster's filesystem: the only place that knows its layout.

``job.sbatch``, ``bootstrap/`` (the bootstrap package), ``bootstrap.json`` (its settings),
``ray_token`` (0600), ``lease`` (rewritten by the owner), ``detached`` (marker),
``events.jsonl`` and ``connection.json`` (written by the bootstrap), ``slurm-<job>.out|err`` and
``logs/ray-{head,worker}-<host>.log``. The directory itself is 0700.
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
from typing import Any

from .errors import SlurmRayError
from .shipping import bootstrap_files
from .spec import ClusterSpec
from .transport import Transport

EVENTS = "events.jsonl"
CONNECTION = "connection.json"
TOKEN = "ray_token"
LEASE = "lease"
DETACHED = "detached"


class JobDir:
    """Reads and writes the files of one cluster's job dir through a Transport."""

    def __init__(self, transport: Transport, path: str) -> None:
        self.transport = transport
        self.path = path.rstrip("/")

    def file(self, name: str) -> str:
        return f"{self.path}/{name}"

    def bootstrap_command(self, python: str) -> list[str]:
        """The job's command: the shipped bootstrap package run as a directory."""
        return [python, self.file("bootstrap"), "head", self.path]

    async def prepare(self, spec: ClusterSpec, cluster_id: str) -> None:
        """Create the directory with the bootstrap, its settings and a fresh Ray token.

        One command whatever the transport (one round trip over SSH)."""
        files = {f"bootstrap/{name}": text for name, text in bootstrap_files().items()}
        files["bootstrap.json"] = json.dumps(bootstrap_settings(spec, cluster_id), indent=1)
        files[TOKEN] = secrets.token_urlsafe(32) + "\n"
        files["logs/.keep"] = ""
        await self.transport.write_files(self.path, files)

    async def write_lease(self, content: str) -> None:
        await self.transport.write_file(self.file(LEASE), content, 0o600)

    async def mark_detached(self, content: str) -> None:
        await self.transport.write_file(self.file(DETACHED), content, 0o600)

    async def read_events(self, offset: int) -> tuple[list[dict[str, Any]], int]:
        """Events appended since ``offset`` (whole lines only) and the new offset."""
        text, offset = await self.transport.read_from(self.file(EVENTS), offset)
        return parse_events(text), offset

    async def read_connection(self) -> str:
        return await self.transport.read_file(self.file(CONNECTION))

    async def read_token(self) -> str:
        return (await self.transport.read_file(self.file(TOKEN))).strip()

    async def logs(self, job_id: str | None, node: str | None = None, tail: int = 100) -> str:
        """The job's output (``node=None``) or one node's Ray log, last ``tail`` lines each."""
        if node is not None:
            if not re.fullmatch(r"[A-Za-z0-9_.-]+", node):
                raise SlurmRayError(f"node: {node!r} is not a host name")
            names = [f"logs/ray-head-{node}.log", f"logs/ray-worker-{node}.log"]
        else:
            names = [f"slurm-{job_id}.out", f"slurm-{job_id}.err"] if job_id else []
        parts = []
        for name in names:
            text = await self.transport.tail(self.file(name), tail)
            if text:
                parts.append(f"==> {name} <==\n{text.rstrip()}")
        return "\n".join(parts)


def bootstrap_settings(spec: ClusterSpec, cluster_id: str) -> dict[str, Any]:
    """``bootstrap.json``: what the bootstrap needs from the spec."""
    return {
        "cluster_id": cluster_id,
        "nodes": spec.nodes,
        "port_strategy": spec.port_strategy,
        "port_range": list(spec.port_range),
        "fixed_port_base": spec.fixed_port_base,
        "worker_ports": spec.worker_ports,
        "network_interface": spec.network_interface,
        "node_ip_address_command": spec.node_ip_address_command,
        "ray_start_args": list(spec.ray_start_args),
        "env": dict(spec.env),
        "object_store_memory": spec.object_store_memory,
        "idle_timeout": spec.idle_timeout,
        "start_timeout": spec.start_timeout,
        "lock_dir": None,
    }


def parse_events(text: str) -> list[dict[str, Any]]:
    """One JSON object per line; a torn or foreign line is skipped, not fatal."""
    events = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if isinstance(event, dict):
                events.append(event)
    return events
