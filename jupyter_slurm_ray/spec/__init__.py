"""ClusterSpec: what to ask Slurm for and how to start Ray, validated and merged from layers."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from ..bootstrap.jsr_wire import (
    CONTAINER_RUNTIMES,
    FORMER_NAMES,
    PORT_NAMES,
    PORT_STRATEGIES,
    Settings,
)
from ..errors import SpecError
from ..scheduler.kind import SchedulerKind
from ..scheduler.kinds import kind_for_mode
from ..scheduler.modes import DEFAULT_MODE, modes
from .checks import (
    CONSTRAINT,
    INTERFACE,
    MEMORY_ALLOWED,
    NAME,
    SLURM_WORD,
    TIME_REQUIRED,
    WALLTIME_ALLOWED,
    Check,
    absolute_dir,
    choice,
    container_image,
    env_pairs,
    flag,
    format_walltime,
    here_nodes,
    home_or_absolute_dir,
    integer,
    memory,
    object_store_bytes,
    optional,
    parse_memory,
    parse_walltime,
    pattern,
    port_pair,
    python_command,
    ray_start_options,
    registered_mode,
    scheduler_options,
    seconds,
    setup_lines,
    single_line,
    split_long_option,
    walltime,
)
from .environment import export_env_entries
from .groups import checked_groups, group_spec

__all__ = [
    "FIELD_NAMES",
    "FORMER_NAMES",
    "MEMORY_ALLOWED",
    "NAMED_RAY_PORTS",
    "TIME_REQUIRED",
    "WALLTIME_ALLOWED",
    "ClusterSpec",
    "format_walltime",
    "ignored_by_mode",
    "merge_layers",
    "parse_memory",
    "parse_walltime",
    "resolve",
]

# ----------------------------------------------------------------------------- the spec

# ports the bootstrap pins per node besides the worker port range; Ray's GCS and agents take
# kernel-assigned ports (bootstrap/rayargs.py)
NAMED_RAY_PORTS = len(PORT_NAMES)
# The defaults of the settings the bootstrap reads (bootstrap.json), declared with them.
_BOOTSTRAP = Settings(cluster_id="")


def _setting(default: Any, check: Check, kind: str, help: str) -> Any:
    """A cluster setting, declared once: its default, its check, and what the configuration
    (``config.SlurmRay``: trait ``kind``, ``help``) and the magics' options show of it."""
    return dataclasses.field(default=default, metadata={"check": check, "kind": kind, "help": help})


_WORD = "letters, digits and _ . + - (first a letter, digit or _), at most 128 characters"
_SLURM = optional(pattern(SLURM_WORD, _WORD, sbatch=True))


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    """A validated request: the Slurm allocation and how Ray starts in it.

    Construction accepts loose input (int-like strings, memory sizes like "16G", a multi-line
    string for `setup`, a mapping for `env`) and stores the normalised form shown in the types.
    Every field's metadata says how it is checked, configured and explained (``_setting``).
    """

    name: str = _setting(
        "ray",
        pattern(NAME, "a letter, then letters, digits, _ . - (max 64)", sbatch=True),
        "text",
        "The cluster's name (Slurm's job name).",
    )
    mode: str = _setting(
        "slurm",
        registered_mode,
        "text",
        "'slurm' (a Slurm job), 'local' (Ray as processes of this machine, one node, through "
        "the same bootstrap: for a laptop, a tutorial, CI; the magic's --local) or 'here' (Ray "
        "on the nodes of the Slurm allocation this kernel runs in, as steps of it: no new job; "
        "the magic's --here); or the mode of another scheduler registered as an entry point "
        "of jupyter_slurm_ray.schedulers.",
    )
    here_nodes: str | None = _setting(
        None,
        optional(here_nodes),
        "text",
        "With mode 'here': which of the allocation's nodes run Ray. Unset: all of them; a "
        "number N: the kernel's node and the next N-1; or a host list (node[2-3]). The first "
        "(the kernel's node when chosen) is Ray's head.",
    )
    here_kernel_tasks: bool = _setting(
        _BOOTSTRAP.here_kernel_tasks,
        flag,
        "flag",
        "With mode 'here': whether the kernel's own node (Ray's head, when it is one of the "
        "chosen nodes) runs Ray tasks; false: it runs the head's processes only (0 CPUs and 0 "
        "GPUs for tasks).",
    )
    connect: str = _setting(
        "auto",
        choice("auto", "client", "driver"),
        "text",
        "How this kernel connects: 'driver' (its host joins the cluster as a Ray node that runs "
        "no tasks, and the kernel is an ordinary Ray driver: Ray Train, Tune and Data, large "
        "objects and long runs work as on the cluster itself), 'client' (Ray Client, through "
        "the head) or 'auto': driver when the cluster's job dir is on the kernel's filesystem "
        "and the nodes reach its host (a kernel in a Slurm job, or on a login node of the "
        "cluster's network that driver_hosts allows), Ray Client otherwise (a laptop over "
        "SSH, a login node the nodes cannot reach).",
    )
    # -- what to ask Slurm for --------------------------------------------------------------
    time: str | None = _setting(
        None,
        optional(walltime),
        "text_or_int",
        "Walltime of a cluster (Slurm format: 30, 1:00:00, 1-12:00:00).",
    )
    partition: str | None = _setting(None, _SLURM, "text", "Slurm partition (sbatch --partition).")
    account: str | None = _setting(None, _SLURM, "text", "Slurm account to charge (--account).")
    qos: str | None = _setting(None, _SLURM, "text", "Slurm quality of service (sbatch --qos).")
    reservation: str | None = _setting(None, _SLURM, "text", "Slurm reservation (--reservation).")
    constraint: str | None = _setting(
        None,
        optional(pattern(CONSTRAINT, "feature names with & | , [ ] * : ( ) ! only", sbatch=True)),
        "text",
        "Node features (sbatch --constraint).",
    )
    nodes: int = _setting(
        _BOOTSTRAP.nodes, integer(1, 100000), "int", "Number of nodes of a cluster."
    )
    cpus_per_node: int | None = _setting(
        None, optional(integer(1)), "int", "CPUs per node given to Ray."
    )
    gpus_per_node: int = _setting(0, integer(0), "int", "GPUs per node (sbatch --gpus-per-node).")
    mem_per_node: int | None = _setting(
        None, optional(memory), "text_or_int", "Memory per node: megabytes or a size like 16G."
    )
    exclusive: bool = _setting(False, flag, "flag", "Whole nodes (sbatch --exclusive).")
    extra_sbatch: tuple[str, ...] = _setting(
        (), scheduler_options, "lines", "More sbatch long options, one per entry (--name=value)."
    )
    # -- how Ray starts ---------------------------------------------------------------------
    setup: tuple[str, ...] = _setting(
        (),
        setup_lines,
        "lines",
        "Shell lines run before Ray starts (module load, conda activate, ...).",
    )
    python: str | None = _setting(
        None,
        optional(python_command),
        "text",
        "Python of the cluster side, with ray installed (same version as here). Unset: this "
        "kernel's own Python when Slurm runs here and the compute nodes share its filesystem "
        "(checked before submitting); python3 over SSH.",
    )
    container: str | None = _setting(
        _BOOTSTRAP.container,
        optional(container_image),
        "text",
        "Container image Ray runs in on the nodes (an Apptainer .sif or URI, a Charliecloud "
        "directory); it needs the same Ray and Python minor version as here, checked when "
        "the cluster starts. The bootstrap itself stays on the node.",
    )
    container_runtime: str = _setting(
        _BOOTSTRAP.container_runtime,
        choice("auto", *CONTAINER_RUNTIMES),
        "text",
        "Runtime of `container`: 'auto' (the first of apptainer, singularity, ch-run found on "
        "the node), 'apptainer', 'singularity' or 'charliecloud' (ch-run).",
    )
    environment: str = _setting(
        "kernel",
        choice("kernel", "pack"),
        "text",
        "Where the nodes' Ray comes from: 'kernel' (python and setup, or when unset this "
        "kernel's own Python on a shared filesystem) or 'pack' (this kernel's venv, conda or "
        "pixi environment packed once, shipped to the job dir root, unpacked on each node's "
        "local disk before Ray starts).",
    )
    job_dir_root: str = _setting(
        "~/.jupyter-slurm-ray/jobs",
        home_or_absolute_dir,
        "text",
        "Where job directories are created on the cluster's filesystem (a tree only you or "
        "root can change).",
    )
    port_strategy: str = _setting(
        _BOOTSTRAP.port_strategy,
        choice(*PORT_STRATEGIES),
        "text",
        "How each node's ports are chosen: 'kernel' (the default: every port is the one the "
        "kernel gives when Ray binds it, so nobody can predict, take first or drain one; Ray "
        "Client's is held for it until it listens), or, for a site whose firewall opens only "
        "port_range, a block of it: 'random' (a free block), 'fixed' (from fixed_port_base) "
        "or 'hash_jobid' (derived from the Slurm job id, so that it can be predicted: "
        "port_range cut into blocks of 6 + worker_ports ports from its low end, block number "
        "int(sha256(job id), 16) mod their count, the next one when it is taken). A block is "
        "bind-probed, its listeners verified as Ray's, given up for another (with a new token) "
        "when someone else listens on one of its ports before clients are told, and watched "
        "for the cluster's whole life (a worker port taken later: ports_taken, degraded).",
    )
    port_range: tuple[int, int] = _setting(
        _BOOTSTRAP.port_range,
        port_pair,
        "ints",
        "Ports of the node blocks when port_strategy is not 'kernel': [low, high]. A block "
        "holds Ray's node manager, object manager, Ray Client, dashboard and two metrics "
        "ports, then worker_ports worker ports; Ray's GCS and agents take ports the kernel "
        "assigns (outside it).",
    )
    fixed_port_base: int | None = _setting(
        _BOOTSTRAP.fixed_port_base,
        optional(integer(1024, 65535)),
        "int",
        "First port of the block when port_strategy is 'fixed'.",
    )
    worker_ports: int = _setting(
        _BOOTSTRAP.worker_ports, integer(8, 10000), "int", "Worker ports per node."
    )
    port_lock_dir: str | None = _setting(
        _BOOTSTRAP.lock_dir,
        optional(absolute_dir),
        "text",
        "Directory on the compute nodes where users coordinate port blocks (a site's shared, "
        "root-owned sticky directory); unset: /tmp/jupyter-slurm-ray-ports when the site "
        "provides it so, else a directory of your own.",
    )
    tls: bool = _setting(
        _BOOTSTRAP.tls,
        flag,
        "flag",
        "Ray's TLS with a certificate authority made for this cluster (in the job dir, "
        "owner-only; needs openssl on the nodes): every gRPC channel of Ray is mutual TLS "
        "and this package reaches the dashboard through an HTTPS relay on the head, so a "
        "neighbour who takes the port of a node that died receives no byte of the token. "
        "false: plain channels, as Ray's default (the token is then the only protection).",
    )
    ray_metrics: bool = _setting(
        _BOOTSTRAP.ray_metrics,
        flag,
        "flag",
        "Ray's Prometheus metrics: its exporter and its autoscaler's and dashboard's "
        "metrics endpoints, which answer anyone who can reach the node. Off unless a site "
        "scrapes them; the dashboard's pages (nodes, jobs, actors, logs) work without.",
    )
    network_interface: str | None = _setting(
        _BOOTSTRAP.network_interface,
        optional(pattern(INTERFACE, "an interface name like eth0 or ib0 (max 15)")),
        "text",
        "Interface whose address Ray uses on each node (e.g. ib0).",
    )
    node_ip_address_command: str | None = _setting(
        _BOOTSTRAP.node_ip_address_command,
        optional(single_line),
        "text",
        "Shell command printing each node's address for Ray.",
    )
    ray_start_args: tuple[str, ...] = _setting(
        tuple(_BOOTSTRAP.ray_start_args),
        ray_start_options,
        "lines",
        "More `ray start` long options, one per entry.",
    )
    env: tuple[tuple[str, str], ...] = _setting(
        tuple(_BOOTSTRAP.env.items()),
        env_pairs,
        "mapping",
        "Extra environment of the job's setup lines and Ray processes.",
    )
    export_env: tuple[str, ...] = _setting(
        (),
        export_env_entries,
        "lines",
        "Variables of this environment the job also gets, by name or glob pattern (MYAPP_*; "
        "a pattern skips names that look like secrets). Besides them only a small default "
        "list goes (PATH, LD_LIBRARY_PATH, PYTHONPATH, HOME, USER, LOGNAME, TMPDIR, LANG, "
        "LC_*, TZ, module systems' variables): everything else stays out; script() shows the "
        "list.",
    )
    worker_groups: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = _setting(
        (),
        checked_groups,
        "groups",
        "Worker groups: named shapes for worker jobs, e.g. {'gpu': {'partition': 'gpu', "
        "'gpus_per_node': 1}} (partition, account, qos, reservation, constraint, cpus_per_node, "
        "gpus_per_node, mem_per_node, time, exclusive, extra_sbatch; setup and env add to the "
        "cluster's). Their nodes have the Ray resource group:<name>.",
    )
    object_store_memory: int | None = _setting(
        _BOOTSTRAP.object_store_memory,
        optional(object_store_bytes),
        "text_or_int",
        "Object store size per node: bytes or a size like 2G.",
    )
    owner_timeout: float = _setting(
        _BOOTSTRAP.owner_timeout,
        seconds(5, 604800),
        "float",
        "Seconds the owner's lease counts: this long without the owning kernel (or process), "
        "the cluster stops itself (formerly idle_timeout).",
    )
    start_timeout: float = _setting(
        _BOOTSTRAP.start_timeout,
        seconds(10, 86400),
        "float",
        "Seconds Ray may take to start once the job runs.",
    )
    walltime_warning: int = _setting(
        _BOOTSTRAP.walltime_warning,
        integer(60, 3600),
        "int",
        "Seconds before the walltime at which the cluster is warned.",
    )
    worker_rotation: int = _setting(
        0,
        integer(0, 86400),
        "int",
        "Seconds before a worker job's walltime ends (when it ends before the head's) at which "
        "a replacement of its group is submitted; the old one is drained once the new one "
        "joined. 0: no rotation.",
    )

    def __post_init__(self) -> None:
        for spec_field in dataclasses.fields(self):
            check = spec_field.metadata["check"]
            value = check(spec_field.name, getattr(self, spec_field.name))
            object.__setattr__(self, spec_field.name, value)
        self._check_ports()
        self._check_decided()
        self._check_options()
        if self.environment == "pack" and self.container is not None:
            allowed = "'kernel' when container is set (Ray comes from the image)"
            raise SpecError("environment", "pack", allowed)
        for group, _ in self.worker_groups:
            group_spec(self, group)  # each group's values, checked as those settings are

    def _check_ports(self) -> None:
        block = self.block_size
        low, high = self.port_range
        if high - low + 1 < block:
            allowed = f"a range of at least {block} ports ({NAMED_RAY_PORTS} + worker_ports)"
            raise SpecError("port_range", self.port_range, allowed)
        if self.port_strategy == "fixed" and self.fixed_port_base is None:
            raise SpecError(
                "fixed_port_base", None, "a first port, required when port_strategy is 'fixed'"
            )
        base = self.fixed_port_base
        if base is not None and base + block - 1 > 65535:
            allowed = f"a port from 1024 to {65536 - block}, so that its {block} ports fit"
            raise SpecError("fixed_port_base", base, allowed)

    def _check_options(self) -> None:
        """The extra options of the job, each asked of the scheduler that reads them."""
        kind = self.scheduler_kind
        for entry in self.extra_sbatch:
            name, _ = split_long_option("extra_sbatch", entry)
            refusal = kind.option_refusal(name)
            if refusal:
                raise SpecError("extra_sbatch", entry, refusal)

    def _check_decided(self) -> None:
        """What the mode's scheduler decides itself (mode 'here': the allocation's nodes,
        walltime, partition…) is refused when asked for (``resolve`` leaves such settings of
        the configuration out, and says so)."""
        kind = self.scheduler_kind
        settings = vars(self)
        for name in kind.decided:
            value = getattr(self, name)
            allowed = kind.refusal(name, value, settings)
            if allowed is not None:
                raise SpecError(name, value, allowed)

    @property
    def scheduler_kind(self) -> type[SchedulerKind]:
        """The kind of scheduler that runs this cluster's jobs (``scheduler/kinds.py``)."""
        return kind_for_mode(self.mode)

    @property
    def needs_walltime(self) -> bool:
        """Whether it may be submitted only with a walltime (its scheduler decides none)."""
        return self.time is None and "time" not in self.scheduler_kind.decided

    @property
    def block_size(self) -> int:
        """Ports the bootstrap needs per node: the named Ray ports and the worker port range."""
        return NAMED_RAY_PORTS + self.worker_ports

    @property
    def time_seconds(self) -> int | None:
        """The walltime in seconds, or None when it is not set yet."""
        return None if self.time is None else parse_walltime(self.time)

    @property
    def env_dict(self) -> dict[str, str]:
        """The extra environment of the Ray processes as a plain dict."""
        return dict(self.env)

    def require_complete(self) -> ClusterSpec:
        """Return the spec if it can be submitted, else raise SpecError (a walltime is required)."""
        if self.needs_walltime:
            raise SpecError("time", None, TIME_REQUIRED)
        return self

    def replace(self, **changes: Any) -> ClusterSpec:
        """A copy with some fields changed, validated again."""
        changes = _current_names(changes, stacklevel=3)
        for key, value in changes.items():
            _field_name(key, value)
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict that `from_mapping` turns back into an equal spec."""
        data = {key: getattr(self, key) for key in FIELD_NAMES}
        for key in ("extra_sbatch", "setup", "ray_start_args", "port_range", "export_env"):
            data[key] = list(data[key])
        data["env"] = dict(self.env)
        data["worker_groups"] = {
            name: {key: _plain(value) for key, value in settings}
            for name, settings in self.worker_groups
        }
        return data

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any], *, stored: bool = False) -> ClusterSpec:
        """A spec from settings keyed by field name (`-` or `_`); None means the default.

        A setting's former name (``FORMER_NAMES``) still works, with a DeprecationWarning;
        ``stored``: the mapping is a registry record's, perhaps written before the rename, read
        without a warning (a server reads its records on every poll)."""
        if not isinstance(mapping, Mapping):
            raise SpecError("settings", mapping, "a mapping of cluster settings")
        return cls(**_settings_of(mapping, stored=stored))


def _accepting_former_names(init: Any) -> Any:
    """ClusterSpec's generated ``__init__``, taking a setting's former name as a keyword too
    (with a DeprecationWarning): ``ClusterSpec(idle_timeout=60)`` means ``owner_timeout=60``."""

    @functools.wraps(init)
    def __init__(self: ClusterSpec, *args: Any, **settings: Any) -> None:
        init(self, *args, **_current_names(settings, stacklevel=3))

    return __init__


setattr(ClusterSpec, "__init__", _accepting_former_names(ClusterSpec.__init__))  # noqa: B010

FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(ClusterSpec))


def _plain(value: Any) -> Any:
    """A group's setting as JSON has it: a list for lines, a mapping for env."""
    if isinstance(value, tuple):
        if all(isinstance(item, tuple) and len(item) == 2 for item in value) and value:
            return dict(value)
        return list(value)
    return value


def _field_name(key: object, value: object) -> str:
    name = key.replace("-", "_") if isinstance(key, str) else ""
    if name not in FIELD_NAMES:
        close = difflib.get_close_matches(name, FIELD_NAMES, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        allowed = f"not a cluster setting; {hint}the settings are: {', '.join(FIELD_NAMES)}"
        raise SpecError(str(key), value, allowed)
    return name


def _current_names(
    mapping: Mapping[str, Any], *, stored: bool = False, stacklevel: int = 2
) -> dict[str, Any]:
    """``mapping`` with each setting's former name (``FORMER_NAMES``) replaced by its name now,
    which a DeprecationWarning says unless the mapping is ``stored`` (a record written before
    the rename); SpecError naming both when both are given. ``stacklevel``: whose line the
    warning shows (1: this function, 2: its caller, …)."""
    current = dict(mapping)
    for key, value in mapping.items():
        former = key.replace("-", "_") if isinstance(key, str) else ""
        name = FORMER_NAMES.get(former)
        if name is None:
            continue
        if any(isinstance(k, str) and k.replace("-", "_") == name for k in mapping):
            allowed = f"{former} is the former name of {name}; give {name} only, not both"
            raise SpecError(former, value, allowed)
        if not stored:
            warnings.warn(
                f"the cluster setting {former} is now named {name}; {former} is deprecated",
                DeprecationWarning,
                stacklevel=stacklevel,
            )
        current[name] = current.pop(key)
    return current


def _settings_of(mapping: Mapping[str, Any], *, stored: bool = False) -> dict[str, Any]:
    """The set (non-None) settings of one layer, keyed by field name (former names too)."""
    settings: dict[str, Any] = {}
    for key, value in _current_names(mapping, stored=stored, stacklevel=4).items():
        name = _field_name(key, value)
        if name in settings:
            raise SpecError(name, value, "each setting once (not with both - and _ spellings)")
        if value is not None:
            settings[name] = value
    return settings


# ----------------------------------------------------------------------------- layers


def resolve(layers: Sequence[tuple[str, Mapping[str, Any]]]) -> tuple[ClusterSpec, dict[str, str]]:
    """Merge named layers (later wins, None means not set) into a spec and each field's source.

    Callers pass e.g. [("default", ...), ("config", ...), ("profile gpu-small", ...),
    ("argument", ...)]; fields no layer sets have the source "default".
    """
    merged: dict[str, Any] = {}
    sources = dict.fromkeys(FIELD_NAMES, "default")
    for source, mapping in layers:
        if not isinstance(mapping, Mapping):
            raise SpecError(source, mapping, "a mapping of cluster settings")
        for name, value in _settings_of(mapping).items():
            if name == "worker_groups":  # groups add up, by name, layer over layer
                value = {**_groups_of(merged.get(name)), **_groups_of(value)}
            merged[name] = value
            sources[name] = source
    _leave_out_decided(merged, sources)
    try:
        spec = ClusterSpec(**merged)
    except SpecError as error:
        source = sources.get(error.field, "default")
        raise SpecError(error.field, error.value, f"{error.allowed} (set by {source})") from error
    return spec, sources


#: How ``resolve`` marks the source of a setting the mode's scheduler decides itself.
IGNORED_BY_MODE = "ignored with mode"


def _leave_out_decided(merged: dict[str, Any], sources: dict[str, str]) -> None:
    """The settings the mode's scheduler decides (mode 'here': the allocation's own nodes,
    walltime…; local mode: one node) taken out of ``merged``, their source saying so."""
    mode = merged.get("mode", DEFAULT_MODE)
    if not isinstance(mode, str) or mode not in modes():
        return  # the spec refuses it, naming the modes there are
    for name, why in kind_for_mode(mode).decided.items():
        if name in merged:
            asked = f"{sources[name]} asked {merged.pop(name)}"
            sources[name] = f"{IGNORED_BY_MODE} {mode!r}: {why} ({asked})"


def ignored_by_mode(sources: Mapping[str, str]) -> list[str]:
    """The settings ``resolve`` left out for the mode's scheduler, each with who asked what."""
    return [
        f"{name}: {source}"
        for name, source in sources.items()
        if source.startswith(IGNORED_BY_MODE)
    ]


def _groups_of(value: Any) -> dict[str, Any]:
    if isinstance(value, tuple):
        return {name: dict(settings) for name, settings in value}
    return dict(value) if isinstance(value, Mapping) else {}


def merge_layers(*layers: Mapping[str, Any]) -> ClusterSpec:
    """Merge setting layers, later ones winning; None values mean "not set here"."""
    spec, _ = resolve([(f"layer {index + 1}", layer) for index, layer in enumerate(layers)])
    return spec
