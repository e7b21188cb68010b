"""Slurm's units, as its commands print them and sbatch takes them: durations, CPU times,
sizes, TRES lists and amounts, timestamps, exit codes and host lists. Pure functions, the one
parser of each (the settings' checks use them too); ``output.py`` reads whole answers with
them."""

from __future__ import annotations

import re
from datetime import datetime
from fractions import Fraction


def parse_tres(text: str) -> dict[str, str]:
    """``cpu=4,gres/gpu=2,mem=16G,node=1`` → ``{"cpu": "4", "gres/gpu": "2", …}``."""
    pairs = (item.partition("=") for item in text.split(",") if "=" in item)
    return {name.strip(): value.strip() for name, _, value in pairs if name.strip()}


def tres_amount(name: str, value: str) -> int | None:
    """A TRES count as a number: memory in megabytes (``16G`` → 16384), others as they are."""
    if name == "mem":
        size = parse_size(value, unit="M")
        return None if size is None else size // 1024**2
    match = re.fullmatch(r"\d+", value.strip())
    return int(match.group()) if match else None


_CPU_TIME = re.compile(r"^(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+(?:\.\d+)?)$")


def parse_cpu_time(text: str) -> float | None:
    """Seconds in sacct's CPU times: ``00:07.832`` (M:S.ms), ``01:02:03``, ``1-02:03:04``."""
    match = _CPU_TIME.match(text.strip())
    if not match:
        return None
    days, hours, minutes, seconds = match.groups()
    return int(days or 0) * 86400 + int(hours or 0) * 3600 + int(minutes) * 60 + float(seconds)


# Slurm's sizes, as sbatch takes them and Slurm prints them: a number with a unit (powers of
# 1024, ``16G``, ``16GB``, ``16GiB``) or without (then in the caller's unit); a fraction needs
# its unit.
BYTES_PER_UNIT = {"B": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}
_SIZE = re.compile(
    r"([0-9]{1,15}(?:\.[0-9]{1,9})?)(?:([KMGTP])(?:I?B)?)?", re.ASCII | re.IGNORECASE
)


def size_in_bytes(text: str, unit: str = "B") -> Fraction | None:
    """The exact bytes of a Slurm size (``unit``: that of a bare number, a key of
    BYTES_PER_UNIT); None when it is none."""
    match = _SIZE.fullmatch(text.strip())
    if not match or ("." in match.group(1) and not match.group(2)):
        return None
    number, suffix = match.groups()
    return Fraction(number) * BYTES_PER_UNIT[(suffix or unit).upper()]


def parse_size(text: str, *, unit: str = "B") -> int | None:
    """Bytes in a size as Slurm prints it: ``219426816`` (in ``unit``), ``214284K``, ``1.5G``."""
    size = size_in_bytes(text, unit)
    return None if size is None else int(size)


# Slurm's durations, as sbatch takes them and Slurm prints them: M, M:S, H:M:S, D-H, D-H:M,
# D-H:M:S (the leading field of any size, the others within their unit).
_LEAD = "([0-9]{1,9})"
_PART = "([0-9]{1,2})"
_DURATION_FORMS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern, re.ASCII), units)
    for pattern, units in (
        (_LEAD, "m"),
        (f"{_LEAD}:{_PART}", "ms"),
        (f"{_PART}:{_PART}:{_PART}", "hms"),
        (f"{_LEAD}-{_PART}", "dh"),
        (f"{_LEAD}-{_PART}:{_PART}", "dhm"),
        (f"{_LEAD}-{_PART}:{_PART}:{_PART}", "dhms"),
    )
)
_UNIT_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_UNIT_LIMIT = {"h": 24, "m": 60, "s": 60}


def parse_duration(text: str) -> int | None:
    """Seconds in a Slurm duration (``D-HH:MM:SS``, ``HH:MM:SS``, ``MM:SS``, a bare number of
    minutes, ``D-H``, ``D-H:M``); None for anything else (UNLIMITED, NOT_SET, INVALID, N/A)."""
    text = text.strip()
    for pattern, units in _DURATION_FORMS:
        match = pattern.fullmatch(text)
        if match:
            return _sum_units(units, [int(group) for group in match.groups()])
    return None


def _sum_units(units: str, numbers: list[int]) -> int | None:
    total = 0
    for index, (unit, number) in enumerate(zip(units, numbers, strict=True)):
        bounded = index > 0 or unit == "h"
        if bounded and number >= _UNIT_LIMIT[unit]:
            return None
        total += number * _UNIT_SECONDS[unit]
    return total


def parse_timestamp(text: str) -> datetime | None:
    text = text.strip()
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None  # N/A, Unknown, None


def parse_exit_code(text: str) -> int | None:
    """``"2:0"`` → 2; ``"0:15"`` (killed by signal 15) → 128 + 15."""
    code, _, sig = text.strip().partition(":")
    if not code.isdigit():
        return None
    if sig.isdigit() and int(sig) and not int(code):
        return 128 + int(sig)
    return int(code)


_HOST_RANGE = re.compile(r"\[([^\]]+)\]")


def expand_hostlist(hostlist: str) -> list[str]:
    """``"node[1-3,7],gpu01"`` → ``["node1", "node2", "node3", "node7", "gpu01"]``.

    Written here rather than running ``scontrol show hostnames`` once per job on every poll.
    """
    hostlist = hostlist.strip()
    if not hostlist or hostlist in {"(null)", "None assigned", "N/A"}:
        return []
    hosts: list[str] = []
    for item in _split_top_level(hostlist):
        hosts.extend(_expand_one(item))
    return hosts


def _split_top_level(text: str) -> list[str]:
    items, depth, current = [], 0, ""
    for char in text:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += char
    items.append(current)
    return [i for i in items if i]


def _expand_one(item: str) -> list[str]:
    match = _HOST_RANGE.search(item)
    if not match:
        return [item]
    prefix, suffix = item[: match.start()], item[match.end() :]
    expanded = []
    for part in match.group(1).split(","):
        lo, _, hi = part.partition("-")
        if not hi:
            names = [lo]
        else:
            width = len(lo)
            names = [str(n).zfill(width) for n in range(int(lo), int(hi) + 1)]
        for name in names:
            expanded.extend(_expand_one(prefix + name + suffix))
    return expanded
