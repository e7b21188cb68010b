"""``%slurm_ray`` line magics and ``%%slurm_ray up`` (whose cell body is setup lines).

Every error reaches the user as one ``UsageError`` line without a traceback; nothing is submitted
unless the request passed validation and the site check (partition, account, QOS, their limits)
first. The live view prints the walltime warning once and, when the cluster ends, its usage.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.display import display

from ..aio import run_sync
from ..client.rayinit import client_connection
from ..client.taskoutput import task_output
from ..cluster import SlurmRayCluster
from ..config import (
    POSITIVE_SETTINGS,
    SPEC_SETTINGS,
    SlurmRay,
    effective_setting,
    load_profiles,
    profiles_path,
)
from ..config import resolve_spec as resolve_settings
from ..errors import SlurmRayError, SpecError
from ..session import get_session
from ..spec import ClusterSpec, ignored_by_mode
from ..states import State
from ..usecases import submit
from . import commands
from .adaptcommand import adapt_command
from .clientlimits import explain_ray_client_limits
from .formatting import dashboard_links, status_line
from .live import Notices, StatusView, TextProgress, frontend_has_widgets
from .magic_args import ArgumentError, HelpRequested, parse, setup_lines, spec_arguments
from .reprs import cluster_line, cluster_mimebundle

log = logging.getLogger(__name__)

__all__ = ["SlurmRayMagics", "load_ipython_extension"]

_TIME_REQUIRED = (
    "a walltime is required: pass -t 1:00:00, or set %config SlurmRay.time or a profile's time"
)
DIRECT_DASHBOARD_HINT = (
    "(the direct address asks for the cluster's token; from a terminal, "
    "`jupyter slurm-ray dashboard {name}` serves the dashboard on loopback without it)"
)
_SESSION_SETTINGS = (
    "default_profile",
    "profiles_file",
    *POSITIVE_SETTINGS,
    "login_host",
    "login_user",
    "login_port",
    "ssh_key",
    "known_hosts",
    "command_prefix",
)


@magics_class
class SlurmRayMagics(Magics):
    """``%slurm_ray COMMAND …``: up, down, status, list, logs, extend, scale, adapt, attach,
    connect, disconnect, forget, script, dashboard, config, panel, doctor. ``%slurm_ray --help``
    lists them."""

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        shell.configurables[:] = [c for c in shell.configurables if not isinstance(c, SlurmRay)]
        self.settings = SlurmRay(parent=shell)
        shell.configurables.append(self.settings)
        self.session = get_session(self.settings)
        explain_ray_client_limits(shell, client_connection)

    @line_cell_magic
    def slurm_ray(self, line: str, cell: str | None = None) -> None:
        """Ray clusters in Slurm allocations: ``%slurm_ray --help`` lists the commands."""
        try:
            args = parse(line, cell=cell is not None)
            getattr(self, f"_{args.command}")(args, cell)
        except HelpRequested as shown:
            print(str(shown).rstrip())
        except (ArgumentError, SlurmRayError) as exc:
            raise UsageError(str(exc)) from None

    # -- helpers --------------------------------------------------------------------------
    def _resolve(
        self, args: argparse.Namespace, cell: str | None = None
    ) -> tuple[ClusterSpec, dict[str, str]]:
        """The spec these options mean and each field's source; ``--setup`` lines and the cell
        body run after the configured setup lines."""
        spec, sources = resolve_settings(
            spec_arguments(args), profile=args.profile, config=self.settings
        )
        extra = setup_lines(args, cell)
        if extra:
            origin = "cell" if cell is not None else "argument"
            configured = sources["setup"]
            sources["setup"] = f"{configured} + {origin}" if spec.setup else origin
            spec = spec.replace(setup=(*spec.setup, *extra))
        return spec, sources

    def _complete(self, args: argparse.Namespace, cell: str | None = None) -> ClusterSpec:
        """The spec to submit: a walltime is required (except with --here: the allocation's
        applies), and the settings left out for the mode are told."""
        spec, sources = self._resolve(args, cell)
        if spec.needs_walltime:
            raise SpecError("time", None, _TIME_REQUIRED)
        for note in ignored_by_mode(sources):
            print(f"note: {note}")
        return spec

    def _connect_timeout(self) -> float:
        return float(self.session.setting("connect_timeout", 30.0))

    def _refuse_second_connection(self, cluster: SlurmRayCluster | None) -> None:
        other = self.session.connected()
        if other is not None and other is not cluster:
            raise SlurmRayError(
                f"this kernel is connected to cluster {other.spec.name} ({other.id}); Ray Client "
                "allows one connection per process: `%slurm_ray disconnect` or `down` it first, "
                "or use --no-connect"
            )

    def _show_live(self, cluster: SlurmRayCluster) -> TextProgress | None:
        """The live view: a widget (with its notices), or printed lines in a terminal, whose
        notices (walltime warning, usage at the end) keep printing after ``up`` returns."""
        if frontend_has_widgets():
            display(StatusView(cluster))
            return None
        Notices(cluster, lambda line: print(line, flush=True))
        return TextProgress(cluster)

    def _summary(self, cluster: SlurmRayCluster) -> None:
        print(f"{cluster.spec.name} ({cluster.id}): {cluster_line(cluster)}")
        links = dashboard_links(cluster.id, cluster.dashboard_url)
        if links and cluster.state.is_up:
            print(f"dashboard: {links.get('proxied') or links['direct']}")

    # -- subcommands ----------------------------------------------------------------------
    def _up(self, args: argparse.Namespace, cell: str | None) -> None:
        spec = self._complete(args, cell)
        if not args.no_connect:
            self._refuse_second_connection(None)
        cluster = self.session.new_cluster(spec)
        progress = self._show_live(cluster)
        try:
            run_sync(submit(cluster, connect=not args.no_connect, tell=_print_note))
            self.session.adopt(cluster)
            if args.detach:
                cluster.detach()
            cluster.wait_up(
                connect=not args.no_connect,
                queue_timeout=args.queue_timeout,
                connect_timeout=self._connect_timeout(),
            )
        except KeyboardInterrupt:
            if cluster.job_id is None and cluster.job_dir is None:  # during the site check
                print(f"interrupted: nothing of {cluster.spec.name} was submitted")
                return
            print(
                f"interrupted: {cluster.spec.name} is {status_line(cluster.status)} and keeps "
                "going; `%slurm_ray status` shows it, `%slurm_ray down` stops it"
            )
            return
        finally:
            if progress is not None:
                progress.close()
        self._summary(cluster)

    def _down(self, args: argparse.Namespace, cell: str | None) -> None:
        print("\n".join(commands.down(self.session, args.name, everything=args.all)))

    def _status(self, args: argparse.Namespace, cell: str | None) -> None:
        cluster = self.session.find(args.name)
        cluster.refresh()  # ask Slurm now (the property is the last answer)
        if cluster.job_id and cluster.state not in (State.SUBMITTING, State.PENDING):
            cluster.usage()  # one sacct (the repr shows it); final figures are kept
        display(cluster_mimebundle(cluster), raw=True)

    def _list(self, args: argparse.Namespace, cell: str | None) -> None:
        print(commands.list_table(self.session, ended=args.all))

    def _logs(self, args: argparse.Namespace, cell: str | None) -> None:
        print(commands.logs(self.session, args.name, node=args.node, tail=args.tail))

    def _extend(self, args: argparse.Namespace, cell: str | None) -> None:
        print("\n".join(commands.extend(self.session, args.name, args.amount)))

    def _scale(self, args: argparse.Namespace, cell: str | None) -> None:
        print("\n".join(commands.scale(self.session, args.name, args.nodes, args.group)))

    def _adapt(self, args: argparse.Namespace, cell: str | None) -> None:
        print("\n".join(adapt_command(self.session, args)))

    def _forget(self, args: argparse.Namespace, cell: str | None) -> None:
        print("\n".join(commands.forget(self.session, args.name, ended=args.ended)))

    def _attach(self, args: argparse.Namespace, cell: str | None) -> None:
        cluster = self.session.find(args.name)
        if cluster.id not in self.session.clusters or args.takeover:
            cluster.attach(takeover=args.takeover)
        self.session.adopt(cluster)
        if not args.no_connect and cluster.state in (State.READY, State.DEGRADED):
            self._refuse_second_connection(cluster)
            cluster.connect(timeout=self._connect_timeout())
        self._summary(cluster)
        self._tell_observing(cluster)

    def _connect(self, args: argparse.Namespace, cell: str | None) -> None:
        cluster = self.session.find(args.name)
        self._refuse_second_connection(cluster)
        if cluster.id not in self.session.clusters:
            cluster.attach()
        self.session.adopt(cluster)
        cluster.connect(timeout=self._connect_timeout())
        self._summary(cluster)
        self._tell_observing(cluster)

    def _tell_observing(self, cluster: SlurmRayCluster) -> None:
        if cluster.observing and not cluster.state.is_final:
            name = cluster.spec.name
            print(
                f"this kernel observes {name}: its exit leaves the cluster running; "
                f"`%slurm_ray attach {name} --takeover` makes this kernel its owner"
            )

    def _disconnect(self, args: argparse.Namespace, cell: str | None) -> None:
        cluster = self.session.connected()
        if cluster is None:
            print("this kernel is not connected to a cluster")
            return
        cluster.disconnect()
        self._summary(cluster)

    def _script(self, args: argparse.Namespace, cell: str | None) -> None:
        spec = self._complete(args)
        print(self.session.new_cluster(spec).script(), end="")

    def _dashboard(self, args: argparse.Namespace, cell: str | None) -> None:
        cluster = self.session.find(args.name)
        links = dashboard_links(cluster.id, cluster.dashboard_url) if cluster.state.is_up else {}
        if not links:
            raise SlurmRayError(
                f"{cluster.spec.name} has no dashboard now ({status_line(cluster.status)}); "
                "it has one once READY in this kernel (up, attach or connect)"
            )
        url = links.get("proxied") or links["direct"]
        text = "\n".join(f"{kind}: {link}" for kind, link in links.items())
        if "proxied" not in links:  # no Jupyter server with the extension runs this kernel
            text += f"\n{DIRECT_DASHBOARD_HINT.format(name=cluster.spec.name)}"
        markup = f'<a href="{url}" target="_blank" rel="noopener">Ray dashboard of '
        markup += f"{cluster.spec.name}</a>"
        display({"text/plain": text, "text/html": markup}, raw=True)

    def _config(self, args: argparse.Namespace, cell: str | None) -> None:
        spec, sources = self._resolve(args)
        values = spec.to_dict()
        rows = [(name, values[name], sources[name]) for name in ("name", *SPEC_SETTINGS)]
        for name in _SESSION_SETTINGS:
            value, source = effective_setting(name, self.settings)
            rows.append((name, value, source))
        path = profiles_path(self.settings)
        names = ", ".join(sorted(load_profiles(path))) or "none"
        width = max(len(name) for name, _, _ in rows)
        lines = [f"{name:<{width}}  {value!r:<30}  {source}" for name, value, source in rows]
        lines.append(f"profiles in {path}: {names}")
        print("\n".join(lines))

    def _doctor(self, args: argparse.Namespace, cell: str | None) -> None:
        report = commands.doctor(
            self.session,
            spec_arguments(args),
            profile=args.profile,
            setup=setup_lines(args),
            queue_timeout=args.queue_timeout,
        )
        display(report)

    def _panel(self, args: argparse.Namespace, cell: str | None) -> None:
        from .widget import ClusterPanel

        display(ClusterPanel(session=self.session))


def _print_note(note: str) -> None:
    print(f"note: {note}")


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext jupyter_slurm_ray``."""
    ipython.register_magics(SlurmRayMagics(ipython))
    # a cell that waited on Ray ends once what its tasks printed has arrived (under it)
    if task_output.settle not in ipython.events.callbacks["post_run_cell"]:
        ipython.events.register("post_run_cell", task_output.settle)
