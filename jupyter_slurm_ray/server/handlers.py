"""REST handlers of ``/slurm-ray/api/clusters``: thin translations of HTTP to ``ClusterManager``.

- ``GET clusters[?usage=true]``, ``POST clusters``; ``GET|DELETE clusters/<id>``;
- ``POST clusters/<id>/extend`` ``{"amount": "+30"}``: 200 with the new time left, 403 with
  Slurm's words when the site refuses;
- ``POST clusters/<id>/scale`` ``{"nodes": N}``: N Ray nodes in all (worker jobs); 200 when
  this server owns the cluster and it is done, 202 when its owner was asked or a drain goes on
  (``under_way``); 400 naming ``nodes`` when N is bad; 409 while the cluster adapts;
- ``POST clusters/<id>/adapt`` ``{"maximum": N, "minimum": N, ...}`` or ``{"off": true}``:
  adaptive scaling, 200 / 202 as for scale, 400 naming the bad field;
- ``POST clusters/<id>/takeover``: this server becomes the cluster's owner (its previous owner
  stands down); 200 with the view, 409 when the cluster is not active;
- ``GET doctor[?profile=NAME]``: the checklist of ``doctor/checklist.py`` (JSON).

Every error is JSON: ``{"message": ..., "field": ...}`` (``field`` when one input was wrong).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web

from ..doctor.checklist import Report
from ..errors import (
    Conflict,
    ExtendRefused,
    NotFound,
    SlurmError,
    SlurmRayError,
    SlurmUnavailable,
    SpecError,
    UnknownTarget,
)
from .manager import ClusterManager
from .proxy import PREFIX as DASHBOARD_PREFIX

log = logging.getLogger(__name__)

API_PREFIX = "slurm-ray/api"

#: ``doctor(profile, queue_timeout)``: the server's checklist (see ``server/__init__.py``).
RunDoctor = Callable[[str | None, float], Awaitable[Report]]


class ApiError(web.HTTPError):
    """An HTTP error whose JSON body may name the offending input field."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(status, message)
        self.message = message
        self.field = field


@contextmanager
def _as_http_errors() -> Iterator[None]:
    try:
        yield
    except NotFound as exc:
        raise ApiError(404, str(exc)) from None
    except SpecError as exc:
        raise ApiError(400, str(exc), exc.field) from None
    except (Conflict, UnknownTarget) as exc:  # not in this state, or not from this server
        raise ApiError(409, str(exc)) from None
    except SlurmUnavailable as exc:
        raise ApiError(503, f"Slurm did not answer: {exc}") from None
    except ExtendRefused as exc:  # Slurm's policy, in Slurm's words
        raise ApiError(403, str(exc)) from None
    except SlurmError as exc:  # Slurm refused the request as asked (e.g. no such partition)
        raise ApiError(400, str(exc)) from None
    except SlurmRayError as exc:
        raise ApiError(502, str(exc)) from None


class _ClustersHandler(APIHandler):
    def initialize(self, manager: ClusterManager) -> None:
        self.manager = manager

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None))[1]
        if not isinstance(exc, ApiError):
            return super().write_error(status_code, **kwargs)
        self.set_header("Content-Type", "application/json")
        reply = {"message": exc.message, "field": exc.field}
        self.finish(json.dumps(reply))

    def _with_links(self, view: dict[str, Any]) -> dict[str, Any]:
        view["dashboard_url"] = url_path_join(self.base_url, DASHBOARD_PREFIX, view["id"]) + "/"
        return view

    def _json_body(self) -> Any:
        """The request's JSON body (``{}`` when empty); a 400 naming ``body`` when not JSON."""
        try:
            return json.loads(self.request.body or b"{}")
        except ValueError as exc:
            raise ApiError(400, f"the request body is not JSON: {exc}", "body") from None

    def _int_argument(self, name: str, default: int, high: int) -> int:
        text = self.get_argument(name, str(default))
        if not text.isdigit() or not 0 < int(text) <= high:
            raise ApiError(400, f"{name}: {text!r} is not a whole number from 1 to {high}", name)
        return int(text)


class ClusterListHandler(_ClustersHandler):
    """``GET``: every cluster, reconciled with Slurm. ``POST``: create one from a profile."""

    @web.authenticated
    async def get(self) -> None:
        usage = self.get_argument("usage", "false")
        if usage not in ("true", "false"):
            raise ApiError(400, f"usage: {usage!r} is not true or false", "usage")
        with _as_http_errors():
            listing = await self.manager.list(usage=usage == "true")
        listing["clusters"] = [self._with_links(c) for c in listing["clusters"]]
        self.finish(json.dumps(listing))

    @web.authenticated
    async def post(self) -> None:
        body = self._json_body()
        with _as_http_errors():
            view = await self.manager.create(body)
        self.set_status(201)
        self.finish(json.dumps(self._with_links(view)))


class ClusterHandler(_ClustersHandler):
    """``GET``: one cluster with recent events and log tail. ``DELETE``: stop it;
    ``DELETE ?forget=true``: forget an ended (or unreadable) one."""

    @web.authenticated
    async def get(self, cluster_id: str) -> None:
        events = self._int_argument("events", 50, 1000)
        tail = self._int_argument("tail", 100, 5000)
        with _as_http_errors():
            view = await self.manager.get(cluster_id, events=events, log_lines=tail)
        self.finish(json.dumps(self._with_links(view)))

    @web.authenticated
    async def delete(self, cluster_id: str) -> None:
        forget = self.get_argument("forget", "false")
        if forget not in ("true", "false"):
            raise ApiError(400, f"forget: {forget!r} is not true or false", "forget")
        with _as_http_errors():
            if forget == "true":
                self.finish(json.dumps(await self.manager.forget(cluster_id)))
                return
            view = await self.manager.stop(cluster_id)
        self.finish(json.dumps(self._with_links(view)))


class ExtendHandler(_ClustersHandler):
    """``POST {"amount": "+30"}``: add walltime to the cluster's job (scontrol update)."""

    @web.authenticated
    async def post(self, cluster_id: str) -> None:
        body = self._json_body()
        with _as_http_errors():
            view = await self.manager.extend(cluster_id, body)
        self.finish(json.dumps(self._with_links(view)))


class _OwnerActionHandler(_ClustersHandler):
    """A ``POST`` the cluster's owner applies: 200 when this server owns the cluster (done
    here), 202 when its owner was asked (``"applied": false``) or what it began goes on
    (``"under_way": true``)."""

    async def _apply(self, cluster_id: str, body: Any) -> tuple[dict[str, Any], bool]:
        raise NotImplementedError

    @web.authenticated
    async def post(self, cluster_id: str) -> None:
        body = self._json_body()
        with _as_http_errors():
            view, applied = await self._apply(cluster_id, body)
        self.set_status(200 if applied and not view.get("under_way") else 202)
        self.finish(json.dumps({**self._with_links(view), "applied": applied}))


class ScaleHandler(_OwnerActionHandler):
    """``POST {"nodes": N}``: scale to N Ray nodes in all; 200 when this server owns the
    cluster (done), 202 when its owner was asked (``"applied": false``) or worker jobs are
    still draining (``"under_way": true``), 409 while the cluster adapts."""

    async def _apply(self, cluster_id: str, body: Any) -> tuple[dict[str, Any], bool]:
        return await self.manager.scale(cluster_id, body)


class AdaptHandler(_OwnerActionHandler):
    """``POST {"maximum": N, "minimum": N, "idle_timeout": S, "max_pending": N}`` or
    ``{"off": true}``: adaptive scaling; 200 when this server owns the cluster (started), 202
    when its owner was asked (``"applied": false``)."""

    async def _apply(self, cluster_id: str, body: Any) -> tuple[dict[str, Any], bool]:
        return await self.manager.adapt(cluster_id, body)


class TakeoverHandler(_ClustersHandler):
    """``POST``: this server takes the cluster over (it keeps its lease, scales it, cancels it
    when the server stops unless detached); the previous owner stands down."""

    @web.authenticated
    async def post(self, cluster_id: str) -> None:
        with _as_http_errors():
            view = await self.manager.take_over(cluster_id)
        self.finish(json.dumps(self._with_links(view)))


class DoctorHandler(_ClustersHandler):
    """``GET doctor[?profile=NAME&queue_timeout=S]``: the checklist (``Report.to_dict``) for
    the request a profile (or the configuration) means, with one short test job."""

    def initialize(self, manager: ClusterManager, doctor: RunDoctor | None = None) -> None:
        super().initialize(manager)
        self.doctor = doctor

    @web.authenticated
    async def get(self) -> None:
        if self.doctor is None:
            raise ApiError(404, "doctor is not available on this server")
        profile = self.get_argument("profile", "") or None
        queue_timeout = self._int_argument("queue_timeout", 120, 3600)
        with _as_http_errors():
            report = await self.doctor(profile, float(queue_timeout))
        self.finish(json.dumps(report.to_dict()))


def route_specs(
    base_url: str, manager: ClusterManager, doctor: RunDoctor | None = None
) -> list[tuple[str, type, dict]]:
    prefix = url_path_join(base_url, API_PREFIX, "clusters")
    kwargs = {"manager": manager}
    checklist = url_path_join(base_url, API_PREFIX, "doctor")
    return [
        (checklist, DoctorHandler, {**kwargs, "doctor": doctor}),
        (prefix, ClusterListHandler, kwargs),
        (prefix + r"/([^/]+)/extend", ExtendHandler, kwargs),
        (prefix + r"/([^/]+)/scale", ScaleHandler, kwargs),
        (prefix + r"/([^/]+)/adapt", AdaptHandler, kwargs),
        (prefix + r"/([^/]+)/takeover", TakeoverHandler, kwargs),
        (prefix + r"/([^/]+)", ClusterHandler, kwargs),
    ]
