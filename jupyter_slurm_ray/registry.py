"""On-disk records of clusters, one JSON file each, shared by kernels, the CLI and the server.

Records live in a per-user state directory (mode 0700) and are written atomically (a temporary
file in the same directory, then ``os.replace``), so a reader never sees half a record; every
write holds the registry's lock (``records.lock`` in the state dir), so that no other process
writes between the read and the write of :meth:`Registry.update`.

A record names its owner (``owner_host``, ``owner_pid``, ``owner_started``, ``owner_term``) and
its observers; only the owner writes the owner's fields and the cluster's state, an observer
only its own entry in ``observers`` (see ``ownership.py``).

Records are data, never code: a record only names the target it needs (see ``targets.py``).
A directory or file that another user owns or could write is refused, and a record that cannot
be read (truncated JSON, wrong shape, unknown state) becomes an :class:`Unreadable` entry that
every reader shows, never an exception.
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import json
import logging
import os
import socket
import stat
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from .bootstrap.jsr_wire import TLS_CA_CERT, TLS_CLIENT_CERT, TLS_CLIENT_KEY, TlsFiles
from .errors import RegistryError, SlurmRayError
from .files import write_atomic
from .naming import CLUSTER_ID_ALLOWED, JOB_ID, JOB_ID_ALLOWED, is_cluster_id, target_name
from .owner import ProcessIdentity, this_process
from .states import FINAL, State

log = logging.getLogger(__name__)

RECORD_STATES = frozenset(state.value for state in State)
FINAL_RECORD_STATES = frozenset(state.value for state in FINAL)
MAX_RECORD_BYTES = 1 << 20


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
    target: str  # the name of where Slurm commands run (Transport.target)
    job_dir: str
    job_id: str | None = None
    state: str = "SUBMITTING"
    reason: str | None = None
    phase: str | None = None
    nodes_wanted: int = 1
    nodes_joined: int = 0
    nodes_lost: list[str] = field(default_factory=list)
    gpus_per_node: int = 0
    time_limit: int | None = None
    time_left: int | None = None
    slurm_unreachable_since: float | None = None
    head_ip: str | None = None
    client_port: int | None = None
    dashboard_port: int | None = None
    forwards: dict[str, int] = field(default_factory=dict)  # "client"/"dashboard" -> local port
    owner_pid: int = field(default_factory=os.getpid)
    owner_host: str = field(default_factory=socket.gethostname)
    owner_started: str | None = field(default_factory=lambda: this_process().started)
    owner_term: int = 0  # one more at every change of owner (ownership.py)
    # the processes that watch the cluster without owning it: {"host", "pid", "started"}
    observers: list[dict[str, Any]] = field(default_factory=list)
    owner: str = field(default_factory=getpass.getuser)  # the user
    detached: bool = False
    # the extra worker jobs (scaling.WorkerJob as dicts: job_id, state, reason, host, ...)
    worker_jobs: list[dict[str, Any]] = field(default_factory=list)
    # the last scaling decisions with their cause (adapt's settings first while it runs)
    scaling: list[str] = field(default_factory=list)
    # adapt's settings while the owner adapts (AdaptSettings.to_dict: minimum, maximum,
    # idle_timeout, max_pending, group), None otherwise: what other processes read
    adapting: dict[str, Any] | None = None
    # how the connected kernel connects ("driver" or "client") and why (client/mode.py)
    connect_mode: str | None = None
    connect_reason: str | None = None
    spec: dict[str, Any] = field(default_factory=dict)  # ClusterSpec.to_dict()
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ClusterRecord:
        """A record from parsed JSON; RegistryError naming the field when the shape is wrong.

        Fields of newer versions are ignored; a missing optional field takes its default.
        """
        if not isinstance(data, Mapping):
            raise RegistryError("not a JSON object")
        known = {f.name: f for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        for name in ("id", "name", "target", "job_dir"):
            if name not in values:
                raise RegistryError(f"the field {name!r} is missing")
        for name, unknown in _OWNER_UNKNOWN.items():  # never the reader's own identity
            values.setdefault(name, unknown)
        if isinstance(values.get("target"), Mapping):  # written by an older version
            values["target"] = target_name(values["target"])
        for name, value in values.items():
            _check_field(name, value)
        return cls(**values)

    @property
    def is_final(self) -> bool:
        return self.state in FINAL_RECORD_STATES

    @property
    def owner_process(self) -> ProcessIdentity:
        return ProcessIdentity(self.owner_host, self.owner_pid, self.owner_started)

    @property
    def owner_alive(self) -> bool:
        """False only when the owning process is known to be gone (same host, pid dead or
        reused); True when it runs or cannot be judged from here (another host)."""
        return self.owner_process.alive is not False

    @property
    def owner_gone(self) -> bool:
        """The owning process is known to be gone (it ran on this host and is not there)."""
        return self.owner_process.alive is False

    @property
    def observer_processes(self) -> list[ProcessIdentity]:
        """The observers, without those known to be gone."""
        found = (ProcessIdentity.from_dict(entry) for entry in self.observers)
        return [p for p in found if p is not None and p.alive is not False]

    def set_owner(self, process: ProcessIdentity, term: int) -> None:
        """Name ``process`` the owner (in ``term``); it is no longer among the observers."""
        self.owner_host, self.owner_pid, self.owner_started = (
            process.host,
            process.pid,
            process.started,
        )
        self.owner_term = term
        self.set_observer(process, False)

    def set_observer(self, process: ProcessIdentity, observing: bool) -> None:
        """Add or remove ``process`` among the observers (and forget those known gone)."""
        kept = [p for p in self.observer_processes if not p.same_as(process)]
        if observing:
            kept.append(process)
        self.observers = [p.to_dict() for p in kept]


# A record read without its owner's identity has an owner that cannot be judged (a remote
# one), not the defaults of a new record: those name the process reading it.
_OWNER_UNKNOWN: dict[str, Any] = {"owner_host": "", "owner_pid": 0, "owner_started": None}
_OPTIONAL_STR = (str, type(None))
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "id": (str,),
    "name": (str,),
    "target": (str,),
    "job_dir": (str,),
    "job_id": _OPTIONAL_STR,
    "state": (str,),
    "reason": _OPTIONAL_STR,
    "phase": _OPTIONAL_STR,
    "nodes_wanted": (int,),
    "nodes_joined": (int,),
    "nodes_lost": (list,),
    "gpus_per_node": (int,),
    "time_limit": (int, type(None)),
    "time_left": (int, type(None)),
    "slurm_unreachable_since": (int, float, type(None)),
    "head_ip": _OPTIONAL_STR,
    "client_port": (int, type(None)),
    "dashboard_port": (int, type(None)),
    "forwards": (dict,),
    "owner_pid": (int,),
    "owner_host": (str,),
    "owner_started": _OPTIONAL_STR,
    "owner_term": (int,),
    "observers": (list,),
    "owner": (str,),
    "detached": (bool,),
    "worker_jobs": (list,),
    "scaling": (list,),
    "adapting": (dict, type(None)),
    "connect_mode": _OPTIONAL_STR,
    "connect_reason": _OPTIONAL_STR,
    "spec": (dict,),
    "created_at": (int, float),
    "updated_at": (int, float),
}


def _check_field(name: str, value: Any) -> None:
    allowed = _FIELD_TYPES[name]
    wrong_bool = isinstance(value, bool) and bool not in allowed
    if wrong_bool or not isinstance(value, allowed):
        raise RegistryError(f"the field {name!r} has the wrong type ({type(value).__name__})")
    if name == "id" and not is_cluster_id(value):
        raise RegistryError(f"the id {value!r} is not {CLUSTER_ID_ALLOWED}")
    if name == "state" and value not in RECORD_STATES:
        raise RegistryError(f"unknown state {value!r}")
    if name == "job_id" and isinstance(value, str) and not JOB_ID.fullmatch(value):
        raise RegistryError(f"the job id {value!r} is not {JOB_ID_ALLOWED}")
    if name in ("nodes_lost", "worker_jobs", "scaling", "observers") and isinstance(value, list):
        _check_list(name, value)
    if (
        isinstance(value, dict)
        and name == "forwards"
        and not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
            for k, v in value.items()
        )
    ):
        raise RegistryError("the field 'forwards' is not a mapping of names to ports")


def _check_list(name: str, value: list[Any]) -> None:
    if name == "nodes_lost" and not all(isinstance(host, str) for host in value):
        raise RegistryError("the field 'nodes_lost' is not a list of host names")
    if name == "scaling" and not all(isinstance(line, str) for line in value):
        raise RegistryError("the field 'scaling' is not a list of lines")
    if name == "observers" and not all(ProcessIdentity.from_dict(p) for p in value):
        raise RegistryError("the field 'observers' is not a list of processes (host, pid)")
    if name == "worker_jobs" and not all(
        isinstance(job, dict) and isinstance(job.get("job_id"), str) and job["job_id"].isdigit()
        for job in value
    ):
        raise RegistryError("the field 'worker_jobs' is not a list of worker jobs with job ids")


@dataclass(frozen=True)
class Unreadable:
    """A record file (or the registry itself) that could not be trusted or read."""

    id: str  # the file's stem, or "(registry)" for the directory
    error: str


def _untrusted(info: os.stat_result, what: str) -> str | None:
    """Why a file or directory must not be trusted, or None."""
    if info.st_uid != os.getuid():
        return f"{what} is owned by uid {info.st_uid}, not by this user ({os.getuid()})"
    if stat.S_IMODE(info.st_mode) & 0o022:
        mode = oct(stat.S_IMODE(info.st_mode))
        return f"{what} is writable by other users (mode {mode}); chmod go-w it"
    return None


class Registry:
    """The directory of cluster records (``<state dir>/clusters``) and local token copies."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else default_state_dir()

    # -- the directories ---------------------------------------------------------------------
    def _dirs(self) -> tuple[Path, Path, Path]:
        return self.path, self.path / "clusters", self.path / "tokens"

    def _ensure_dirs(self) -> Path:
        """Create the directories 0700 if missing; RegistryError if one is not trustworthy."""
        for directory in self._dirs():
            with contextlib.suppress(FileExistsError):
                directory.mkdir(mode=0o700, parents=True)
        problem = self.problem()
        if problem:
            raise RegistryError(problem)
        return self.path / "clusters"

    def problem(self) -> str | None:
        """Why the registry's directories must not be trusted, or None (also when missing)."""
        for directory in self._dirs():
            try:
                info = os.lstat(directory)
            except FileNotFoundError:
                continue
            if not stat.S_ISDIR(info.st_mode):
                return f"the registry path {directory} is not a directory"
            why = _untrusted(info, f"the registry directory {directory}")
            if why:
                return why
        return None

    def record_path(self, cluster_id: str) -> Path:
        """Where the record of ``cluster_id`` is (SlurmRayError for an invalid id)."""
        return self._file(cluster_id)

    def _file(self, cluster_id: str) -> Path:
        if not is_cluster_id(cluster_id):
            raise SlurmRayError(f"not a cluster id: {cluster_id!r} ({CLUSTER_ID_ALLOWED})")
        return self.path / "clusters" / f"{cluster_id}.json"

    # -- records -----------------------------------------------------------------------------
    def save(self, record: ClusterRecord, *, create: bool = True) -> bool:
        """Write ``record``; with ``create=False`` only over an existing record, so an
        update never brings back a record someone forgot meanwhile. True when written."""
        return self.update(record.id, lambda _: record, create=create) is not None

    def update(
        self,
        cluster_id: str,
        change: Callable[[ClusterRecord | None], ClusterRecord | None],
        *,
        create: bool = False,
    ) -> ClusterRecord | None:
        """Read, change and write one record under the registry's lock, so that no other
        process writes between the read and the write. ``change`` gets the record on disk
        (None when there is none, or it cannot be read) and returns the record to write, or
        None to write nothing. Without ``create``, nothing is written where no record is (a
        record someone forgot stays forgotten). Returns what was written."""
        path = self._file(cluster_id)
        if not create and not path.exists():
            return None
        self._ensure_dirs()
        with self._locked():
            if not create and not path.exists():
                return None
            try:
                current = self.load(cluster_id)
            except RegistryError as exc:
                log.warning("replacing the unreadable record %s: %s", cluster_id, exc)
                current = None
            record = change(current)
            if record is None:
                return None
            record.updated_at = time.time()
            write_atomic(path, record.to_json(), 0o600)
            return record

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """The registry's lock (an flock on ``records.lock``), held for one write."""
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(self.path / "records.lock", flags, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def load(self, cluster_id: str) -> ClusterRecord | None:
        """The record, None when there is none; RegistryError when it cannot be trusted/read."""
        path = self._file(cluster_id)
        problem = self.problem()
        if problem:
            raise RegistryError(problem)
        try:
            text = _read_private(path)
        except FileNotFoundError:
            return None
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise RegistryError(f"not valid JSON ({exc})") from None
        record = ClusterRecord.from_dict(data)
        if record.id != cluster_id:
            raise RegistryError(f"the record's id {record.id!r} is not its file name's")
        return record

    def scan(self) -> tuple[list[ClusterRecord], list[Unreadable]]:
        """Every record, oldest first, and every file that could not be read (with why)."""
        problem = self.problem()
        if problem:
            log.warning("not reading cluster records: %s", problem)
            return [], [Unreadable("(registry)", problem)]
        records, unreadable = [], []
        for cluster_id in self._ids():
            try:
                record = self.load(cluster_id)
            except (RegistryError, OSError) as exc:
                log.warning("unreadable cluster record %s: %s", cluster_id, exc)
                unreadable.append(Unreadable(cluster_id, str(exc)))
                continue
            if record is not None:
                records.append(record)
        return sorted(records, key=lambda r: r.created_at), unreadable

    def _ids(self) -> Iterator[str]:
        clusters = self.path / "clusters"
        if not clusters.is_dir():
            return
        for path in sorted(clusters.glob("*.json")):
            if is_cluster_id(path.stem):
                yield path.stem

    def all(self) -> list[ClusterRecord]:
        """The readable records, oldest first (see :meth:`scan` for the others)."""
        return self.scan()[0]

    def find(self, key: str) -> ClusterRecord | None:
        """A record by id, by job id or by name (the newest of that name)."""
        matches = [r for r in self.all() if key in (r.id, r.job_id, r.name)]
        return matches[-1] if matches else None

    def delete(self, cluster_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._file(cluster_id).unlink()
        tls = self.tls_copy(cluster_id)
        for secret in (self.token_path(cluster_id), tls.cert, tls.key, tls.ca):
            with contextlib.suppress(FileNotFoundError):
                secret.unlink()

    def prune(self, retention: float, now: float | None = None) -> list[str]:
        """Delete the records of clusters that ended more than ``retention`` seconds ago."""
        now = time.time() if now is None else now
        pruned = []
        for record in self.all():
            if record.is_final and now - record.updated_at > retention:
                self.delete(record.id)
                pruned.append(record.id)
        if pruned:
            log.info("forgot %d ended cluster(s): %s", len(pruned), ", ".join(pruned))
        return pruned

    # -- tokens ------------------------------------------------------------------------------
    def token_path(self, cluster_id: str) -> Path:
        self._file(cluster_id)  # validates the id
        return self.path / "tokens" / cluster_id

    def store_token(self, cluster_id: str, token: str) -> Path:
        self._ensure_dirs()
        path = self.token_path(cluster_id)
        write_atomic(path, token, 0o600)
        return path

    def tls_copy(self, cluster_id: str) -> TlsFiles:
        """Where this process keeps its private copy of a cluster's CA and client certificate."""
        base = self.token_path(cluster_id)
        return TlsFiles(
            base.with_name(f"{cluster_id}.{TLS_CLIENT_CERT}"),
            base.with_name(f"{cluster_id}.{TLS_CLIENT_KEY}"),
            base.with_name(f"{cluster_id}.{TLS_CA_CERT}"),
        )

    def store_tls(self, cluster_id: str, cert: str, key: str, ca: str) -> TlsFiles:
        """This process's private copies (0600) of a cluster's CA and client certificate."""
        self._ensure_dirs()
        copy = self.tls_copy(cluster_id)
        for path, text in ((copy.cert, cert), (copy.key, key), (copy.ca, ca)):
            write_atomic(path, text, 0o600)
        return copy

    def read_token(self, cluster_id: str) -> str | None:
        """This process's copy of a cluster's token, if it has one it can trust."""
        try:
            return _read_private(self.token_path(cluster_id)).strip() or None
        except (FileNotFoundError, RegistryError):
            return None


def _read_private(path: Path) -> str:
    """A file's text, only if it is a regular file of this user that others cannot write."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise RegistryError(f"cannot open {path.name}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise RegistryError(f"{path.name} is not a regular file")
        why = _untrusted(info, path.name)
        if why:
            raise RegistryError(why)
        data = handle.read(MAX_RECORD_BYTES + 1)
    if len(data) > MAX_RECORD_BYTES:
        raise RegistryError(f"{path.name} is larger than {MAX_RECORD_BYTES} bytes")
    return data.decode("utf-8", errors="replace")
