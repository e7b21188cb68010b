"""Jupyter server extension: the clusters REST API and the authenticated Ray dashboard proxy.

Routes (under the server's ``base_url``):

- ``slurm-ray/api/clusters`` (GET list, ``?usage=true`` with usage; POST create, checked
  against the site first) and ``slurm-ray/api/clusters/<id>`` (GET with events, log tail and
  usage; DELETE stop), ``…/<id>/extend`` (POST: more walltime) — see ``handlers.py`` and
  ``manager.py``;
- ``slurm-ray/dashboard/<id>/…`` — the cluster's Ray dashboard, see ``proxy.py``,
  ``tokenroute.py`` and ``capabilities.py``.

Kernels started by this server find the dashboard prefix in ``$JUPYTER_SLURM_RAY_DASHBOARD_BASE``
so their links (``<prefix><id>/``) open through the proxy.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from jupyter_server.utils import url_path_join

from ..naming import CAPABILITIES_SETTING, DASHBOARD_BASE_ENV
from ..registry import Registry
from ..targets import Transports
from . import capabilities, handlers, pages, proxy, tokenroute
from .backends import DashboardBackends
from .capabilities import DashboardCapabilities
from .manager import ClusterManager

log = logging.getLogger(__name__)


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "jupyter_slurm_ray.server"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    from tornado.ioloop import IOLoop

    from ..config import (
        SlurmRay,
        adapt_defaults,
        effective_setting,
        make_transport,
        resolve_spec,
    )
    from ..doctor.checklist import Report, run_doctor

    _log_to_server(serverapp)
    web_app = serverapp.web_app
    base_url = web_app.settings["base_url"]
    config = SlurmRay(parent=serverapp)
    registry = Registry()
    retention_days, _ = effective_setting("record_retention_days", config)
    steady, _ = effective_setting("steady_poll_interval", config)
    manager = ClusterManager(
        registry,
        Transports(lambda: make_transport(config), reconfigurable=False),
        resolve_spec=lambda settings, profile: resolve_spec(
            settings, profile=profile, config=config
        )[0],
        retention=float(7 if retention_days is None else retention_days) * 86400,
        steady_poll_interval=float(15 if steady is None else steady),
        adapt_defaults=lambda: adapt_defaults(config),
    )
    backends = DashboardBackends(
        registry, lambda record: manager.transport(record.target), manager.status
    )
    web_app.settings["slurm_ray_manager"] = manager
    IOLoop.current().add_callback(manager.start_housekeeping)

    async def doctor(profile: str | None, queue_timeout: float) -> Report:
        spec = resolve_spec({}, profile=profile, config=config)[0]
        transport = manager.transports.configured()
        return await run_doctor(
            spec, transport, queue_timeout=queue_timeout, server_extension_running=True
        )

    web_app.add_handlers(
        ".*$",
        handlers.route_specs(base_url, manager, doctor)
        + _dashboard_routes(base_url, backends, _capabilities_in_settings(web_app)),
    )
    os.environ[DASHBOARD_BASE_ENV] = url_path_join(base_url, proxy.PREFIX) + "/"
    serverapp.log.info("jupyter_slurm_ray: clusters API and dashboard proxy at %s", registry.path)


def _capabilities_in_settings(web_app: Any) -> DashboardCapabilities:
    """The server's capabilities, in its settings: `jupyter slurm-ray dashboard` mints one."""
    links_to = DashboardCapabilities()
    web_app.settings[CAPABILITIES_SETTING] = links_to
    return links_to


def _dashboard_routes(
    base_url: str, backends: DashboardBackends, links_to: DashboardCapabilities | None = None
) -> list[Any]:
    """The sandboxed and the login-protected proxy, capability links, the slash redirect."""
    from jupyter_server_proxy.handlers import AddSlashHandler

    prefix = url_path_join(base_url, proxy.PREFIX)
    cluster = r"([^/]+)"
    links_to = links_to or DashboardCapabilities()
    kwargs = {"backends": backends, "capabilities": links_to}
    links = url_path_join(base_url, capabilities.LINKS_PREFIX) + f"/{cluster}"
    return [
        *pages.page_rules(prefix, backends, links_to),
        (f"{prefix}/{cluster}", AddSlashHandler, {}),
        (f"{prefix}/{cluster}(/.*)", tokenroute.DashboardProxyHandler, kwargs),
        (links, capabilities.DashboardLinkHandler, kwargs),
    ]


def _log_to_server(serverapp: Any) -> None:
    """The package's log records (proxy backends, stops, creates) go to the server's log."""
    package_log = logging.getLogger("jupyter_slurm_ray")
    if not package_log.handlers:
        for handler in serverapp.log.handlers:
            package_log.addHandler(handler)
        package_log.setLevel(serverapp.log.getEffectiveLevel())
        package_log.propagate = False
