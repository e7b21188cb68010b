"""Ray's own view of a connected cluster (the context ``ray.init()`` returns) links the
dashboard where the kernel's Jupyter server proxies it (client/dashboardlink.py)."""

from __future__ import annotations

import pytest
from ray.client_builder import ClientContext

from jupyter_slurm_ray.client.dashboardlink import link_proxied_dashboard, proxied_dashboard
from jupyter_slurm_ray.naming import DASHBOARD_BASE_ENV


def a_context() -> ClientContext:
    return ClientContext(
        dashboard_url="10.0.0.7:8265",  # the head's, as Ray gives it
        python_version="3.11.2",
        ray_version="2.60.0",
        ray_commit="abc",
        _num_clients=1,
        _context_to_restore=None,
    )


def test_under_a_jupyter_server_the_context_names_the_proxied_dashboard(monkeypatch) -> None:
    monkeypatch.setenv(DASHBOARD_BASE_ENV, "/user/alice/slurm-ray/dashboard/")
    context = a_context()
    link_proxied_dashboard(context, "ray-1234abcd")
    assert context.dashboard_url == "/user/alice/slurm-ray/dashboard/ray-1234abcd/"
    table = context._context_table_template()
    assert 'href="/user/alice/slurm-ray/dashboard/ray-1234abcd/"' in table
    assert "10.0.0.7" not in table and "http://" not in table  # Ray's prefix on a path: broken
    assert "2.60.0" in table and "3.11.2" in table  # the rest of Ray's table kept
    assert 'href="/user/alice/slurm-ray/dashboard/ray-1234abcd/"' in context._repr_html_()


@pytest.mark.parametrize("cluster_id", ["ray-1234abcd", ""])
def test_elsewhere_the_context_is_rays_own(monkeypatch, cluster_id: str) -> None:
    monkeypatch.delenv(DASHBOARD_BASE_ENV, raising=False)
    if not cluster_id:  # a server, but no cluster id to name
        monkeypatch.setenv(DASHBOARD_BASE_ENV, "/slurm-ray/dashboard/")
    context = a_context()
    link_proxied_dashboard(context, cluster_id)
    assert context.dashboard_url == "10.0.0.7:8265"
    assert "http://10.0.0.7:8265" in context._context_table_template()
    assert proxied_dashboard(cluster_id) is None
