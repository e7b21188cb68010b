"""The words the client and the bootstrap exchange, declared once: the job dir's files, the
program's command line, the variables of the job's environment, ``bootstrap.json``'s settings
(names, values allowed, defaults), the Ray resources of a node, and the events of
``events.jsonl`` (names, phases, roles) with the driver's line to its kernel.

Standard library only, importing no other bootstrap module: the bootstrap imports it top-level
from the job dir (``from jsr_wire import …``), the package as
``jupyter_slurm_ray.bootstrap.jsr_wire``. ``__main__.HELP`` tells what each word means.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

# ----------------------------------------------------------------------------- the job dir

PROGRAM_DIR = "bootstrap"  # this program, run as ``python JOB_DIR/bootstrap RUN JOB_DIR``
SITE_PATH = "sitepath"  # its subdirectory first on the PYTHONPATH of Ray's processes
SETTINGS_FILE = "bootstrap.json"  # Settings, written by the client
TOKEN_FILE = "ray_token"  # the cluster's Ray token (RAY_AUTH_TOKEN_PATH)
LEASE_FILE = "lease"  # rewritten by the owner
DETACHED_FILE = "detached"  # present: the lease does not apply
EVENTS_FILE = "events.jsonl"  # one JSON object per line (Event)
HEAD_FILE = "head.json"  # the head's address and ports, for the workers
CONNECTION_FILE = "connection.json"  # what a client needs to connect
PACK_FILE = "env-pack"  # the environment pack's archive and hash, for the worker jobs
NODES_FILE = "nodes.json"  # the nodes the head sees alive (Ray node ids), for the workers
LOGS_DIR = "logs"
# Ray's TLS (setting tls): the cluster's CA and the clients' certificate, in TLS_DIR
TLS_DIR = "tls"
TLS_CA_CERT = "ca.crt"
TLS_CA_KEY = "ca.key"  # never read by a client
TLS_CLIENT_CERT = "client.crt"
TLS_CLIENT_KEY = "client.key"
TLS_VARIABLES = ("RAY_USE_TLS", "RAY_TLS_SERVER_CERT", "RAY_TLS_SERVER_KEY", "RAY_TLS_CA_CERT")


@dataclass(frozen=True)
class TlsFiles:
    """A certificate, its key and the CA that signed it: what Ray's TLS variables name (a
    node's, for its Ray; the clients', for a kernel's Ray Client)."""

    cert: Path
    key: Path
    ca: Path

    def environment(self) -> dict[str, str]:
        """Ray's TLS on, for every process started with this environment (Ray's C++ reads
        them as RayConfig's USE_TLS, TLS_SERVER_CERT, …; its Python, when a channel opens)."""
        values = ("1", str(self.cert), str(self.key), str(self.ca))
        return dict(zip(TLS_VARIABLES, values, strict=True))


def drain_file(job_id: str) -> str:
    """The file by which the owner asks worker job ``job_id`` to drain (holds the timeout)."""
    return f"drain-{job_id}"


def ray_log(role: str, host: str) -> str:
    """The name (in LOGS_DIR) of the Ray log of a node of ``role`` (Role) on ``host``."""
    return f"ray-{role}-{host}.log"


class Run:
    """What ``python JOB_DIR/bootstrap RUN JOB_DIR`` runs."""

    HEAD = "head"  # the job's batch step on its first node
    WORKER = "worker"  # a task of the head's worker step
    WORKER_JOB = "workerjob"  # a worker job's batch step
    DRIVER = "driver"  # a notebook kernel's host, as the kernel's child


# ----------------------------------------------------------------------------- the environment

JOB_ID_VARIABLE = "JSR_JOB_ID"  # mode 'here': the id of the cluster's steps (not SLURM_JOB_ID)
LOCAL_MODE_VARIABLE = "JSR_LOCAL_MODE"  # "1": local mode (no srun, no scontrol)
PACK_VARIABLE = "JSR_ENV_PACK"  # the environment pack's archive
PACK_SHA256_VARIABLE = "JSR_ENV_PACK_SHA256"  # ... and the sha256 its content must have
GROUP_VARIABLE = "JSR_WORKER_GROUP"  # a worker job's group (its node's Ray resource)
METRICS_VARIABLE = "JSR_RAY_METRICS"  # "0" in Ray's processes: its Prometheus servers stay off

# ----------------------------------------------------------------------------- Ray resources

NODE_RESOURCE = "slurm_ray_node"  # every node of the cluster's jobs (not a driver's)


def group_resource(group: str) -> str:
    """The Ray resource of the nodes of worker group ``group``."""
    return f"group:{group}"


# ----------------------------------------------------------------------------- memory

# What one node's Ray needs in its job beside its object store (MiB): measured in the job's
# memory cgroup on Slurm 24.11 with Ray 2.60 (a head with 1 CPU: 810-850 after its start and a
# few tasks, 2 CPUs: 860-910; a worker node: 270-360). A site that enforces memory kills a job
# that goes over its request: a request below this is refused before it is submitted
# (slurm/memorypolicy.py), and the object store is sized within what is left.
HEAD_RAY_MB = 860
WORKER_RAY_MB = 400
PER_CPU_RAY_MB = 60  # a worker process per CPU once tasks run
MIN_OBJECT_STORE_MB = 80  # Ray's own minimum (78 MB), rounded up
MAX_DEFAULT_OBJECT_STORE_MB = 2048
OBJECT_STORE_SHARE = 0.3  # of the job's memory on the node, when object_store_memory is unset


def ray_memory_mb(head: bool, cpus: int) -> int:
    """What the node's Ray processes need (MiB), its object store apart."""
    return (HEAD_RAY_MB if head else WORKER_RAY_MB) + PER_CPU_RAY_MB * max(1, cpus)


def default_object_store_mb(job_mb: int, ray_mb: int) -> int:
    """The object store when it is not set: 30 % of the job's memory on the node, within
    80 MiB..2 GiB and within what Ray's processes leave of it."""
    share = int(job_mb * OBJECT_STORE_SHARE)
    left = job_mb - ray_mb
    return max(MIN_OBJECT_STORE_MB, min(share, MAX_DEFAULT_OBJECT_STORE_MB, left))


# ----------------------------------------------------------------------------- bootstrap.json

# 'kernel': every port taken where Ray binds it (no range); the others: a block of port_range
PORT_STRATEGIES = ("kernel", "random", "fixed", "hash_jobid")
CONTAINER_RUNTIMES = ("apptainer", "singularity", "charliecloud")  # in the order 'auto' tries
# The ports of a node's block, in order; the worker ports follow (Ray's GCS and agents take
# kernel-assigned ports).
PORT_NAMES = (
    "node_manager",
    "object_manager",
    "client",
    "dashboard",
    "autoscaler_metrics",
    "dashboard_metrics",
)


@dataclass
class Settings:
    """``bootstrap.json``: what the bootstrap needs of the cluster's settings. The client
    writes every field (``job/directory.py``); ``ClusterSpec`` takes these defaults for its
    settings of the same name, so a file written by hand means what the client would write."""

    cluster_id: str
    nodes: int = 1
    port_strategy: str = "kernel"  # one of PORT_STRATEGIES
    port_range: tuple[int, int] = (20000, 29999)
    fixed_port_base: int | None = None
    worker_ports: int = 64
    network_interface: str | None = None
    node_ip_address_command: str | None = None
    ray_start_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    object_store_memory: int | None = None
    owner_timeout: float = 300.0  # s the owner's lease counts; then the cluster stops itself
    start_timeout: float = 300.0
    lock_dir: str | None = None  # ClusterSpec.port_lock_dir
    container: str | None = None  # image Ray runs in
    container_runtime: str = "auto"  # 'auto' or one of CONTAINER_RUNTIMES
    # mode 'here' (steps of the kernel's own allocation): its nodes, the head first (the
    # worker step runs on the others); empty: a job of its own (every other node of the job)
    here_hosts: list[str] = field(default_factory=list)
    cpus_per_node: int | None = None  # mode 'here': each step's CPUs
    here_kernel_tasks: bool = True  # mode 'here': whether the head (the kernel's node) runs tasks
    walltime_warning: int = 120  # s before the allocation's end (mode 'here': asked of Slurm)
    tls: bool = True  # Ray's gRPC channels and the dashboard's relay with the cluster's own CA
    ray_metrics: bool = False  # Ray's Prometheus endpoints (they answer anyone who reaches them)


# Former names of settings -> their names now. An older client wrote the former name in
# bootstrap.json; ``ClusterSpec`` accepts it too (with a DeprecationWarning).
FORMER_NAMES = {"idle_timeout": "owner_timeout"}


# ----------------------------------------------------------------------------- events.jsonl

WORKER_JOB_FIELD = "worker_job"  # in every event of a worker job: its Slurm job id


class Event:
    """The ``event`` of a line of ``events.jsonl``."""

    # the bootstrap's (role head, worker or driver)
    PHASE = "phase"  # with ``phase`` (Phase)
    OWNER_GONE = "owner_gone"
    PORT_LOCK_UNAVAILABLE = "port_lock_unavailable"
    PORTS_RETRY = "ports_retry"
    HEAD_RETRY = "head_retry"  # Ray's own start-up wait ran out (a busy node): Ray again
    OUT_OF_MEMORY = "out_of_memory"  # the kernel killed processes of the job at its limit
    PORTS_TAKEN = "ports_taken"  # once running: others listen on ports of the node's block
    PORTS_FREED = "ports_freed"  # ... and no longer do
    IMPORT_RAY = "import_ray"  # seconds `import ray` took on the head's node, Ray's version
    NODES = "nodes"
    NODE_LOST = "node_lost"
    HEAD_READY = "head_ready"
    READY = "ready"
    ENV_PACK = "env_pack"
    ENV_PACK_REPLACED = "env_pack_replaced"
    WALLTIME_WARNING = "walltime_warning"
    LEASE_STALE = "lease_stale"
    ERROR = "error"
    STOPPED = "stopped"
    WORKER_STARTING = "worker_starting"
    WORKER_JOINED = "worker_joined"
    WORKER_RETRY = "worker_retry"
    WORKER_STOPPED = "worker_stopped"
    # a worker job's
    WORKER_JOB_STARTED = "worker_job_started"
    HEAD_GONE = "head_gone"
    WORKER_LEAVING = "worker_leaving"
    WORKER_DRAINING = "worker_draining"
    WORKER_DRAIN_FAILED = "worker_drain_failed"  # `ray drain-node` failed: reason, log
    # a driver's (the worker's events under its own names)
    DRIVER_STARTING = "driver_starting"
    DRIVER_JOINED = "driver_joined"
    DRIVER_RETRY = "driver_retry"
    DRIVER_STOPPED = "driver_stopped"
    DRIVER_FAILED = "driver_failed"
    # the clients' (role client)
    STOP_REQUESTED = "stop_requested"  # before the scancel of a down
    SCALE_REQUEST = "scale_request"  # another process asks the owner to scale
    ADAPT_REQUEST = "adapt_request"  # ... to adapt (or to stop adapting)
    SCALED = "scaled"  # a scale or adapt decision: nodes before and now, its cause
    SCALE_REFUSED = "scale_refused"  # another process's scale_request, refused (adapting)
    ADAPT = "adapt"  # adapt's reports: started, demand it cannot meet, …
    ROTATED = "rotated"  # a walltime rotation's step (submitted, draining), its cause
    ROTATION_FAILED = "rotation_failed"  # a replacement Slurm refused (reported once)


class Phase:
    """The ``phase`` of a ``phase`` event: the head's steps."""

    BOOTSTRAP = "bootstrap"
    WORKERS_STARTING = "workers_starting"
    PORTS = "ports"
    HEAD_STARTING = "head_starting"
    HEAD_UP = "head_up"
    WAITING_FOR_NODES = "waiting_for_nodes"
    READY = "ready"
    STOPPING = "stopping"
    STOPPED = "stopped"


class Role:
    """The ``role`` of an event: who wrote it."""

    HEAD = "head"
    WORKER = "worker"  # a worker of the head's allocation, or a worker job
    DRIVER = "driver"
    CLIENT = "client"  # a kernel, the CLI or the server


class DriverLine:
    """The one-line JSON objects a driver prints for its kernel: ``{DriverLine.KEY: state, …}``."""

    KEY = "driver"
    READY = "ready"
    FAILED = "failed"
    STOPPED = "stopped"
