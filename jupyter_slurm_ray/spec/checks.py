"""The checks of cluster settings: Slurm walltimes and memory sizes, patterns, numbers, the
variables a job gets, and the sbatch / ``ray start`` options a user may add. Each check takes
``(field, value)`` and returns the normalised value, or raises SpecError naming the field and
what is allowed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from ..errors import SpecError
from ..scheduler.modes import modes
from .units import BYTES_PER_UNIT, parse_duration, size_in_bytes

# ----------------------------------------------------------------------------- walltime

WALLTIME_ALLOWED = (
    "a Slurm walltime like 30, 1:00:00, 2-12 or 1-00:30:00 "
    "(minutes, M:S, H:M:S, D-H, D-H:M, D-H:M:S)"
)
TIME_REQUIRED = (
    "a walltime is required: pass time=... (e.g. '1:00:00') or set it in the config or a profile"
)

_MAX_WALLTIME_SECONDS = (2**32 - 2) * 60  # Slurm's largest finite limit, in minutes


def parse_walltime(value: str | int, *, field: str = "time") -> int:
    """Seconds of a Slurm walltime: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S, or an int of minutes."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise SpecError(field, value, WALLTIME_ALLOWED)
    if isinstance(value, int):
        seconds: int | None = value * 60
    elif value.strip().lower() in ("unlimited", "infinite"):
        raise SpecError(
            field, value, "a finite walltime (UNLIMITED is refused); " + WALLTIME_ALLOWED
        )
    else:
        seconds = parse_duration(value)
    if seconds is None or not 1 <= seconds <= _MAX_WALLTIME_SECONDS:
        raise SpecError(field, value, WALLTIME_ALLOWED)
    return seconds


def format_walltime(seconds: int) -> str:
    """Slurm's canonical form of a walltime: `HH:MM:SS`, or `D-HH:MM:SS` from one day on."""
    if isinstance(seconds, bool) or not isinstance(seconds, int) or seconds < 1:
        raise SpecError("time", seconds, "a positive whole number of seconds")
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    clock = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{clock}" if days else clock


# ----------------------------------------------------------------------------- memory

MEMORY_ALLOWED = (
    "a memory size like 4000 (megabytes), 512M, 16G, 1.5T or 16GiB "
    "(units K, M, G, T, P, powers of 1024; a fraction needs a unit)"
)
_OBJECT_STORE_MIN = 78643200  # Ray's minimum object store size, in bytes


def _parse_size(field: str, value: object, default_unit: str, allowed: str) -> int:
    """Bytes of a size given as an int in `default_unit` or a string with an optional unit."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise SpecError(field, value, allowed)
    if isinstance(value, int):
        size: Fraction | None = Fraction(value) * BYTES_PER_UNIT[default_unit]
    else:
        size = size_in_bytes(value, default_unit)
    if size is None or size <= 0:
        raise SpecError(field, value, allowed)
    return math.ceil(size)


def parse_memory(value: str | int, *, field: str = "mem_per_node") -> int:
    """Megabytes (MiB, as Slurm counts them) of a Slurm memory size; a bare number is megabytes."""
    size = _parse_size(field, value, "M", MEMORY_ALLOWED)
    return -(-size // BYTES_PER_UNIT["M"])


# ----------------------------------------------------------------------------- field checks
# Each check takes (field, value) and returns the normalised value or raises SpecError.

Check = Callable[[str, Any], Any]

NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}", re.ASCII)
SLURM_WORD = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}", re.ASCII)
CONSTRAINT = re.compile(r"[A-Za-z0-9_.&|,\[\]*:()!-]{1,1024}", re.ASCII)
_PYTHON = re.compile(r"[A-Za-z0-9_./+][A-Za-z0-9_./+-]*", re.ASCII)
_JOB_DIR_ROOT = re.compile(r"(?:/|~/)[A-Za-z0-9_./+-]*", re.ASCII)
_ABSOLUTE = re.compile(r"/[A-Za-z0-9_./+-]*", re.ASCII)
_CONTAINER_IMAGE = re.compile(r"[A-Za-z0-9_./+@~][A-Za-z0-9_./+@~:=%-]*", re.ASCII)
INTERFACE = re.compile(r"[A-Za-z0-9_.:-]{1,15}", re.ASCII)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
_LONG_OPTION = re.compile(r"(--[a-z][a-z0-9-]*)(?:=(.*))?", re.ASCII | re.DOTALL)
_INT_TEXT = re.compile(r"[0-9]{1,9}", re.ASCII)
_LINE_BREAKS = re.compile(r"\r\n|\r|\n")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# Words that start a heterogeneous job component on an #SBATCH line: Slurm 22.05 splits on the
# bare word, older releases on any line containing it, so any occurrence is refused.
_HET_SEPARATOR = re.compile(r"hetjob|packjob", re.IGNORECASE)
_TRUE_WORDS = ("true", "yes", "on", "1")
_FALSE_WORDS = ("false", "no", "off", "0")


def _refuse_het_separator(field: str, value: str) -> None:
    if _HET_SEPARATOR.search(value):
        raise SpecError(
            field, value, "a value without 'hetjob' or 'packjob' (sbatch splits jobs there)"
        )


def pattern(regex: re.Pattern[str], allowed: str, *, sbatch: bool = False) -> Check:
    def check(field: str, value: Any) -> str:
        if not isinstance(value, str) or not regex.fullmatch(value):
            raise SpecError(field, value, allowed)
        if sbatch:
            _refuse_het_separator(field, value)
        return value

    return check


def optional(check: Check) -> Check:
    def optional(field: str, value: Any) -> Any:
        return None if value is None else check(field, value)

    return optional


def integer(low: int, high: int | None = None) -> Check:
    allowed = f"a whole number from {low}" + (f" to {high}" if high is not None else " up")

    def check(field: str, value: Any) -> int:
        if isinstance(value, str) and _INT_TEXT.fullmatch(value.strip()):
            number = int(value.strip())
        elif isinstance(value, int) and not isinstance(value, bool):
            number = value
        else:
            raise SpecError(field, value, allowed)
        if number < low or (high is not None and number > high):
            raise SpecError(field, value, allowed)
        return number

    return check


def seconds(low: float, high: float) -> Check:
    allowed = f"a number of seconds from {low:g} to {high:g}"

    def check(field: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise SpecError(field, value, allowed)
        try:
            number = float(value)
        except ValueError:
            raise SpecError(field, value, allowed) from None
        if not low <= number <= high:  # also refuses nan
            raise SpecError(field, value, allowed)
        return number

    return check


def registered_mode(field: str, value: Any) -> str:
    """A mode some kind of scheduler is registered as (``scheduler/modes.py``)."""
    known = modes()
    if value not in known:
        raise SpecError(field, value, "one of " + ", ".join(map(repr, known)))
    return str(value)


def choice(*options: str) -> Check:
    allowed = "one of " + ", ".join(repr(option) for option in options)

    def check(field: str, value: Any) -> str:
        if value not in options:
            raise SpecError(field, value, allowed)
        return str(value)

    return check


_HOSTLIST = re.compile(r"[A-Za-z0-9_.-]+(?:\[[0-9,-]+\][A-Za-z0-9_.-]*)?", re.ASCII)
HERE_NODES_ALLOWED = (
    "a number of the allocation's nodes (e.g. 2), or a Slurm host list of them (node[2-3] or "
    "node2,node3)"
)


def here_nodes(field: str, value: Any) -> str:
    """``mode = "here"``'s choice of the allocation's nodes: a count ("2") or a host list."""
    text = (
        str(value).strip() if isinstance(value, int | str) and not isinstance(value, bool) else ""
    )
    if text.isdigit():
        if int(text) < 1:
            raise SpecError(field, value, HERE_NODES_ALLOWED)
        return str(int(text))
    items = re.split(r",(?![^\[]*\])", text) if text and len(text) <= 4096 else []
    if not items or not all(_HOSTLIST.fullmatch(item) for item in items):
        raise SpecError(field, value, HERE_NODES_ALLOWED)
    return text


def flag(field: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE_WORDS + _FALSE_WORDS:
        return value.strip().lower() in _TRUE_WORDS
    raise SpecError(field, value, "true or false")


def walltime(field: str, value: Any) -> str:
    return format_walltime(parse_walltime(value, field=field))


def memory(field: str, value: Any) -> int:
    return parse_memory(value, field=field)


def object_store_bytes(field: str, value: Any) -> int:
    allowed = f"bytes (at least {_OBJECT_STORE_MIN}, Ray's minimum) or a size like 2G"
    size = _parse_size(field, value, "B", allowed)
    if size < _OBJECT_STORE_MIN:
        raise SpecError(field, value, allowed)
    return size


def _string_tuple(field: str, value: Any, allowed: str) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list | tuple) and all(isinstance(item, str) for item in value):
        return tuple(value)
    raise SpecError(field, value, allowed)


def single_line(field: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip() or re.search(r"[\r\n\x00]", value):
        raise SpecError(field, value, "a non-empty single line of text (no newline or NUL)")
    return value


def setup_lines(field: str, value: Any) -> tuple[str, ...]:
    allowed = "shell lines, one per entry (no newline, carriage return or NUL inside an entry)"
    lines = (
        _LINE_BREAKS.split(value)
        if isinstance(value, str)
        else _string_tuple(field, value, allowed)
    )
    for line in lines:
        if re.search(r"[\r\n\x00]", line):
            raise SpecError(field, line, allowed)
    return tuple(line for line in lines if line.strip())


def python_command(field: str, value: Any) -> str:
    allowed = "a command name or absolute path made of A-Z a-z 0-9 _ . / + - (not starting with -)"
    return pattern(_PYTHON, allowed)(field, value)


def container_image(field: str, value: Any) -> str:
    allowed = "an image path or URI (e.g. /images/ray.sif, docker://rayproject/ray:2.9.0) "
    allowed += "without spaces, commas or control characters, not starting with -"
    if not isinstance(value, str) or not _CONTAINER_IMAGE.fullmatch(value):
        raise SpecError(field, value, allowed)
    return value


def home_or_absolute_dir(field: str, value: Any) -> str:
    allowed = "an absolute path or one starting with ~/, made of A-Z a-z 0-9 _ . / + -, without .."
    if not isinstance(value, str) or not _JOB_DIR_ROOT.fullmatch(value) or ".." in value.split("/"):
        raise SpecError(field, value, allowed)
    return value


def absolute_dir(field: str, value: Any) -> str:
    allowed = "an absolute path made of A-Z a-z 0-9 _ . / + -, without .."
    if not isinstance(value, str) or not _ABSOLUTE.fullmatch(value) or ".." in value.split("/"):
        raise SpecError(field, value, allowed)
    return value


def port_pair(field: str, value: Any) -> tuple[int, int]:
    allowed = "two ports (low, high) with 1024 <= low < high <= 65535"
    if isinstance(value, str) and value.count("-") == 1:
        value = value.split("-")
    if not isinstance(value, list | tuple) or len(value) != 2:
        raise SpecError(field, value, allowed)
    port = integer(1024, 65535)
    try:
        low, high = port(field, value[0]), port(field, value[1])
    except SpecError:
        raise SpecError(field, value, allowed) from None
    if low >= high:
        raise SpecError(field, value, allowed)
    return (low, high)


def env_pairs(field: str, value: Any) -> tuple[tuple[str, str], ...]:
    allowed = "a mapping of variable names (A-Z a-z 0-9 _) to single-line strings"
    try:
        variables = dict(value)
    except (TypeError, ValueError):
        raise SpecError(field, value, allowed) from None
    return tuple(sorted(_env_pair(field, name, text, allowed) for name, text in variables.items()))


_TOKEN_AUTH_VARIABLES = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def _env_pair(field: str, name: Any, text: Any, allowed: str) -> tuple[str, str]:
    if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
        raise SpecError(field, name, allowed)
    if name in _TOKEN_AUTH_VARIABLES:
        raise SpecError(field, name, "a variable other than RAY_AUTH_*: token auth is always on")
    if isinstance(text, int) and not isinstance(text, bool):
        text = str(text)
    if not isinstance(text, str) or re.search(r"[\r\n\x00]", text):
        raise SpecError(field, {name: text}, allowed)
    return (name, text)


# ----------------------------------------------------------------------------- long options

_LONG_ONLY = "only long options are allowed, one per entry: --name or --name=value"

# `ray start` options the bootstrap pins (ports, addresses, resources, lifetime). Ray's CLI
# (click) takes no abbreviations, so exact names suffice.
_RAY_PINNED = dict.fromkeys(
    [
        "--head",
        "--address",
        "--port",
        "--node-ip-address",
        "--node-manager-port",
        "--object-manager-port",
        "--ray-client-server-port",
        "--dashboard-port",
        "--dashboard-host",
        "--dashboard-agent-listen-port",
        "--dashboard-agent-grpc-port",
        "--runtime-env-agent-port",
        "--metrics-export-port",
        "--min-worker-port",
        "--max-worker-port",
        "--worker-port-list",
        "--gcs-server-port",
        "--temp-dir",
        "--block",
        "--resources",
    ],
    "the bootstrap sets it",
) | {
    "--num-cpus": "use the cpus_per_node setting",
    "--num-gpus": "use the gpus_per_node setting",
    "--object-store-memory": "use the object_store_memory setting",
}


def split_long_option(field: str, entry: str) -> tuple[str, str | None]:
    match = _LONG_OPTION.fullmatch(entry)
    if not match:
        raise SpecError(field, entry, _LONG_ONLY)
    return match.group(1), match.group(2)


def scheduler_options(field: str, value: Any) -> tuple[str, ...]:
    """More options of the scheduler's job, each a long option; which the scheduler refuses
    is its own word (``SchedulerKind.option_refusal``, asked by the spec)."""
    entries = _string_tuple(field, value, _LONG_ONLY)
    for entry in entries:
        _, option_value = split_long_option(field, entry)
        # sbatch reads a backslash as an escape even inside quotes: refuse rather than re-quote.
        if option_value is not None and (_CONTROL.search(option_value) or "\\" in option_value):
            raise SpecError(field, entry, "a value without control characters or backslashes")
        _refuse_het_separator(field, entry)
    return entries


def ray_start_options(field: str, value: Any) -> tuple[str, ...]:
    entries = _string_tuple(field, value, _LONG_ONLY)
    for entry in entries:
        name, option_value = split_long_option(field, entry)
        if name in _RAY_PINNED:
            raise SpecError(
                field, entry, f"{name} is set by jupyter_slurm_ray: {_RAY_PINNED[name]}"
            )
        if option_value is not None and _CONTROL.search(option_value):
            raise SpecError(field, entry, "a value without control characters")
    return entries
