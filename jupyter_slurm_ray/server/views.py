"""The REST API's view of a cluster, typed: what ``GET slurm-ray/api/clusters`` answers per
cluster, and what the labextension's ``ICluster`` (``labextension/src/api.ts``) describes.

``ClusterManager.view`` builds these, so mypy checks every key and its type; a fast test
(``tests/fast/test_view_contract.py``) checks that ``ICluster`` has the same fields with the
same optionality (a key declared in a ``total=False`` part here is ``field?:`` there). A field
added on one side only fails that test.

No ``from __future__ import annotations`` here: on Python < 3.12 it hides which keys are
optional from ``__optional_keys__``.
"""

from typing import Literal, TypedDict


class ObserverView(TypedDict):
    """A process that watches the cluster without owning it."""

    pid: int
    host: str


class QueueView(TypedDict):
    """A pending cluster's queue insight (``slurm/queueinfo.py``'s ``QueueInsight.to_dict``)."""

    reason: str
    meaning: str
    action: str | None
    never_starts: bool
    hint: str | None
    estimated_start: str | None  # ISO 8601


class _WorkerJobFacts(TypedDict):
    job_id: str
    state: str
    reason: str | None
    host: str | None
    joined: bool


class WorkerJobView(_WorkerJobFacts, total=False):
    """One worker job (``states.WorkerJobStatus``, every field sent; the labextension reads the
    last two as optional)."""

    estimated_start: str | None
    group: str


class _UsageFigures(TypedDict):
    available: bool
    final: bool
    cpu_hours: float
    gpu_hours: float
    cpu_efficiency: float | None
    max_rss: int | None


class UsageView(_UsageFigures, total=False):
    """What a cluster's jobs used (``slurm/usage.py``'s ``Usage``): the listing sends the
    figures (``compact``), one cluster's details all of it (``to_dict``). Figures only: the
    notebook and the labextension make the words."""

    unavailable: str | None
    job_ids: list[str]
    elapsed: float
    cpu_used_seconds: float
    max_rss_by_node: dict[str, int]
    max_rss_node: str | None


class WalltimeAndQueueView(TypedDict):
    """The walltime warning, the queue insight of a pending cluster, and what Extend needs."""

    walltime_warning: bool
    walltime_warning_seconds: int
    partition: str | None
    account: str | None
    qos: str | None
    queue: QueueView | None
    extendable: bool


class ConnectionView(TypedDict):
    """How the owner's kernel is connected while CONNECTED (else None): "driver" or "client",
    and why."""

    connect_mode: Literal["driver", "client"] | None
    connect_reason: str | None


class AddedToView(TypedDict, total=False):
    """Keys some answers add to a view."""

    #: Added by the REST handlers (the view itself has no base URL).
    dashboard_url: str
    #: In the listing with ``?usage=true`` (compact) and in one cluster's details (full).
    usage: UsageView | None


class ClusterView(WalltimeAndQueueView, ConnectionView, AddedToView):
    """One readable cluster: its registry record reconciled with Slurm (the sidebar's row)."""

    id: str
    name: str
    state: str
    reason: str | None
    notice: str | None
    phase: str | None
    job_id: str | None
    slurm_state: str | None
    slurm_unreachable_since: float | None
    nodes: list[str]
    nodes_wanted: int
    nodes_joined: int
    nodes_lost: list[str]
    worker_jobs: list[WorkerJobView]
    scaling: list[str]
    gpus_per_node: int
    time_limit: int | None
    time_left: int | None
    estimated_start: str | None  # ISO 8601
    owner: str
    owner_host: str
    owner_pid: int
    owner_alive: bool
    owner_term: int
    observers: list[ObserverView]
    server_owned: bool
    can_take_over: bool
    detached: bool
    target: str
    reachable: bool
    unreadable: Literal[False]
    error: None
    final: bool
    forgettable: bool
    created_at: float
    updated_at: float
    attach_command: str


class UnreadableView(AddedToView):
    """A record file that could not be read: only its id and the error mean something."""

    id: str
    unreadable: Literal[True]
    error: str | None
    state: Literal["UNREADABLE"]
    final: Literal[True]
    forgettable: bool
