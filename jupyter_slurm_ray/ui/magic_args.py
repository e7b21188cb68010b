"""The ``%slurm_ray`` command line: subcommands, their options, and help, parsed without exiting.

Parsing never exits the kernel and never prints a traceback: a bad option raises
:class:`ArgumentError` (one line naming the subcommand), ``--help`` raises :class:`HelpRequested`
carrying the help text.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
from typing import Any, NoReturn

from ..errors import ArgumentError, HelpRequested
from ..spec import ClusterSpec
from ..spec.groups import parse_group_option
from .arguments import (
    LIST_ALL_HELP,
    NAME_HELP,
    add_adapt_arguments,
    add_arguments,
    add_scale_arguments,
)

__all__ = [
    "SUBCOMMANDS",
    "ArgumentError",
    "HelpRequested",
    "add_doctor_arguments",
    "parse",
    "parsers",
    "setup_lines",
    "spec_arguments",
]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ArgumentError(f"{self.prog}: {message} (see {self.prog} --help)")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise ArgumentError(message or f"{self.prog}: exit {status}")

    def print_help(self, file: Any = None) -> None:
        raise HelpRequested(self.format_help())


# Options of `up`, `script` and `config` that set cluster settings: (flags, field); the help
# text is the field's own (spec/__init__.py).
_SPEC_OPTIONS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("-N", "--nodes"), "nodes"),
    (("-p", "--partition"), "partition"),
    (("-t", "--time"), "time"),
    (("-A", "--account"), "account"),
    (("-q", "--qos"), "qos"),
    (("-c", "--cpus-per-node"), "cpus_per_node"),
    (("--mem",), "mem_per_node"),
    (("-G", "--gpus-per-node"), "gpus_per_node"),
    (("-C", "--constraint"), "constraint"),
    (("--reservation",), "reservation"),
    (("--export-env",), "export_env"),
    (("--python",), "python"),
    (("--container",), "container"),
    (("--container-runtime",), "container_runtime"),
    (("--environment",), "environment"),
    (("--worker-rotation",), "worker_rotation"),
    (("--connect",), "connect"),
)
_HELP = {f.name: f.metadata["help"] for f in dataclasses.fields(ClusterSpec)}


def _add_spec_options(parser: argparse.ArgumentParser) -> None:
    for flags, field in _SPEC_OPTIONS:
        metavar = field.split("_")[0].upper()
        parser.add_argument(*flags, dest=field, metavar=metavar, help=_HELP[field])
    parser.add_argument(
        "--exclusive", action="store_const", const=True, default=None, help=_HELP["exclusive"]
    )
    parser.add_argument(
        "--setup",
        action="append",
        metavar="LINE",
        help="a shell line run before Ray starts, after the configured ones (repeatable; "
        "%%%%slurm_ray up takes them from the cell body)",
    )
    parser.add_argument("--name", help=_HELP["name"])
    parser.add_argument("--profile", help="a profile from the profiles file")
    parser.add_argument(
        "--worker-group",
        action="append",
        metavar="GROUP:KEY=VALUE,...",
        help="a worker group for scale/adapt, e.g. gpu:partition=gpu,gpus_per_node=1 "
        "(repeatable; added to the configured ones)",
    )


def add_doctor_arguments(parser: argparse.ArgumentParser) -> None:
    """``doctor``'s options, in the magic and the CLI: the request to check, and its limits."""
    _add_spec_options(parser)
    parser.add_argument(
        "--queue-timeout",
        type=float,
        default=120.0,
        metavar="S",
        help="give up on the test job after S s in the queue (default 120)",
    )


def spec_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """The cluster settings given on the line (None for those not given)."""
    arguments = {field: getattr(args, field) for _, field in _SPEC_OPTIONS}
    arguments["exclusive"] = args.exclusive
    arguments["name"] = args.name
    arguments["mode"] = "local" if getattr(args, "local", False) else None
    if getattr(args, "here", False):
        if arguments["mode"] == "local":
            raise ArgumentError("%slurm_ray: --local and --here exclude each other")
        arguments.update(_here_arguments(args))
    groups = [parse_group_option(text) for text in getattr(args, "worker_group", None) or ()]
    arguments["worker_groups"] = dict(groups) if groups else None
    arguments["here_nodes"] = arguments.get("here_nodes", getattr(args, "here_nodes", None))
    arguments["here_kernel_tasks"] = getattr(args, "here_kernel_tasks", None)
    return arguments


def _add_local_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--local",
        action="store_true",
        help='local mode: Ray as processes of this machine (one node), no Slurm (mode = "local")',
    )
    parser.add_argument(
        "--here",
        action="store_true",
        help="Ray on the nodes of the Slurm allocation this kernel runs in, as steps of it (no "
        'new job; mode = "here"); -N N: N of its nodes',
    )
    parser.add_argument("--here-nodes", metavar="NODES", help=_HELP["here_nodes"])
    parser.add_argument(
        "--here-no-kernel-tasks",
        dest="here_kernel_tasks",
        action="store_const",
        const=False,
        default=None,
        help=_HELP["here_kernel_tasks"],
    )


def _here_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """``--here``: mode 'here'; ``-N N`` means N of the allocation's nodes (``here_nodes``)."""
    here_nodes = args.here_nodes
    if args.nodes is not None:
        if here_nodes is not None:
            raise ArgumentError("%slurm_ray: with --here, give -N or --here-nodes, not both")
        here_nodes = args.nodes
    return {"mode": "here", "here_nodes": here_nodes, "nodes": None}


def setup_lines(args: argparse.Namespace, cell: str | None = None) -> list[str]:
    """Setup lines from ``--setup`` and the cell body, run after the configured ones."""
    lines = list(args.setup or [])
    if cell is not None:
        lines.extend(line for line in cell.splitlines() if line.strip())
    return lines


_NAME_HELP = "a cluster name, id or Slurm job id (default: this kernel's current cluster)"


def _build() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    root = _Parser(
        prog="%slurm_ray",
        description="Ray clusters in Slurm allocations, from this kernel.",
        epilog="Each subcommand has --help. Settings: %config SlurmRay, profiles, "
        "JUPYTER_SLURM_RAY_* variables; `%slurm_ray config` shows what applies.",
    )
    sub = root.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    parsers: dict[str, argparse.ArgumentParser] = {}

    def add(name: str, help: str) -> argparse.ArgumentParser:
        parser = sub.add_parser(name, help=help, description=help)
        parsers[name] = parser
        return parser

    up = add("up", "Start a Ray cluster in a Slurm allocation, wait for it and connect.")
    _add_spec_options(up)
    _add_local_option(up)
    up.add_argument("--detach", action="store_true", help="keep it running after this kernel")
    up.add_argument("--no-connect", action="store_true", help="do not connect this kernel")
    up.add_argument("--queue-timeout", type=float, metavar="S", help="give up after S s queued")

    down = add("down", "Stop a cluster (disconnect, cancel the job, wait until it ended).")
    add_arguments("down", down, _NAME_HELP)

    for name, help in (
        ("status", "Show a cluster's state, asking Slurm now."),
        ("connect", "Connect this kernel to a cluster with Ray Client."),
        ("dashboard", "Link to a cluster's Ray dashboard (through Jupyter when possible)."),
    ):
        add(name, help).add_argument("name", nargs="?", help=_NAME_HELP)

    add("disconnect", "Disconnect this kernel's Ray Client (the cluster keeps running).")
    listing = add("list", "Every cluster in the registry (all kernels), live ones first.")
    listing.add_argument("--all", action="store_true", help=LIST_ALL_HELP)
    add("panel", "Open the cluster panel (form, buttons, live status, log tail).")

    add_arguments("logs", add("logs", "Show the job's output, or one node's Ray log."), _NAME_HELP)

    extend = add("extend", "Add walltime to a cluster's job (scontrol update TimeLimit=+N).")
    add_arguments("extend", extend, _NAME_HELP)

    scale = add(
        "scale",
        "Scale a cluster to N Ray nodes in all: one-node worker jobs are submitted, or drained "
        "through Ray and cancelled (pending ones first).",
    )
    add_scale_arguments(scale, _NAME_HELP)

    adapt = add(
        "adapt",
        "Scale a cluster between --minimum and --maximum Ray nodes in all as Ray's pending "
        "work needs (worker jobs submitted, idle ones retired), or --off.",
    )
    add_adapt_arguments(adapt, _NAME_HELP)

    forget = add("forget", "Delete the record of an ended cluster (its job dir stays).")
    add_arguments("forget", forget, NAME_HELP)

    attach = add(
        "attach",
        "Watch a running cluster from this kernel and connect: its owner if no live process "
        "owns it (e.g. after a kernel restart), else an observer, whose exit leaves it running.",
    )
    attach.add_argument("name", help="a cluster name, id or Slurm job id from the registry")
    attach.add_argument("--no-connect", action="store_true", help="do not connect this kernel")
    attach.add_argument(
        "--takeover",
        action="store_true",
        help="make this kernel the owner even though another process owns it (that one stops "
        "renewing its lease, scaling it and cancelling it at exit)",
    )

    script = add("script", "Print the job script `up` would submit with these options.")
    _add_spec_options(script)
    _add_local_option(script)

    doctor = add(
        "doctor",
        "Check that clusters can work here: Slurm, the request, the job dir root, the "
        "cluster's Python and Ray on a compute node (a short test job), the node's address, "
        "the extensions; each ✗ with its fix.",
    )
    add_doctor_arguments(doctor)

    config = add("config", "Show the settings `up` would use and where each comes from.")
    _add_spec_options(config)
    _add_local_option(config)
    return root, parsers


def parse(line: str, *, cell: bool = False) -> argparse.Namespace:
    """Parse one magic line; ``cell`` (for %%slurm_ray) allows only ``up``. A ``#`` outside
    quotes starts a comment (``-t 10  # ten minutes``)."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError as exc:
        raise ArgumentError(f"%slurm_ray: cannot split the line: {exc}") from None
    root, _ = _build()
    if not words:
        raise HelpRequested(root.format_help())
    args, extra = root.parse_known_args(words)
    if extra:
        prog = f"%slurm_ray {args.command}" if args.command else "%slurm_ray"
        unknown = " ".join(extra)
        raise ArgumentError(f"{prog}: unrecognized arguments: {unknown} (see {prog} --help)")
    if cell and args.command != "up":
        raise ArgumentError("%%slurm_ray: only `%%slurm_ray up …` takes a cell body (setup lines)")
    return args


def parsers() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The magic's parser and each subcommand's (the documentation's reference shows them)."""
    return _build()


SUBCOMMANDS: tuple[str, ...] = tuple(_build()[1])
