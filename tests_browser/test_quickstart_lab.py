"""The quickstart notebook in JupyterLab in headless Chromium: the live status widget of
``%slurm_ray up`` reaches CONNECTED, the tasks run on every node, ``down`` stops the cluster.

JupyterLab (``python -m jupyterlab``, token auth, news off, the server extension on) runs as root
on the testbed's login node; its kernels get the settings scripts/quickstart uses, so clusters
are submitted as the test user.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.helpers.paths import REPO
from tests.helpers.server import JupyterServer, jupyter_lab
from tests.helpers.site import cancel_recorded_jobs, kernel_environment

UP_TIMEOUT_MS = 240_000


@pytest.fixture(scope="module")
def lab(tmp_path_factory, testbed_user: str) -> Iterator[JupyterServer]:
    root = tmp_path_factory.mktemp("quickstart-lab")
    shutil.copy(REPO / "notebooks" / "quickstart.ipynb", root)
    kernel_settings = kernel_environment(root)  # the server points the state dir at root/state
    with pytest.MonkeyPatch.context() as patch:
        for name, value in kernel_settings.items():
            patch.setenv(name, value)
        try:
            with jupyter_lab(root, testbed_user) as server:
                yield server
        finally:
            cancel_recorded_jobs(root / "state")


@pytest.fixture
def page(browser: Browser, lab: JupyterServer) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    yield page
    context.close()


def run_cells(page: Page, count: int) -> None:
    """Run the selected cell and the ones after it with Shift+Enter, ``count`` cells in all."""
    for _ in range(count):
        page.keyboard.press("Shift+Enter")
        time.sleep(0.2)


def test_quickstart_cells_show_the_status_widget_reach_connected(
    page: Page, lab: JupyterServer, artifacts: Path
):
    page.goto(f"{lab.url}lab/tree/quickstart.ipynb?token={lab.token}")
    notebook = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")
    expect(notebook.locator(".jp-Cell").first).to_be_visible(timeout=60_000)
    expect(page.get_by_text(re.compile(r"Python 3 \(ipykernel\) \| Idle"))).to_be_visible(
        timeout=60_000
    )
    notebook.locator(".jp-Cell").first.click()
    page.keyboard.press("Escape")  # command mode: Shift+Enter runs a cell and moves on

    started = time.monotonic()
    run_cells(page, 4)  # markdown, %load_ext, markdown, %slurm_ray up
    badges = notebook.locator(".widget-html-content span")
    expect(badges.first).to_be_visible(timeout=60_000)
    shown = time.monotonic() - started
    badge = badges.filter(has_text=re.compile(r"^CONNECTED$"))
    try:
        expect(badge).to_be_visible(timeout=UP_TIMEOUT_MS)
    finally:
        page.screenshot(path=str(artifacts / "browser-quickstart-connected.png"), full_page=True)
    print(
        f"\nthe status widget appeared {shown:.1f} s and showed CONNECTED "
        f"{time.monotonic() - started:.1f} s after the up cell was run"
    )
    expect(notebook.locator(".widget-hprogress")).to_be_visible()
    link = notebook.locator(".widget-html-content a", has_text="/slurm-ray/dashboard/")
    expect(link).to_be_visible()  # the dashboard through Jupyter's proxy

    run_cells(page, 5)  # markdown, the tasks, markdown, dashboard, down
    hosts = notebook.get_by_text(re.compile(r"hosts: \['node\d', 'node\d'\]"))
    expect(hosts).to_be_visible(timeout=120_000)
    stopped = notebook.get_by_text(re.compile(r"\): STOPPED · \(stopped on request\)"))
    expect(stopped).to_be_visible(timeout=120_000)
    expect(badge).to_have_count(0)  # the live widget followed the cluster to STOPPED
    page.screenshot(path=str(artifacts / "browser-quickstart-stopped.png"), full_page=True)
