"""Lab state survives a reload: a cluster's dashboard and logs tabs come back after a page
reload and after a restart of the Jupyter server (whose dashboard capabilities die with it), a
walltime warning is not notified again after a reload, and a restored tab of a cluster that was
forgotten since closes with a notification.

A real cluster on the testbed, a real JupyterLab (its workspace, where the layout restorer and
the state DB keep their data, under the test's directory, kept across the restart), Debian's
Chromium driven by Playwright.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, Route, expect

from tests.helpers.server import JupyterServer, jupyter_lab, start_cluster

CAPABILITY = re.compile(r"/~([A-Za-z0-9_-]{40,})/")


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("labstate")


@pytest.fixture(scope="module")
def cluster(root, testbed_user):
    cluster = start_cluster(root / "state", testbed_user, "labstate")
    yield cluster
    cluster.down()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    yield context.new_page()
    context.close()


def open_lab(page: Page, lab: JupyterServer) -> None:
    page.goto(f"{lab.url}lab?token={lab.token}")
    page.wait_for_selector("#jp-main-dock-panel", timeout=60_000)


def tab_handle(page: Page, kind: str, cluster_id: str):
    return page.locator(f'.lm-TabBar-tab[data-id="slurm-ray-{kind}-{cluster_id}"]')


def saved_workspace(lab: JupyterServer, wanted: bool, *keys: str) -> str:
    """The default workspace as the server keeps it, once each of ``keys`` is in it (``wanted``)
    or none is (the Lab saves it shortly after a change)."""
    deadline = time.monotonic() + 30
    while True:
        text = json.dumps(lab.get("lab/api/workspaces/default").json())
        if all((key in text) == wanted for key in keys) or time.monotonic() > deadline:
            return text
        time.sleep(0.5)


def dashboard_renders(page: Page, cluster) -> str:
    """Ray's dashboard shows the cluster's node alive in its tab; the frame's capability."""
    tab_handle(page, "dashboard", cluster.id).click()
    frame = page.frame_locator(f"#slurm-ray-dashboard-{cluster.id} iframe")
    frame.get_by_role("tab", name="Cluster").or_(
        frame.get_by_text("Cluster", exact=True)
    ).first.click(timeout=60_000)
    nodes = cluster.spec.nodes
    expect(frame.get_by_text(f"ALIVE x {nodes}", exact=True)).to_be_visible(timeout=60_000)
    src = page.locator(f"#slurm-ray-dashboard-{cluster.id} iframe").get_attribute("src") or ""
    found = CAPABILITY.search(src)
    assert found, src
    return found[1]


def logs_show(page: Page, cluster_id: str) -> None:
    tab_handle(page, "logs", cluster_id).click()
    logs = page.locator(f"#slurm-ray-logs-{cluster_id} .jp-SlurmRay-logs")
    expect(logs).to_contain_text("--- bootstrap events ---")
    expect(logs).to_contain_text('"event":"ready"')


def test_cluster_tabs_come_back_after_a_reload_and_a_server_restart(
    page, root, testbed_user, cluster, artifacts
):
    keys = (f"slurm-ray-dashboard:{cluster.id}", f"slurm-ray-logs:{cluster.id}")
    with jupyter_lab(root, testbed_user) as lab:
        open_lab(page, lab)
        page.locator('.lm-TabBar-tab[data-id="jp-SlurmRay-sidebar"]').click()
        card = page.locator(f'.jp-SlurmRay-cluster[data-cluster-id="{cluster.id}"]')
        expect(card.locator(".jp-SlurmRay-badge")).to_have_text("READY", timeout=30_000)
        card.get_by_role("button", name="Dashboard").click()
        first = dashboard_renders(page, cluster)
        card.get_by_role("button", name="Logs").click()
        logs_show(page, cluster.id)

        saved = saved_workspace(lab, True, *keys)
        assert all(key in saved for key in keys), saved
        assert first not in saved and "/~" not in saved  # the cluster is kept, never its URL

        page.reload()
        page.wait_for_selector("#jp-main-dock-panel", timeout=60_000)
        expect(tab_handle(page, "dashboard", cluster.id)).to_have_count(1, timeout=30_000)
        expect(tab_handle(page, "logs", cluster.id)).to_have_count(1)
        logs_show(page, cluster.id)
        dashboard_renders(page, cluster)

    # a new server process: the old capability is dead, the restored tab mints a new one
    with jupyter_lab(root, testbed_user) as lab:
        open_lab(page, lab)
        expect(tab_handle(page, "dashboard", cluster.id)).to_have_count(1, timeout=30_000)
        expect(tab_handle(page, "logs", cluster.id)).to_have_count(1)
        logs_show(page, cluster.id)
        fresh = dashboard_renders(page, cluster)
        assert fresh != first
        old = lab.get(f"slurm-ray/dashboard/{cluster.id}/~{first}/", headers={})
        assert old.status_code == 404  # what a stored URL would have shown
        page.wait_for_timeout(1000)  # let the charts settle for the screenshot
        page.screenshot(path=str(artifacts / "labextension-restored-after-restart.png"))


def test_a_walltime_warning_is_not_notified_again_after_a_reload(page, root, testbed_user, cluster):
    """The server's real listing, with the cluster's warning made due by the test (a real one
    takes a job's last minute: test_walltime_notification.py)."""

    def warning_due(route: Route) -> None:
        if route.request.method != "GET":
            route.fallback()
            return
        answer = route.fetch()
        listing = answer.json()
        for view in listing["clusters"]:
            if view["id"] == cluster.id:
                view.update(walltime_warning=True, time_left=90)
        route.fulfill(response=answer, json=listing)

    page.route(re.compile(r".*/slurm-ray/api/clusters(\?.*)?$"), warning_due)
    toast = page.locator(".Toastify__toast").filter(has_text="the walltime of labstate")
    with jupyter_lab(root, testbed_user) as lab:
        open_lab(page, lab)
        expect(toast).to_have_count(1, timeout=30_000)
        saved = saved_workspace(lab, True, "jupyter-slurm-ray:sidebar")
        assert f'"warned": ["{cluster.id}"]' in saved, saved

        page.reload()
        page.wait_for_selector("#jp-main-dock-panel", timeout=60_000)
        card = page.locator(f'.jp-SlurmRay-cluster[data-cluster-id="{cluster.id}"]')
        warned = card.locator(".jp-SlurmRay-walltimeWarning")  # the listing came, warning due
        expect(warned).to_have_count(1, timeout=30_000)
        page.wait_for_timeout(11_000)  # two more listings (every 5 s): still none
        expect(toast).to_have_count(0)


def test_restored_tabs_of_a_forgotten_cluster_close_with_a_notification(
    page, root, testbed_user, cluster, artifacts
):
    """Runs after the test above: its workspace holds the cluster's two tabs."""
    keys = (f"slurm-ray-dashboard:{cluster.id}", f"slurm-ray-logs:{cluster.id}")
    with jupyter_lab(root, testbed_user) as lab:
        assert all(key in saved_workspace(lab, True, *keys) for key in keys)
        cluster.down()
        forgot = lab.request("DELETE", f"slurm-ray/api/clusters/{cluster.id}?forget=true")
        assert forgot.status_code == 200, forgot.text
        open_lab(page, lab)
        toasts = page.locator(".Toastify")
        expect(toasts).to_contain_text("Ray dashboard tab of labstate was closed", timeout=30_000)
        expect(toasts).to_contain_text("Logs tab of labstate was closed")
        expect(toasts).to_contain_text("no longer in the registry")
        page.wait_for_timeout(1000)  # let the notifications slide in for the screenshot
        page.screenshot(path=str(artifacts / "labextension-restored-cluster-gone.png"))
        expect(tab_handle(page, "dashboard", cluster.id)).to_have_count(0)
        expect(tab_handle(page, "logs", cluster.id)).to_have_count(0)
        expect(page.locator("iframe")).to_have_count(0)  # no broken frame left behind
        saved = saved_workspace(lab, False, *keys)
        assert not any(key in saved for key in keys), saved  # the next reload does not retry
