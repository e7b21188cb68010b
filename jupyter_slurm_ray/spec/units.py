"""The units a spec is written in, which are Slurm's: durations (``1:00:00``, ``2-0``) and sizes
(``16G``), as sbatch takes them and Slurm prints them. Pure functions, the one parser of each:
the spec's checks (``checks.py``) and the reading of Slurm's answers (``slurm/formats.py``,
``slurm/output.py``) use them."""

from __future__ import annotations

import re
from fractions import Fraction

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
