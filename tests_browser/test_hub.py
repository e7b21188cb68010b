"""JupyterHub on Slurm in headless Chromium, the way a user goes: log in to the testbed's hub
(``scripts/hub``) as alice, her server spawned as a Slurm job on a compute node, a notebook runs
``%slurm_ray up -N 2``, the status widget reaches CONNECTED, the walltime notification appears,
the sidebar's Dashboard tab renders Ray's dashboard, Stop from the sidebar leaves nothing; then
bob, logged in to the same hub, sees none of it and reaches none of it. Screenshots go to
``test-artifacts/hub-*.png``.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from playwright.sync_api import Browser, Page, expect

from tests.helpers.bootstrap import scancel
from tests.helpers.clusters import wait_until_nothing_left
from tests.helpers.hub import (
    HubUser,
    forget_record,
    login_node_address,
    record_of,
    script,
    service,
    user_records,
)
from tests.helpers.sidebar import open_sidebar

# scripts/run-tests: one pytest-xdist group with tests/test_hub.py and tests/test_ood.py (the
# same hub and Apache on the login node) and the tests where bob squats ports (see there)
pytestmark = pytest.mark.xdist_group("bob-squats-ports")

NOTEBOOK = "jsr-hub-demo.ipynb"
NAME = f"hubdemo{secrets.token_hex(3)}"  # alice's registry outlives a run: her older records stay
UP_TIMEOUT_MS = 240_000


@pytest.fixture(scope="module")
def hub(testbed_user) -> Iterator[str]:
    with service("hub"):
        yield f"http://{login_node_address()}:8000/"


@pytest.fixture(scope="module")
def notebook(testbed_user) -> Iterator[Path]:
    """In alice's home: load the extension, warn 150 s before the end of a 3-minute walltime
    (so the warning comes while the test looks), bring a 2-node cluster up."""
    home = Path(os.path.expanduser(f"~{testbed_user}"))
    cells = [
        "%load_ext jupyter_slurm_ray\n%config SlurmRay.walltime_warning = 150",
        f"%slurm_ray up -N 2 -t 3 --name {NAME}",
    ]
    book = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    book.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)"}
    path = home / NOTEBOOK
    nbformat.write(book, path)
    shutil.chown(path, testbed_user, testbed_user)
    yield path
    path.unlink(missing_ok=True)
    checkpoints = home / ".ipynb_checkpoints"
    (checkpoints / NOTEBOOK.replace(".ipynb", "-checkpoint.ipynb")).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        checkpoints.rmdir()  # when only this test made it


def log_in(browser: Browser, hub: str, user: str) -> Page:
    """A fresh browser context logged in to the hub as ``user`` (PAM password)."""
    page = browser.new_context(viewport={"width": 1400, "height": 950}).new_page()
    page.goto(f"{hub}hub/login")
    page.fill("#username_input", user)
    page.fill("#password_input", script("hub", "login", user).strip())
    page.click("#login_submit")
    return page


def server_up(page: Page, user: str) -> None:
    """After login the hub spawns the server (a Slurm job) and sends the browser to its Lab."""
    expect(page).to_have_url(re.compile(rf"/user/{user}/lab"), timeout=180_000)
    page.wait_for_selector("#jp-main-dock-panel", timeout=120_000)


@pytest.fixture(scope="module")
def users(testbed_user) -> Iterator[dict[str, HubUser]]:
    """The hub's view of alice and bob, to stop their servers whatever happens."""
    both = {name: HubUser(name) for name in (testbed_user, os.environ["JSR_USER2"])}
    yield both
    for user in both.values():
        if user.server_jobs():
            user.login()
            user.stop_server()
        user.remove_server_logs()


@pytest.fixture(scope="module")
def forgotten(testbed_user) -> Iterator[None]:
    """The records of this run's clusters go once bob has looked, after their jobs (cancelled
    when a failed test left one running) and processes."""
    yield
    for path in user_records(testbed_user).glob(f"{NAME}-*.json"):
        record = record_of(testbed_user, path.stem)
        if record.get("job_id"):
            scancel(record["job_id"])
            wait_until_nothing_left(record["job_id"], record["job_dir"], timeout=60)
        forget_record(testbed_user, path.stem)


def test_alice_brings_a_cluster_up_from_a_notebook_on_her_hub_server_and_stops_it(
    browser: Browser, hub, notebook, users, testbed_user, artifacts, forgotten
):
    page = log_in(browser, hub, testbed_user)
    server_up(page, testbed_user)
    (server_job,) = users[testbed_user].server_jobs()  # her server: a Slurm job
    page.goto(f"{hub}user/{testbed_user}/lab/tree/{NOTEBOOK}")
    book = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")
    expect(book.locator(".jp-Cell").first).to_be_visible(timeout=60_000)
    expect(page.get_by_text(re.compile(r"Python 3 \(ipykernel\) \| Idle"))).to_be_visible(
        timeout=60_000
    )
    book.locator(".jp-Cell").first.click()
    page.keyboard.press("Escape")
    page.keyboard.press("Shift+Enter")
    page.keyboard.press("Shift+Enter")
    connected = book.locator(".widget-html-content span").filter(has_text=re.compile("^CONNECTED$"))
    try:
        expect(connected).to_be_visible(timeout=UP_TIMEOUT_MS)
    finally:
        page.screenshot(path=str(artifacts / "hub-notebook-connected.png"), full_page=True)
    link = book.locator(".widget-html-content a", has_text=f"/user/{testbed_user}/slurm-ray/")
    expect(link.first).to_be_visible()  # the kernel's link is under the hub's base URL

    open_sidebar(page)
    item = page.locator(".jp-SlurmRay-cluster").filter(has_text=NAME)
    # the sidebar asks every 5 s (refreshInterval) for a listing that may be 3 s old: a state
    # the kernel just wrote reaches it up to about 8 s later, more on a busy machine
    badge = item.locator(".jp-SlurmRay-badge")
    expect(badge).to_have_text(re.compile("CONNECTED|READY"), timeout=30_000)
    # connected once the head answers; the second node may join later on a busy machine
    expect(item.locator(".jp-SlurmRay-facts")).to_contain_text("Nodes 2/2", timeout=60_000)
    cluster_id = item.get_attribute("data-cluster-id")
    toast = page.locator(".Toastify__toast").filter(has_text=f"the walltime of {NAME}")
    expect(toast).to_have_count(1, timeout=120_000)

    item.get_by_role("button", name="Dashboard").click()
    frame = page.frame_locator(f"#slurm-ray-dashboard-{cluster_id} iframe")
    frame.get_by_text("Cluster", exact=True).first.click(timeout=60_000)
    # in a Slurm job, connect = "auto" makes the kernel a Ray driver: the 2 nodes and the
    # kernel's own, unless the head runs on the server's node (the kernel's node is the head's)
    assert cluster_id
    reason = record_of(testbed_user, cluster_id).get("connect_reason") or ""
    alive = 2 if reason.endswith("the head's Ray node on this host") else 3
    expect(frame.get_by_text(f"ALIVE x {alive}", exact=True)).to_be_visible(timeout=60_000)
    src = page.locator(f"#slurm-ray-dashboard-{cluster_id} iframe").get_attribute("src") or ""
    assert src.startswith(f"/user/{testbed_user}/slurm-ray/dashboard/{cluster_id}/~"), src
    page.wait_for_timeout(1000)
    page.screenshot(path=str(artifacts / "hub-dashboard.png"))

    assert cluster_id
    record = record_of(testbed_user, cluster_id)
    open_sidebar(page)
    item.get_by_role("button", name="Stop").click()
    confirm = page.locator(".jp-Dialog .jp-mod-accept")
    if confirm.count():
        confirm.click()
    expect(badge).to_have_text(re.compile("STOPPED|CANCELLED"), timeout=120_000)
    wait_until_nothing_left(record["job_id"], record["job_dir"], timeout=60)
    page.screenshot(path=str(artifacts / "hub-stopped.png"))
    assert users[testbed_user].server_jobs() == [server_job]  # her server still runs
    page.context.close()


def test_bob_on_the_same_hub_sees_none_of_alices_clusters(
    browser: Browser, hub, users, testbed_user, artifacts
):
    alice_ids = {p.stem for p in user_records(testbed_user).glob("*.json")}
    assert alice_ids, "alice's server recorded no cluster"
    bob = os.environ["JSR_USER2"]
    page = log_in(browser, hub, bob)
    server_up(page, bob)
    open_sidebar(page)
    page.wait_for_timeout(3000)  # a listing or two
    shown = set(page.locator(".jp-SlurmRay-cluster").evaluate_all(
        "items => items.map(i => i.dataset.clusterId)"
    ))  # fmt: skip
    assert not shown & alice_ids, shown
    expect(page.locator("#jp-SlurmRay-sidebar")).not_to_contain_text(NAME)
    page.screenshot(path=str(artifacts / "hub-bob-sidebar.png"))
    for cluster_id in alice_ids:
        response = page.request.get(f"{hub}user/{testbed_user}/slurm-ray/dashboard/{cluster_id}/")
        assert response.status == 403, response.status  # the hub: not bob's server
        assert "Ray Dashboard" not in response.text()
        mine = page.request.get(f"{hub}user/{bob}/slurm-ray/dashboard/{cluster_id}/")
        assert mine.status == 404, mine.status
    page.context.close()
