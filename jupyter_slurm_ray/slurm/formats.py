"""Slurm's units, as its commands print them: CPU times, TRES lists and amounts, timestamps,
exit codes and host lists (durations and sizes, which a spec is written in too, are
``spec/units.py``'s). Pure functions, the one parser of each; ``output.py`` reads whole answers
with them."""

from __future__ import annotations

import re
from datetime import datetime

from ..spec.units import parse_size


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
