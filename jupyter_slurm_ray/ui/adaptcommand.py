"""``%slurm_ray adapt [NAME] --minimum N --maximum N [--idle S] [--max-pending N]`` and
``--off``, and ``jupyter slurm-ray adapt``: the command (its arguments: ``arguments.py``; the
loop itself: elastic/adapt.py)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ..errors import SlurmRayError

if TYPE_CHECKING:
    from ..session import Session


def adapt_command(session: Session, args: argparse.Namespace) -> list[str]:
    """Start, change or stop (``--off``) the adaptive scaling of a cluster: its owner does;
    any other process (the CLI, another kernel) asks the owner (an ``adapt_request`` event)."""
    if not args.off and args.maximum is None:
        raise SlurmRayError("adapt: give --maximum N (and --minimum N), or --off")
    cluster = session.find(args.name)
    name = cluster.spec.name
    settings, applied = cluster.adapt_or_ask(
        args.minimum, args.maximum, off=args.off, idle_timeout=args.idle,
        max_pending=args.max_pending, group=args.group,
    )  # fmt: skip
    if not applied:
        what = settings.describe() if settings else "adaptive scaling off"
        return [f"{name}: {what}: asked of its owner (it applies it)"]
    if settings is None:
        return [f"{name}: adaptive scaling off (its worker jobs stay)"]
    return [f"{name}: {settings.describe()}"]
