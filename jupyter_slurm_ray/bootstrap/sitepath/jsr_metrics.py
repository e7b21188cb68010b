"""Ray's Prometheus endpoints stay closed unless the cluster's ``ray_metrics`` setting opens
them (``JSR_RAY_METRICS=0`` in the environment of Ray's processes).

Ray's autoscaler monitor and its dashboard each start ``prometheus_client.start_http_server``
on every address of the node (ports AUTOSCALER_METRIC_PORT and DASHBOARD_METRIC_PORT): any
user who reaches the node reads them, and no setting of Ray turns them off. Nothing of this
package reads them, so here the call does nothing (Ray's own metrics exporter, the third
endpoint, is off through ``RAY_enable_metrics_collection=0``). The dashboard's pages that do
not need Prometheus (nodes, jobs, actors, logs) are unchanged.

Installed by ``sitecustomize`` in every Python process of the cluster's Ray; it acts once
``prometheus_client`` is imported.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from types import ModuleType
from typing import Any

TARGET = "prometheus_client"
VARIABLE = "JSR_RAY_METRICS"  # jsr_wire.METRICS_VARIABLE (this file cannot import it)


def closed(module: ModuleType) -> None:
    """``start_http_server`` (and its alias) that serve nothing."""

    def start_http_server(*args: Any, **kwargs: Any) -> None:
        return None

    for name in ("start_http_server", "start_wsgi_server"):
        if hasattr(module, name):
            setattr(module, name, start_http_server)


class CloseAfterImport(importlib.abc.MetaPathFinder):
    """Finds prometheus_client as usual and closes its servers once it has run."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        run = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            closed(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> None:
    if os.environ.get(VARIABLE) != "0":
        return
    if not any(isinstance(finder, CloseAfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, CloseAfterImport())
