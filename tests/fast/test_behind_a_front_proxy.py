"""What the path through a JupyterHub or Open OnDemand front needs of the dashboard proxy,
without a server: the real paths are tests/test_hub.py and tests/test_ood.py."""

from __future__ import annotations

from types import SimpleNamespace

from jupyter_slurm_ray.server.tokenroute import DashboardProxyHandler


def closed_by(backend: object) -> list[tuple[object, object]]:
    """What the proxy's browser side is closed with when the head's side closes."""
    handler = DashboardProxyHandler.__new__(DashboardProxyHandler)
    closes: list[tuple[object, object]] = []
    handler._record_activity = lambda: None  # type: ignore[method-assign]
    handler.close = lambda code=None, reason=None: closes.append((code, reason))  # type: ignore[method-assign]
    handler.ws = backend
    handler._from_backend(None)
    return closes


def test_a_websocket_the_head_closes_is_closed_with_its_code_and_reason():
    """Ray's job-log tail ends with a normal close: passed on, so `ray job submit` (aiohttp)
    sees the job's logs end instead of a lost connection (1006)."""
    assert closed_by(SimpleNamespace(close_code=1000, close_reason="done")) == [(1000, "done")]


def test_a_websocket_whose_head_vanished_is_closed_without_a_code():
    assert closed_by(SimpleNamespace(close_code=None, close_reason=None)) == [(None, None)]
    assert closed_by(None) == [(None, None)]
