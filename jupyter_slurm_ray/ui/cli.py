"""``jupyter slurm-ray list | down | logs | extend | scale | forget | gc | doctor | dashboard``:
the clusters, and whether they can work here, from a terminal (``--version``: the package's)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence

from ..config import SlurmRay
from ..errors import SlurmRayError
from ..inventory import Orphan
from ..session import Session
from . import commands
from .adaptcommand import adapt_command
from .arguments import (
    LIST_ALL_HELP,
    NAME_HELP,
    add_adapt_arguments,
    add_arguments,
    add_scale_arguments,
)
from .magic_args import add_doctor_arguments, setup_lines, spec_arguments
from .version import installed_version

__all__ = ["main", "parser"]

Ask = Callable[[str], str]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jupyter slurm-ray",
        description="Ray clusters on Slurm started from Jupyter: list, stop, read logs, clean up. "
        "Settings come from JUPYTER_SLURM_RAY_* variables (e.g. JUPYTER_SLURM_RAY_LOGIN_HOST).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {installed_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    listing = sub.add_parser("list", help="every cluster in the registry, live ones first")
    listing.add_argument("--all", action="store_true", help=LIST_ALL_HELP)
    _cluster_command(sub, "down", "stop a cluster (or --all)")
    _cluster_command(sub, "logs", "a cluster's job output, or one node's Ray log")
    _cluster_command(
        sub,
        "extend",
        "add walltime to a cluster's job: extend NAME +30",
        "Runs scontrol update JobId=… TimeLimit=+N. Many sites allow only "
        "operators to raise a time limit; Slurm's refusal is shown with what to do.",
    )
    scale = sub.add_parser(
        "scale",
        help="scale a cluster to N Ray nodes in all: scale N NAME",
        description="The cluster's owner (the kernel or server that started it, attached it "
        "while no live process owned it, or took it over) submits one-node worker jobs, or "
        "drains running ones through Ray and cancels them (pending ones first); this command "
        "asks the owner to.",
    )
    add_scale_arguments(scale, NAME_HELP)
    adapt = sub.add_parser(
        "adapt",
        help="adaptive scaling of a cluster: adapt NAME --maximum N [--minimum N], or --off",
        description="The cluster's owner grows it with worker jobs for Ray's pending work and "
        "retires idle ones, between --minimum and --maximum Ray nodes in all; this command "
        "asks the owner to.",
    )
    add_adapt_arguments(adapt, NAME_HELP)
    gc = sub.add_parser(
        "gc",
        help="cancel our jobs that no live record owns; prune ended clusters' job dirs and packs",
        description="Find Slurm jobs tagged jupyter-slurm-ray:<id> whose record is missing, or "
        "whose owning kernel is gone without detaching, and offer to cancel each. Then remove "
        "what ended clusters left on disk once SlurmRay.record_retention_days (7) have passed: "
        "their job dirs (ended by their record, or by Slurm's word when the record is gone), "
        "the packs no remaining job dir names, and this machine's cached packs; never what a "
        "live cluster uses.",
    )
    gc.add_argument("--yes", action="store_true", help="cancel and remove without asking")
    gc.add_argument(
        "--dry-run",
        action="store_true",
        help="only show what would be cancelled and removed, and the space it would free",
    )
    gc.add_argument("jobs", nargs="*", metavar="JOB", help="only these job ids or cluster ids")
    _cluster_command(
        sub,
        "forget",
        "delete the record of an ended cluster (or --ended: of every ended one)",
        "Ended clusters' records are also forgotten by themselves after "
        "SlurmRay.record_retention_days (7). The job dir, with its logs, is kept.",
    )
    doctor = sub.add_parser(
        "doctor",
        help="check that clusters can work here (a checklist, each ✗ with its fix)",
        description="Slurm, the request (these options, as `up` takes them), the job dir root, "
        "the cluster's Python and Ray on a compute node (a short test job, always cancelled), "
        "the node's address from the login node, the extensions. Exit status 1 when a check "
        "fails.",
    )
    add_doctor_arguments(doctor)
    doctor.add_argument("--json", action="store_true", help="the checklist as JSON")
    dashboard = sub.add_parser(
        "dashboard",
        help="serve a cluster's Ray dashboard on this host's loopback until Ctrl-C",
        description="Prints a URL on 127.0.0.1 (forward that port to open it from a laptop: "
        "ssh -L PORT:127.0.0.1:PORT). The URL holds an unguessable segment that stands for "
        "this cluster while the command runs; the cluster's Ray token is never in a URL.",
    )
    dashboard.add_argument("name", nargs="?", help=NAME_HELP)
    dashboard.add_argument(
        "--port", type=int, default=0, help="the local port (default: any free one)"
    )
    return parser


def parser() -> argparse.ArgumentParser:
    """The command's parser (the documentation's reference shows its --help)."""
    return _parser()


def _cluster_command(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    command: str,
    summary: str,
    description: str | None = None,
) -> None:
    """A command on one cluster (NAME), with the arguments ``arguments.add_arguments`` gives it."""
    parser = sub.add_parser(command, help=summary, description=description)
    add_arguments(command, parser, NAME_HELP)


def main(argv: Sequence[str] | None = None, ask: Ask = input) -> int:
    """Run one command; the exit status is 0 on success, 1 on an error, 2 on bad usage."""
    args = _parser().parse_args(argv)
    session = Session(SlurmRay())
    try:
        return int(_COMMANDS[args.command](session, args, ask) or 0)
    except SlurmRayError as exc:
        print(f"jupyter slurm-ray: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _list(session: Session, args: argparse.Namespace, ask: Ask) -> int:
    print(commands.list_table(session, ended=args.all))
    return 0


def _down(session: Session, args: argparse.Namespace, ask: Ask) -> int:
    if not (args.all or args.name):
        raise SlurmRayError("give a cluster NAME or --all")
    print("\n".join(commands.down(session, args.name, everything=args.all)))
    return 0


def _logs(session: Session, args: argparse.Namespace, ask: Ask) -> int:
    print(commands.logs(session, args.name, node=args.node, tail=args.tail))
    return 0


def _extend(session: Session, args: argparse.Namespace, ask: Ask) -> int:
    if not args.name:
        raise SlurmRayError("give a cluster NAME and the walltime to add, e.g. extend ray +30")
    print("\n".join(commands.extend(session, args.name, args.amount)))
    return 0


def _scale(session: Session, args: argparse.Namespace, ask: Ask) -> int:
    if not args.name:
        raise SlurmRayError("give the node count and a cluster NAME, e.g. scale 3 ray")
    print("\n".join(commands.scale(session, args.name, args.nodes, args.group)))
    return 0


def _adapt(session: Session, args: argparse.Namespace, ask: Ask) -> int:
    if not args.name:
        raise SlurmRayError("give a cluster NAME, e.g. adapt ray --maximum 4")
    print("\n".join(adapt_command(session, args)))
    return 0


def _forget(session: Session, args: argparse.Namespace, ask: Ask) -> int:
    print("\n".join(commands.forget(session, args.name, ended=args.ended)))
    return 0


def _gc(session: Session, args: argparse.Namespace, ask: Ask) -> int:
    lines = commands.gc(
        session,
        args.jobs,
        lambda o: args.yes or _confirm(o, ask),
        dry_run=args.dry_run,
        confirm_removal=lambda question: args.yes or _yes(f"{question} [y/N] ", ask),
    )
    print("\n".join(lines))
    return 0


def _confirm(orphan: Orphan, ask: Ask) -> bool:
    question = f"cancel job {orphan.job_id} (cluster {orphan.cluster_id}: {orphan.why})? [y/N] "
    return _yes(question, ask)


def _yes(question: str, ask: Ask) -> bool:
    try:
        return ask(question).strip().lower() in ("y", "yes")
    except EOFError:
        return False


def _doctor(session: Session, args: argparse.Namespace, ask: Ask) -> int:
    report = commands.doctor(
        session,
        spec_arguments(args),
        profile=args.profile,
        setup=setup_lines(args),
        queue_timeout=args.queue_timeout,
    )
    print(report.to_json() if args.json else report.text())
    return 0 if report.ok else 1


def _dashboard(session: Session, args: argparse.Namespace, ask: Ask) -> int:
    from .dashboardserver import serve_dashboard

    if not args.name:
        raise SlurmRayError("give a cluster NAME, e.g. dashboard ray (list shows them)")
    cluster = session.find(args.name)
    if not cluster.state.is_up:
        raise SlurmRayError(
            f"{cluster.spec.name} has no dashboard now ({cluster.state}); it has one while "
            "READY (jupyter slurm-ray list shows the state)"
        )
    serve_dashboard(cluster.id, cluster.spec.name, args.port, tell=_say)
    return 0


def _say(line: str) -> None:
    print(line, flush=True)


_COMMANDS: dict[str, Callable[[Session, argparse.Namespace, Ask], int]] = {
    "list": _list,
    "down": _down,
    "logs": _logs,
    "extend": _extend,
    "scale": _scale,
    "adapt": _adapt,
    "gc": _gc,
    "forget": _forget,
    "doctor": _doctor,
    "dashboard": _dashboard,
}


def console_main() -> None:
    """The ``jupyter slurm-ray`` command (and ``jupyter-slurm-ray``): logs to stderr, exits."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    sys.exit(main())


if __name__ == "__main__":  # pragma: no cover
    console_main()
