"""On-disk records of clusters, one JSON file each, shared by kernels, the CLI and the server.

Records live in a per-user state directory (mode 0700) and are written atomically (a temporary
file in the same directory, then ``os.replace``), so a reader never sees half a record.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import logging
import os
import re
import socket
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from .errors import SlurmRayError

log = logging.getLogger(__name__)

_ID = re.compile(r"^[a-z0-9][a-z0-9-]{3,63}$")


def default_state_dir() -> Path:
    """``$JUPYTER_SLURM_RAY_STATE_DIR``, else ``<jupyter data dir>/slurm_ray``."""
    override = os.environ.get("JUPYTER_SLURM_RAY_STATE_DIR")
    if override:
        return Path(override)
    try:
        from jupyter_core.paths import jupyter_data_dir

        return Path(jupyter_data_dir()) / "slurm_ray"
    except ImportError:  # pragma: no cover - jupyter_core comes with our dependencies
        return Path.home() / ".local" / "share" / "jupyter" / "slurm_ray"


@dataclass
class ClusterRecord:
    """Everything another process needs to find, show, reconnect to or stop a cluster."""

    id: str
    name: str
    target: dict[str, Any]  # how to reach the cluster side: {"kind": "local"|"ssh", ...}
    job_dir: str
    job_id: str | None = None
    state: str = "SUBMITTING"
    reason: str | None = None
    phase: str | None = None
    nodes_wanted: int = 1
    nodes_joined: int = 0
    gpus_per_node: int = 0
    time_limit: int | None = None
    time_left: int | None = None
    head_ip: str | None = None
    client_port: int | None = None
    dashboard_port: int | None = None
    forwards: dict[str, int] = field(default_factory=dict)  # "client"/"dashboard" -> local port
    owner_pid: int = field(default_factory=os.getpid)
    owner_host: str = field(default_factory=socket.gethostname)
    owner: str = field(default_factory=getpass.getuser)
    detached: bool = False
    spec: dict[str, Any] = field(default_factory=dict)  # ClusterSpec.to_dict()
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ClusterRecord:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    @property
    def owner_alive(self) -> bool:
        """Is the owning process still running (only knowable on the same host)?"""
        if self.owner_host != socket.gethostname():
            return True
        try:
            os.kill(self.owner_pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return _not_zombie(self.owner_pid)


def _not_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


class Registry:
    """The directory of cluster records."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else default_state_dir()

    def _ensure_dir(self) -> Path:
        clusters = self.path / "clusters"
        for d in (self.path, clusters, self.path / "tokens"):
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(d, 0o700)
        return clusters

    def _file(self, cluster_id: str) -> Path:
        if not _ID.match(cluster_id):
            raise SlurmRayError(f"not a cluster id: {cluster_id!r}")
        return self.path / "clusters" / f"{cluster_id}.json"

    def save(self, record: ClusterRecord) -> None:
        record.updated_at = time.time()
        clusters = self._ensure_dir()
        write_atomic(clusters / f"{record.id}.json", record.to_json(), 0o600)

    def load(self, cluster_id: str) -> ClusterRecord | None:
        try:
            data = json.loads(self._file(cluster_id).read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("unreadable cluster record %s: %s", cluster_id, exc)
            return None
        return ClusterRecord.from_dict(data)

    def __iter__(self) -> Iterator[ClusterRecord]:
        clusters = self.path / "clusters"
        if not clusters.is_dir():
            return
        for path in sorted(clusters.glob("*.json")):
            record = self.load(path.stem)
            if record is not None:
                yield record

    def all(self) -> list[ClusterRecord]:
        return sorted(self, key=lambda r: r.created_at)

    def find(self, key: str) -> ClusterRecord | None:
        """A record by id, by job id or by name (the newest of that name)."""
        matches = [r for r in self.all() if key in (r.id, r.job_id, r.name)]
        return matches[-1] if matches else None

    def delete(self, cluster_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._file(cluster_id).unlink()
        with contextlib.suppress(FileNotFoundError):
            self.token_path(cluster_id).unlink()

    def token_path(self, cluster_id: str) -> Path:
        self._file(cluster_id)  # validates the id
        return self.path / "tokens" / cluster_id

    def store_token(self, cluster_id: str, token: str) -> Path:
        self._ensure_dir()
        path = self.token_path(cluster_id)
        write_atomic(path, token, 0o600)
        return path


def write_atomic(path: Path, text: str, mode: int) -> None:
    """Write ``text`` to ``path`` so readers see the old or the new file, never a mix."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
