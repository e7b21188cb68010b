"""Take over in JupyterLab under headless Chromium: the sidebar's button asks first (naming the
owner), the Jupyter server becomes the cluster's owner, and the process that owned it (this
test process, a stand-in for a notebook kernel) is told and stands down.

JupyterLab runs as ``python -m jupyterlab`` with a token and a temporary settings dir; the
labextension it loads is the one JupyterLab finds first on its ``JUPYTER_PATH`` (the venv's, or
a build of one's own put first), and the test fails if that build has no Take over.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from jupyter_slurm_ray.registry import Registry
from tests.helpers.jobs import in_queue
from tests.helpers.server import JupyterServer, jupyter_lab, start_cluster
from tests.helpers.waiting import wait_for


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("takeover-lab")


@pytest.fixture(scope="module")
def cluster(root, testbed_user):
    cluster = start_cluster(root / "state", testbed_user, "taken")
    yield cluster
    if not cluster.state.is_final:
        cluster.down()


@pytest.fixture(scope="module")
def lab(root, testbed_user, cluster) -> Iterator[JupyterServer]:
    with jupyter_lab(root, testbed_user) as server:
        yield server


@pytest.fixture(scope="module")
def page(browser: Browser, lab: JupyterServer) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.goto(f"{lab.url}lab?token={lab.token}")
    page.wait_for_selector("#jp-main-dock-panel", timeout=60_000)
    tab = page.locator('.lm-TabBar-tab[data-id="jp-SlurmRay-sidebar"]')
    tab.click()
    expect(page.locator("#jp-SlurmRay-sidebar")).to_be_visible()
    yield page
    context.close()


def card(page: Page, cluster_id: str):
    return page.locator(f'.jp-SlurmRay-cluster[data-cluster-id="{cluster_id}"]')


def test_take_over_asks_first_then_the_server_owns_it_and_the_kernel_is_told(
    page, lab, cluster, root, artifacts
):
    item = card(page, cluster.id)
    expect(item.locator(".jp-SlurmRay-badge")).to_have_text("READY", timeout=30_000)
    me = f"pid {os.getpid()} on {socket.gethostname()}"
    expect(item.locator(".jp-SlurmRay-facts")).to_contain_text(f"Owner root ({me})")
    button = item.get_by_role("button", name="Take over")
    expect(button).to_be_visible()  # the build JupyterLab loaded has it
    button.click()
    dialog = page.locator(".jp-Dialog")
    expect(dialog).to_contain_text("Take over the cluster?")
    expect(dialog).to_contain_text(f"is owned by {me}")
    dialog.get_by_role("button", name="Cancel").click()
    page.wait_for_timeout(1000)
    assert cluster.owned_here  # declined: nothing changed

    button.click()
    dialog.get_by_role("button", name="Take over").click()
    told = page.locator(".Toastify__toast").filter(has_text="is owned by this server now")
    expect(told).to_contain_text(f"(was {me})", timeout=30_000)
    facts = item.locator(".jp-SlurmRay-facts")
    expect(facts).to_contain_text("(this server)", timeout=30_000)
    expect(item.get_by_role("button", name="Take over")).to_have_count(0)
    server = f"pid {lab.proc.pid} on {socket.gethostname()}"
    wait_for(lambda: not cluster.owned_here, 30, "this process standing down")
    assert cluster.status.ownership == f"taken over; owned by {server}"
    record = Registry(root / "state").load(cluster.id)
    assert (record.owner_pid, record.owner_term) == (lab.proc.pid, 1)
    page.locator(".jp-SlurmRay-refresh").click()
    expect(facts).to_contain_text("(this server) · 1 observing", timeout=30_000)  # this process
    page.screenshot(path=str(artifacts / "labextension-taken-over.png"))


def test_the_palette_has_take_over(page):
    page.keyboard.press("Control+Shift+C")
    palette = page.locator("#command-palette")
    palette.locator("input").fill("Slurm Ray")
    item = palette.locator(".lm-CommandPalette-item", has_text="Take Over Cluster")
    expect(item).to_have_count(1)
    page.keyboard.press("Escape")


def test_stop_by_the_new_owner_ends_the_job(page, cluster):
    item = card(page, cluster.id)
    item.get_by_role("button", name="Stop").click()
    page.locator(".jp-Dialog").get_by_role("button", name="Stop").click()
    expect(item.locator(".jp-SlurmRay-badge")).to_have_text("STOPPED", timeout=90_000)
    wait_for(lambda: not in_queue(cluster.job_id), 40, "the job to leave squeue")
    wait_for(lambda: cluster.state.is_final, 30, "this process seeing the end")
