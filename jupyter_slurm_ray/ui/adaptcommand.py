"""``%slurm_ray adapt [NAME] --minimum N --maximum N [--idle S] [--max-pending N]`` and
``--off``: the arguments and the command (the loop itself: elastic/adapt.py). Light to import: the
magics' parser is built from it."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ..errors import SlurmRayError

if TYPE_CHECKING:
    from ..session import Session


def add_adapt_arguments(parser: argparse.ArgumentParser, name_help: str) -> None:
    """The adapt command's arguments (values checked by ``cluster.adapt``, one line)."""
    parser.add_argument("name", nargs="?", help=name_help)
    parser.add_argument(
        "--minimum", metavar="N", help="Ray nodes in all at least (default: the head's)"
    )
    parser.add_argument("--maximum", metavar="N", help="Ray nodes in all at most")
    parser.add_argument(
        "--idle", metavar="S", help="seconds a worker node runs nothing before it is retired"
    )
    parser.add_argument(
        "--max-pending", metavar="N", help="worker jobs waiting in Slurm's queue at once"
    )
    parser.add_argument(
        "--group", metavar="G", help="worker group: 'default' (others are scaled with scale)"
    )
    parser.add_argument("--off", action="store_true", help="stop adapting (worker jobs stay)")


def adapt_command(session: Session, args: argparse.Namespace) -> list[str]:
    """Start, change or stop (``--off``) the adaptive scaling of a cluster: its owner does;
    any other process (the CLI, another kernel) asks the owner (an ``adapt_request`` event)."""
    if not args.off and args.maximum is None:
        raise SlurmRayError("adapt: give --maximum N (and --minimum N), or --off")
    cluster = session.find(args.name)
    name = cluster.spec.name
    if not cluster.owned_here:
        if args.group not in (None, "default"):
            raise SlurmRayError("adapt: --group: 'default' (scale other groups with scale)")
        settings = cluster.request_adapt(
            args.minimum, args.maximum, idle_timeout=args.idle, max_pending=args.max_pending,
            off=args.off,
        )  # fmt: skip
        what = settings.describe() if settings else "adaptive scaling off"
        return [f"{name}: {what}: asked of its owner (it applies it)"]
    if args.off:
        cluster.stop_adapting()
        return [f"{name}: adaptive scaling off (its worker jobs stay)"]
    settings = cluster.adapt(
        args.minimum,
        args.maximum,
        idle_timeout=args.idle,
        max_pending=args.max_pending,
        group=args.group,
    )
    assert settings is not None
    return [f"{name}: {settings.describe()}"]
