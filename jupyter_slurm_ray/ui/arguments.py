"""The arguments the magics and the CLI share, declared once: a cluster's name, ``down``,
``logs``, ``forget``, ``extend``, ``scale`` and ``adapt`` (their values are checked where they
are used, one line each). Light to import: the parsers are built from it."""

from __future__ import annotations

import argparse

NAME_HELP = "a cluster name, id or Slurm job id"
LIST_ALL_HELP = "also list the ended clusters of the last days (folded into one line otherwise)"
NODES_HELP = "Ray nodes in all: the head's allocation plus one-node worker jobs"
AMOUNT_HELP = "walltime to add: +30 (minutes) or a Slurm duration like +1:00:00"


def add_arguments(command: str, parser: argparse.ArgumentParser, name_help: str) -> None:
    """The arguments ``command`` (down, logs, forget, extend) takes, in the magic and the CLI."""
    parser.add_argument("name", nargs="?", help=name_help)
    if command == "down":
        parser.add_argument("--all", action="store_true", help="every active cluster")
    elif command == "logs":
        parser.add_argument("--node", metavar="HOST", help="this node's Ray log instead")
        parser.add_argument("--tail", type=int, default=100, metavar="N", help="last N lines")
    elif command == "forget":
        parser.add_argument("--ended", action="store_true", help="every ended cluster")
    elif command == "extend":
        parser.add_argument("amount", metavar="AMOUNT", help=AMOUNT_HELP)


def add_scale_arguments(parser: argparse.ArgumentParser, name_help: str) -> None:
    """``scale N [NAME]``, in the magic and the CLI (N checked by the cluster, one line)."""
    parser.add_argument("nodes", metavar="N", help=NODES_HELP)
    parser.add_argument("name", nargs="?", help=name_help)
    parser.add_argument(
        "--group", help="a worker group of the cluster: N is then its worker jobs (0 or more)"
    )


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
