"""The REST API's view of a cluster, typed: what ``GET slurm-ray/api/clusters`` answers per
cluster, and what the labextension's ``ICluster`` (``labextension/src/api.ts``) describes.

``ClusterManager.view`` builds these, so mypy checks every key and its type; a fast test
(``tests/fast/test_view_contract.py``) checks that ``ICluster`` has the same fields with the
same optionality (a key declared in a ``total=False`` part here is ``field?:`` there). A field
added on one side only fails that test.

No ``from __future__ import annotations`` here: on Python < 3.12 it hides which keys are
optional from ``__optional_keys__``.
"""

from typing import Any, Literal, TypedDict


class ObserverView(TypedDict):
    """A process that watches the cluster without owning it."""

    pid: int
    host: str


class WalltimeAndQueueView(TypedDict):
    """The walltime warning, the queue insight of a pending cluster, and what Extend needs."""

    walltime_warning: bool
    walltime_warning_seconds: int
    partition: str | None
    account: str | None
    qos: str | None
    queue: dict[str, Any] | None  # queueinfo.QueueInsight.to_dict()
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
    usage: dict[str, Any] | None


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
    worker_jobs: list[dict[str, Any]]  # states.WorkerJobStatus as a dict
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
