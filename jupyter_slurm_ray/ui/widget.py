"""``ClusterPanel``: the ipywidgets panel to request, watch, connect and stop a cluster.

The form is filled from the effective settings (config, env, profile), the partitions sinfo
reports and the user's accounts and QOSes (sacctmgr; the defaults selected). Up checks the
request against all of them first. Up/Stop/Connect run on the package's background loop, so a
click never blocks the kernel; the live status, nodes bar and log tail are pushed from the
cluster's observers.
"""

from __future__ import annotations

import asyncio
import html
import logging
from collections.abc import Coroutine
from typing import Any

import ipywidgets as widgets

from ..aio import background_loop, run_sync
from ..cluster import SlurmRayCluster
from ..config import Profile, effective_setting, load_profiles, profiles_path, resolve_spec
from ..errors import SlurmRayError
from ..scheduler.kinds import enclosing_job, kind_for_mode
from ..scheduler.records import Partition
from ..session import Session, get_session
from ..slurm.accounting import Accounting, load_accounting
from ..slurm.client import SlurmClient
from ..slurm.memorypolicy import MemoryPolicy, load_memory_policy
from ..slurm.sitecheck import check_spec, describe_partition
from ..spec import ClusterSpec
from ..states import State, Status
from ..usecases import scale, submit
from .live import StatusView

log = logging.getLogger(__name__)

__all__ = ["ClusterPanel"]

_LABEL = {"description_width": "7em"}
_CONNECT_HELP = ClusterSpec.__dataclass_fields__["connect"].metadata["help"]
_WIDE = widgets.Layout(width="34em")
_NARROW = widgets.Layout(width="16em")


class ClusterPanel(widgets.VBox):
    """A form (profile, partition, account, QOS, nodes, CPUs, GPUs, memory, walltime, name),
    Up / Stop / Connect, and the live state of the cluster it started or was given."""

    def __init__(
        self,
        session: Session | None = None,
        cluster: SlurmRayCluster | None = None,
        log_lines: int = 15,
    ) -> None:
        self.session = session or get_session()
        self.log_lines = log_lines
        self.cluster: SlurmRayCluster | None = None
        self.partitions: list[Partition] = []
        self.accounting = Accounting(unavailable="not asked yet")
        self.memory_policy: MemoryPolicy | None = None  # the site's memory policy, once asked
        self._stop_requested: set[str] = set()  # ids of clusters whose Stop was clicked
        self.message = widgets.HTML()
        self._build_form()
        self.up_button = widgets.Button(description="Up", button_style="success", icon="play")
        self.stop_button = widgets.Button(description="Stop", button_style="danger", icon="stop")
        self.connect_button = widgets.Button(description="Connect", icon="plug")
        self.up_button.on_click(lambda _: self.up())
        self.stop_button.on_click(lambda _: self.stop())
        self.connect_button.on_click(lambda _: self.connect())
        self.grow_button = widgets.Button(icon="plus", tooltip="one node more (a worker job)")
        self.shrink_button = widgets.Button(
            icon="minus", tooltip="one node less (pending worker jobs first, else drained)"
        )
        self.grow_button.on_click(lambda _: self.scale_by(1))
        self.shrink_button.on_click(lambda _: self.scale_by(-1))
        for button in (self.grow_button, self.shrink_button):
            button.layout = widgets.Layout(width="3em")
        self.status_view = StatusView()
        self.log_tail = widgets.Textarea(
            disabled=True, layout=widgets.Layout(width="100%", height="12em")
        )
        logs = widgets.Accordion([self.log_tail], titles=("log tail",))
        buttons = widgets.HBox(
            [
                self.up_button,
                self.stop_button,
                self.connect_button,
                self.shrink_button,
                self.grow_button,
            ]
        )
        title = widgets.HTML("<b>Ray on Slurm</b>")
        super().__init__([title, self.form, buttons, self.message, self.status_view, logs])
        self._load_choices()
        if cluster is not None:
            self.bind(cluster)
        self._update_buttons(self.cluster.status if self.cluster else None)

    # -- the form -------------------------------------------------------------------------
    def _build_form(self) -> None:
        def text(description: str, placeholder: str = "") -> widgets.Text:
            return widgets.Text(
                description=description, placeholder=placeholder, style=_LABEL, layout=_NARROW
            )

        def number(description: str, low: int) -> widgets.BoundedIntText:
            return widgets.BoundedIntText(
                value=low, min=low, max=100000, description=description, style=_LABEL,
                layout=_NARROW,
            )  # fmt: skip

        self.profile = widgets.Dropdown(description="profile", style=_LABEL, layout=_WIDE)
        self.partition = widgets.Dropdown(description="partition", style=_LABEL, layout=_WIDE)
        self.account = widgets.Dropdown(description="account", style=_LABEL, layout=_NARROW)
        self.qos = widgets.Dropdown(description="QOS", style=_LABEL, layout=_NARROW)
        self.nodes = number("nodes", 1)
        self.cpus = number("CPUs/node", 0)
        self.gpus = number("GPUs/node", 0)
        self.memory = text("memory/node", "e.g. 16G")
        self.walltime = text("walltime", "e.g. 1:00:00")
        self.name = text("name", "ray")
        self.connect_mode = widgets.Dropdown(
            description="connect",
            options=[("auto", "auto"), ("Ray driver", "driver"), ("Ray Client", "client")],
            style=_LABEL,
            layout=_NARROW,
        )
        self.connect_mode.tooltip = _CONNECT_HELP
        self.cpus.tooltip = "0: the partition's default"
        self.here = widgets.Checkbox(
            description="in this allocation (--here: Ray on its nodes, no new job)",
            indent=False,
            layout=widgets.Layout(display="" if _allocation_nodes() else "none"),
        )
        self.here.observe(lambda change: self._here_toggled(change["new"]), "value")
        self.profile.observe(lambda change: self._fill(change["new"]), "value")
        self.account.observe(lambda change: self._offer_qos(change["new"]), "value")
        self.partition.observe(lambda change: self._offer_qos(self.account.value), "value")
        self.form = widgets.VBox(
            [
                self.here,
                self.profile,
                self.partition,
                widgets.HBox([self.account, self.qos]),
                widgets.HBox([self.nodes, self.cpus, self.gpus]),
                widgets.HBox([self.memory, self.walltime, self.name]),
                self.connect_mode,
            ]
        )

    def _here_toggled(self, here: bool) -> None:
        """--here: the allocation's partition, account, QOS and walltime apply; nodes counts
        its nodes (all of them to start with)."""
        for field in (self.partition, self.account, self.qos, self.walltime):
            field.disabled = here
        if here:
            self.nodes.value = _allocation_nodes() or self.nodes.value

    def _local_mode(self, profiles: dict[str, Profile]) -> bool:
        """Local mode (the jobs are this machine's processes) by the settings, or else by the
        profile the form starts with."""
        mode, _ = effective_setting("mode", self.session.config)
        if mode is None:
            default, _ = effective_setting("default_profile", self.session.config)
            profile = profiles.get(default) if default else None
            mode = profile.settings.get("mode") if profile else None
        return bool(mode) and kind_for_mode(str(mode)).on_this_machine

    def _load_choices(self) -> None:
        try:
            profiles = load_profiles(profiles_path(self.session.config))
            names = sorted(profiles)
            if self._local_mode(profiles):  # no Slurm asked
                self.accounting = Accounting(unavailable="local mode (Ray on this machine)")
            else:
                self.partitions = run_sync(SlurmClient(self.session.transport()).partitions())
                self.accounting = run_sync(load_accounting(self.session.transport()))
                self.memory_policy = run_sync(load_memory_policy(self.session.transport()))
        except SlurmRayError as exc:
            self._error(str(exc))
            names = []
        self.partition.options = [("(Slurm's default)", "")] + [
            (describe_partition(p), p.name) for p in self.partitions
        ]
        self._offer_accounts()
        if self.accounting.unavailable:
            self._note(f"account and QOS not checked: {self.accounting.unavailable}")
        default_profile, _ = effective_setting("default_profile", self.session.config)
        self.profile.options = [("(none)", ""), *((name, name) for name in names)]
        self.profile.value = default_profile if default_profile in names else ""
        self._fill(self.profile.value)

    def _fill(self, profile: str) -> None:
        """Show what ``profile`` (with the config and env beneath it) would request."""
        try:
            spec, _ = resolve_spec(profile=profile or "", config=self.session.config)
        except SlurmRayError as exc:
            self._error(str(exc))
            return
        choices = {value for _, value in self.partition.options}
        self.partition.value = spec.partition if spec.partition in choices else ""
        self._offer_accounts(spec.account)
        self._offer_qos(self.account.value, spec.qos)
        self.nodes.value = spec.nodes
        self.cpus.value = spec.cpus_per_node or 0
        self.gpus.value = spec.gpus_per_node
        self.memory.value = f"{spec.mem_per_node}M" if spec.mem_per_node else ""
        self.walltime.value = spec.time or ""
        self.name.value = spec.name
        self.here.value = spec.scheduler_kind.in_allocation and bool(_allocation_nodes())
        self.connect_mode.value = spec.connect

    def _offer_accounts(self, wanted: str | None = None) -> None:
        """The user's accounts, the default selected (or ``wanted``, e.g. a profile's)."""
        accounts = self.accounting.accounts() if self.accounting.known else []
        default = self.accounting.default_account
        options = [(name + (" (default)" if name == default else ""), name) for name in accounts]
        if wanted and wanted not in accounts:
            options.append((f"{wanted} (not yours, per Slurm's accounting)", wanted))
        self.account.options = options or [("(Slurm's default)", "")]
        values = [value for _, value in self.account.options]
        self.account.value = (
            wanted if wanted in values else (default if default in values else values[0])
        )

    def _offer_qos(self, account: str, wanted: str | None = None) -> None:
        """The QOSes of ``account`` (in the chosen partition), its default selected."""
        partition = self.partition.value or self._default_partition()
        names = self.accounting.qos_names(account, partition) if account else []
        default = self.accounting.default_qos(account, partition) if account else None
        options = [(name + (" (default)" if name == default else ""), name) for name in names]
        if wanted and wanted not in names:
            options.append((f"{wanted} (not allowed, per Slurm's accounting)", wanted))
        current = self.qos.value
        self.qos.options = options or [("(Slurm's default)", "")]
        values = [value for _, value in self.qos.options]
        keep = current if current in values and wanted is None else None
        self.qos.value = wanted or keep or (default if default in values else values[0])

    def _default_partition(self) -> str | None:
        return next((p.name for p in self.partitions if p.is_default), None)

    def spec(self) -> ClusterSpec:
        """The spec the form asks for (SpecError when a field is not allowed). With --here,
        the allocation is checked when the cluster starts."""
        if self.here.value:
            return self._here_spec()
        arguments = {
            "partition": self.partition.value or None,
            "account": self.account.value or None,
            "qos": self.qos.value or None,
            "nodes": self.nodes.value,
            "cpus_per_node": self.cpus.value or None,
            "gpus_per_node": self.gpus.value,
            "mem_per_node": self.memory.value.strip() or None,
            "time": self.walltime.value.strip() or None,
            "name": self.name.value.strip() or None,
            "connect": self.connect_mode.value,
        }
        spec, _ = resolve_spec(arguments, profile=self.profile.value, config=self.session.config)
        policy = self.memory_policy
        check_spec(spec.require_complete(), self.partitions, self.accounting, policy)
        return spec

    def _here_spec(self) -> ClusterSpec:
        arguments = {
            "mode": "here",
            "here_nodes": str(self.nodes.value),
            "cpus_per_node": self.cpus.value or None,
            "gpus_per_node": self.gpus.value,
            "mem_per_node": self.memory.value.strip() or None,
            "name": self.name.value.strip() or None,
        }
        spec, _ = resolve_spec(arguments, profile=self.profile.value, config=self.session.config)
        return spec

    # -- actions (never block the kernel) -------------------------------------------------
    def up(self) -> None:
        """Submit what the form asks for, then wait for the cluster and connect, in the
        background."""
        try:
            spec = self.spec()
            other = self.session.connected()
            if other is not None:
                raise SlurmRayError(
                    f"this kernel is connected to {other.spec.name}: stop or disconnect it first"
                )
        except SlurmRayError as exc:
            self._error(str(exc))
            return
        cluster = self.session.adopt(self.session.new_cluster(spec))
        self.bind(cluster)
        self._run(self._up(cluster))

    def stop(self) -> None:
        """Stop the cluster; during the submit itself, as soon as sbatch has answered."""
        cluster = self.cluster
        if cluster is None or cluster.state.is_final:
            return
        self._stop_requested.add(cluster.id)
        if cluster.job_id is not None:
            self._run(cluster.down_async())

    def connect(self) -> None:
        if self.cluster is not None:
            self._run(self.cluster.connect_async(timeout=self._connect_timeout()))

    def scale_by(self, delta: int) -> None:
        """One node more or less than the cluster wants now (see elastic/workerjobs.py)."""
        cluster = self.cluster
        if cluster is None or not cluster.state.is_up:
            return
        target = cluster.status.nodes_wanted + delta
        if target < cluster.spec.nodes:
            self._note(f"{cluster.spec.name} has only its own allocation left to keep")
            return
        self._run(scale(cluster, target))
        self._note(f"scaling {cluster.spec.name} to {target} nodes")

    async def _up(self, cluster: SlurmRayCluster) -> None:
        await submit(cluster, tell=lambda note: self._note(f"note: {note}"))
        if cluster.id in self._stop_requested:  # Stop was clicked during the submit
            await cluster.down_async()
            return
        try:
            await cluster.wait_up_async(connect_timeout=self._connect_timeout())
        except SlurmRayError:
            if cluster.id not in self._stop_requested:
                raise  # a real failure; a stop on request is not one

    def _connect_timeout(self) -> float:
        return float(self.session.setting("connect_timeout", 30.0))

    def _run(self, coro: Coroutine[Any, Any, Any]) -> None:
        self.message.value = ""

        async def guarded() -> None:
            try:
                await coro
            except SlurmRayError as exc:
                self._error(str(exc))
            except Exception as exc:  # shown in the panel; the kernel must go on
                log.exception("cluster panel action failed")
                self._error(f"{type(exc).__name__}: {exc}")

        asyncio.run_coroutine_threadsafe(guarded(), background_loop())

    # -- live state -----------------------------------------------------------------------
    def bind(self, cluster: SlurmRayCluster) -> None:
        """Show and control ``cluster``."""
        if self.cluster is not None:
            self.cluster.remove_observer(self._on_status)
        self.cluster = cluster
        self.status_view.bind(cluster)
        cluster.add_observer(self._on_status)
        self._on_status(cluster.status)

    def _on_status(self, status: Status) -> None:
        self._update_buttons(status)
        if status.log_tail:
            self.log_tail.value = status.log_tail
        elif status.job_id and status.state is not State.PENDING:
            cluster = self.cluster
            if cluster is not None:
                asyncio.run_coroutine_threadsafe(self._refresh_logs(cluster), background_loop())

    async def _refresh_logs(self, cluster: SlurmRayCluster) -> None:
        try:
            text = await cluster.logs_async(tail=self.log_lines)
        except SlurmRayError as exc:
            text = f"(cannot read the logs: {exc})"
        if cluster is self.cluster and text:
            self.log_tail.value = text

    def _update_buttons(self, status: Status | None) -> None:
        state = status.state if status is not None else None
        active = state is not None and not state.is_final
        self.up_button.disabled = active
        self.stop_button.disabled = not active or state is State.STOPPING
        self.connect_button.disabled = state not in (State.READY, State.DEGRADED)
        up = state is not None and state.is_up
        self.grow_button.disabled = not up
        own = self.cluster.spec.nodes if self.cluster is not None else 0
        self.shrink_button.disabled = not up or status is None or status.nodes_wanted <= own

    def _note(self, text: str) -> None:
        self.message.value = f'<span style="color:#6c757d">{html.escape(text, quote=False)}</span>'

    def _error(self, text: str) -> None:
        self.message.value = f'<span style="color:#c62828">{html.escape(text, quote=False)}</span>'

    def close(self) -> None:
        if self.cluster is not None:
            self.cluster.remove_observer(self._on_status)
        self.status_view.close()
        super().close()


def _allocation_nodes() -> int:
    """The nodes of the allocation this kernel runs in (0: it runs in none)."""
    job = enclosing_job()
    return job.nodes if job is not None else 0
