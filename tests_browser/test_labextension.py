"""The JupyterLab extension in a real browser: sidebar, sandboxed dashboard tab, stop, forget.

JupyterLab runs as ``python -m jupyterlab`` (its real PID) with a token and a temporary
settings directory; a cluster is started from Python as the testbed user, a stand-in for a
notebook. Debian's Chromium is driven headless by Playwright. What the server cannot be made to
report on demand (Slurm silent, a node lost) is shown from a listing the test serves instead.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, Route, expect

from tests.helpers.server import JupyterServer, jupyter_lab, start_cluster
from tests.helpers.sidebar import open_recent, open_sidebar


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("lab")


@pytest.fixture(scope="module")
def cluster(root, testbed_user):
    cluster = start_cluster(root / "state", testbed_user, "labtest")
    yield cluster
    cluster.down()


@pytest.fixture(scope="module")
def lab(root, testbed_user, cluster) -> Iterator[JupyterServer]:
    with jupyter_lab(root, testbed_user) as server:
        yield server


@pytest.fixture(scope="module")
def console() -> list[str]:
    return []


@pytest.fixture(scope="module")
def page(browser: Browser, lab: JupyterServer, console: list[str]) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            console.append(message.text)

    page.on("console", on_console)
    page.on("pageerror", lambda error: console.append(f"pageerror: {error}"))
    page.goto(f"{lab.url}lab?token={lab.token}")
    page.wait_for_selector("#jp-main-dock-panel", timeout=60_000)
    yield page
    context.close()


def card(page: Page, cluster_id: str):
    return page.locator(f'.jp-SlurmRay-cluster[data-cluster-id="{cluster_id}"]')


def real_listing(page: Page, cluster_id: str) -> tuple[dict, dict]:
    """The server's listing now, and the cluster's row in it."""
    real = page.request.get(page.url.split("/lab")[0] + "/slurm-ray/api/clusters").json()
    return real, next(c for c in real["clusters"] if c["id"] == cluster_id)


@contextmanager
def serving(page: Page, listing: dict) -> Iterator[None]:
    """The sidebar reads ``listing`` (the test may change it) instead of the server's listing,
    refreshed at once; the server's again, refreshed, when the block ends. Only the GETs: what
    the buttons ask still reaches the server."""

    def serve(route: Route) -> None:
        if route.request.method == "GET":
            route.fulfill(json=listing)
        else:
            route.fallback()

    pattern = re.compile(r".*/slurm-ray/api/clusters(\?.*)?$")
    page.route(pattern, serve)
    try:
        open_sidebar(page)
        page.locator(".jp-SlurmRay-refresh").click()
        yield
    finally:
        page.unroute(pattern)
        page.locator(".jp-SlurmRay-refresh").click()


def test_lab_loads_with_the_extension_and_no_console_errors(page, console):
    open_sidebar(page)
    expect(page.locator("#jp-SlurmRay-sidebar h2")).to_have_text("Slurm Ray")
    page.wait_for_timeout(2000)  # let late errors arrive
    assert console == []


def test_the_sidebar_shows_the_cluster_with_its_live_state(page, cluster):
    open_sidebar(page)
    item = card(page, cluster.id)
    expect(item.locator(".jp-SlurmRay-badge")).to_have_text("READY", timeout=30_000)
    expect(item.locator(".jp-SlurmRay-name")).to_have_text("labtest")
    facts = item.locator(".jp-SlurmRay-facts")
    expect(facts).to_contain_text("Nodes 1/1")
    expect(facts).to_contain_text(f"Job {cluster.job_id}")
    left = item.locator('[data-fact="left"]')
    first = left.inner_text()
    page.wait_for_timeout(2100)
    assert left.inner_text() != first  # the walltime counts down


def test_open_dashboard_shows_every_node_alive_in_a_lab_tab(page, cluster, artifacts):
    open_sidebar(page)
    card(page, cluster.id).get_by_role("button", name="Dashboard").click()
    tab = page.locator(f"#slurm-ray-dashboard-{cluster.id}")
    expect(tab).to_be_visible()
    frame = page.frame_locator(f"#slurm-ray-dashboard-{cluster.id} iframe")
    frame.get_by_role("tab", name="Cluster").or_(
        frame.get_by_text("Cluster", exact=True)
    ).first.click(timeout=60_000)
    nodes = cluster.spec.nodes
    expect(frame.get_by_text(f"TOTAL x {nodes}", exact=True)).to_be_visible(timeout=60_000)
    expect(frame.get_by_text(f"ALIVE x {nodes}", exact=True)).to_be_visible()  # every node
    for host in cluster.status.nodes:
        row = frame.locator("tr", has=frame.get_by_text(host, exact=True))
        expect(row.get_by_text("ALIVE", exact=True)).to_be_visible()
    page.wait_for_timeout(1000)  # let the charts settle for the screenshot
    page.screenshot(path=str(artifacts / "labextension-dashboard.png"))


def dashboard_frame(page: Page, cluster_id: str):
    """The dashboard's frame (the Playwright Frame, for evaluating inside it)."""
    element = page.locator(f"#slurm-ray-dashboard-{cluster_id} iframe").element_handle()
    frame = element.content_frame() if element else None
    assert frame is not None
    return frame


def test_the_dashboard_runs_sandboxed_without_jupyters_origin(page, lab, cluster):
    """Its scripts cannot read the Lab page, Jupyter's cookies or use Jupyter's API."""
    iframe = page.locator(f"#slurm-ray-dashboard-{cluster.id} iframe")
    sandbox = iframe.get_attribute("sandbox") or ""
    assert "allow-scripts" in sandbox and "allow-same-origin" not in sandbox, sandbox
    assert iframe.get_attribute("referrerpolicy") == "no-referrer"
    frame = dashboard_frame(page, cluster.id)
    assert re.search(rf"/slurm-ray/dashboard/{cluster.id}/~[A-Za-z0-9_-]{{40,}}/", frame.url)
    before = _contents(lab)
    seen = frame.evaluate(
        """async () => {
          const seen = { origin: self.origin, cookie: document.cookie };
          try { seen.parent = parent.document.title; } catch (e) { seen.parent = 'blocked'; }
          for (const [name, init] of [
            ['read', { credentials: 'include' }],
            ['write', { method: 'POST', credentials: 'include', body: '{"type": "file"}' }]
          ]) {
            try {
              const r = await fetch('/api/contents', init);
              seen[name] = r.status;
            } catch (e) { seen[name] = 'refused'; }
          }
          return seen;
        }"""
    )
    assert seen == {
        "origin": "null",
        "cookie": "",
        "parent": "blocked",
        "read": "refused",
        "write": "refused",
    }, seen
    assert _contents(lab) == before  # the POST created nothing


def _contents(lab: JupyterServer) -> list[str]:
    return sorted(item["name"] for item in lab.get("api/contents").json()["content"])


def test_the_dashboards_jobs_page_lists_a_job(page, lab, cluster, artifacts):
    submitted = lab.request(
        "POST",
        f"slurm-ray/dashboard/{cluster.id}/api/jobs/",
        json={"entrypoint": "echo in-the-jobs-page"},
    )
    assert submitted.status_code == 200, submitted.text[:500]
    submission = submitted.json()["submission_id"]
    frame = page.frame_locator(f"#slurm-ray-dashboard-{cluster.id} iframe")
    frame.get_by_text("Jobs", exact=True).first.click()
    expect(frame.get_by_text(submission).first).to_be_visible(timeout=60_000)
    page.screenshot(path=str(artifacts / "labextension-dashboard-jobs.png"))


def test_the_dashboard_opened_in_a_browser_tab_runs_sandboxed_too(page, lab, cluster):
    """A kernel's link opened outside JupyterLab: redirected to the sandboxed URL."""
    tab = page.context.new_page()
    try:
        tab.goto(f"{lab.url}slurm-ray/dashboard/{cluster.id}/")
        assert re.search(rf"/slurm-ray/dashboard/{cluster.id}/~[A-Za-z0-9_-]{{40,}}/$", tab.url)
        expect(tab).to_have_title(re.compile("Ray Dashboard"))
        expect(tab.get_by_text("Cluster", exact=True).first).to_be_visible(timeout=60_000)
        assert tab.evaluate("self.origin") == "null"
    finally:
        tab.close()


def test_a_dashboard_link_in_the_page_opens_the_lab_tab(page, cluster):
    """What the kernel-side "Open dashboard" link does inside JupyterLab."""
    tab = page.locator(f'.lm-TabBar-tab[data-id="slurm-ray-dashboard-{cluster.id}"]')
    tab.locator(".lm-TabBar-tabCloseIcon").click()  # close the tab the sidebar opened
    expect(page.locator(f"#slurm-ray-dashboard-{cluster.id}")).to_have_count(0)
    page.evaluate(
        """id => {
          const a = document.createElement('a');
          a.id = 'jsr-test-link';
          a.href = `/slurm-ray/dashboard/${id}/`;
          a.target = '_blank';
          a.textContent = 'Open dashboard';
          document.querySelector('#jp-SlurmRay-sidebar').appendChild(a);
        }""",
        cluster.id,
    )
    pages_before = len(page.context.pages)
    page.click("#jsr-test-link")
    expect(page.locator(f"#slurm-ray-dashboard-{cluster.id}")).to_be_visible()
    assert len(page.context.pages) == pages_before  # no browser tab opened
    page.locator("#jsr-test-link").evaluate("n => n.remove()")


def test_copy_attach_and_show_logs(page, cluster):
    open_sidebar(page)
    item = card(page, cluster.id)
    item.get_by_role("button", name="Copy attach").click()
    expect(page.get_by_text("Copied: %slurm_ray attach labtest")).to_be_visible()
    item.get_by_role("button", name="Logs").click()
    logs = page.locator(".jp-SlurmRay-logs").last
    expect(logs).to_contain_text("--- bootstrap events ---")
    expect(logs).to_contain_text('"event":"ready"')
    expect(logs).to_contain_text("==> slurm-")


def test_a_new_listing_keeps_the_nodes_it_did_not_change(page, cluster):
    """A click landing during a refresh must reach its button: the card and its buttons stay
    the same DOM nodes across listings; a changed fact is updated in place, a button whose
    arguments changed is a new one."""
    real, mine = real_listing(page, cluster.id)
    listing = {**real, "reconciled_at": time.time(), "clusters": [mine]}
    with serving(page, listing):
        item = card(page, cluster.id)
        expect(item.locator(".jp-SlurmRay-notice")).to_have_count(0)
        marked = [item, item.get_by_role("button", name="Copy attach")]
        scale = item.get_by_role("button", name="Scale")
        for node in [*marked, scale]:
            node.evaluate("node => { node.jsrMark = true }")  # a property: not in isEqualNode
        listing["clusters"] = [{**mine, "notice": "changed by the test", "nodes_wanted": 3}]
        page.locator(".jp-SlurmRay-refresh").click()
        expect(item.locator(".jp-SlurmRay-notice")).to_have_text("changed by the test")
        for node in marked:
            assert node.evaluate("node => node.jsrMark === true")
        assert scale.evaluate("node => node.jsrMark === undefined")
        assert '"nodes":3' in (scale.get_attribute("data-args") or "")
    expect(item.locator(".jp-SlurmRay-notice")).to_have_count(0)


def test_the_palette_has_the_commands(page):
    page.keyboard.press("Control+Shift+C")
    palette = page.locator("#command-palette")
    palette.locator("input").fill("Slurm Ray")
    items = palette.locator(".lm-CommandPalette-item")
    expect(items.first).to_be_visible()
    labels = items.all_inner_texts()
    for label in (
        "Open Dashboard",
        "Stop Cluster",
        "Forget Ended Cluster",
        "Copy %slurm_ray attach",
        "Show Logs",
    ):
        assert any(label in text for text in labels), labels
    page.keyboard.press("Escape")


def test_the_sidebars_doctor_runs_a_test_job_and_shows_every_check_passing(page, artifacts):
    """Issue 10: the Doctor button of the sidebar, on the healthy testbed."""
    open_sidebar(page)
    page.locator(".jp-SlurmRay-doctor").click()
    dialog = page.locator(".jp-Dialog")
    expect(dialog.locator(".jp-Dialog-header")).to_have_text(
        "Slurm Ray doctor: ready", timeout=180_000
    )
    rows = dialog.locator("table.jsr-doctor tbody tr")
    statuses = [(rows.nth(i).get_attribute("class") or "") for i in range(rows.count())]
    assert "jsr-doctor-ok" in statuses and "jsr-doctor-fail" not in statuses, statuses
    summary = dialog.locator(".jsr-doctor-summary").inner_text()
    assert re.match(r"All \d+ checks passed; test job \d+ on node\d", summary), summary
    page.screenshot(path=artifacts / "doctor.png")
    dialog.get_by_role("button", name="Ok").click()
    expect(dialog).to_have_count(0)


def test_an_unreadable_record_is_a_row_with_forget_and_the_list_keeps_working(page, root, cluster):
    broken = root / "state" / "clusters" / "broken-0001.json"
    broken.write_text('{"id": "broken-0001", "name": ')  # truncated
    os.chmod(broken, 0o600)
    open_sidebar(page)
    page.locator(".jp-SlurmRay-refresh").click()
    row = card(page, "broken-0001")
    expect(row).to_contain_text("unreadable record broken-0001:", timeout=30_000)
    expect(row.get_by_role("button")).to_have_count(1)
    expect(row.get_by_role("button", name="Forget")).to_be_visible()
    expect(card(page, cluster.id).locator(".jp-SlurmRay-badge")).to_have_text("READY")
    row.get_by_role("button", name="Forget").click()
    dialog = page.locator(".jp-Dialog")
    expect(dialog).to_contain_text("Forget the cluster?")
    dialog.get_by_role("button", name="Forget").click()
    expect(row).to_have_count(0, timeout=30_000)
    assert not broken.exists()
    expect(card(page, cluster.id)).to_be_visible()


def test_slurm_silence_and_lost_nodes_are_shown(page, cluster, artifacts):
    """From a listing the test serves: Slurm silent for 45 s, node2 lost, a hostile record."""
    real, mine = real_listing(page, cluster.id)
    now = time.time()
    listing = {
        **real,
        "reconciled_at": now,
        "clusters": [
            {**mine, "slurm_unreachable_since": now - 45, "nodes_lost": ["node2"]},
            {"id": "hostile-0001", "unreadable": True, "error": "<img src=x onerror=alert(1)>"},
        ],
    }
    with serving(page, listing):
        item = card(page, cluster.id)
        silent = item.locator(".jp-SlurmRay-unreachable")
        expect(silent).to_have_text(re.compile(r"Slurm not answering for 0:4[5-9]"))
        expect(item.locator(".jp-SlurmRay-badge")).to_have_text("READY")  # the last known
        expect(item.locator(".jp-SlurmRay-lost")).to_have_text("node2 lost")
        first = silent.inner_text()
        page.wait_for_timeout(2100)
        assert silent.inner_text() != first  # it ticks
        hostile = card(page, "hostile-0001")
        expect(hostile).to_contain_text("unreadable record hostile-0001: <img src=x")
        expect(hostile.locator("img")).to_have_count(0)  # text, never markup
        page.locator("#jp-SlurmRay-sidebar").screenshot(
            path=str(artifacts / "labextension-slurm-silent.png")
        )
    expect(card(page, "hostile-0001")).to_have_count(0)


def test_worker_groups_and_the_last_scaling_decision_are_shown(page, cluster, artifacts):
    """From a listing the test serves (the REST side is tests/fast): worker jobs of two groups,
    one pending with Slurm's reason and estimated start, and the decisions with their cause."""
    real, mine = real_listing(page, cluster.id)
    job = {"state": "RUNNING", "reason": None, "joined": True, "estimated_start": None}
    scaled = {
        **mine,
        "nodes_joined": 2,
        "nodes_wanted": 3,
        "worker_jobs": [
            {**job, "job_id": "901", "host": "node2", "group": "default"},
            {
                **job,
                "job_id": "902",
                "host": None,
                "group": "gpu",
                "state": "PENDING",
                "reason": "Resources",
                "joined": False,
                "estimated_start": "2026-12-01 14:05",
            },
        ],
        "scaling": [
            "10:00:01 1 → 2 nodes (submitted 901): scale() by its owner",
            "10:02:00 2 → 3 nodes (gpu) (submitted 902): more GPUs <b>now</b>",
        ],
    }
    listing = {**real, "reconciled_at": time.time(), "clusters": [scaled]}
    with serving(page, listing):
        item = card(page, cluster.id)
        expect(item.locator(".jp-SlurmRay-scaling")).to_have_text(
            "2/3 nodes alive · worker jobs: default: 1 running; "
            "gpu: 0 running, 1 pending (Resources, est. start 2026-12-01 14:05)"
        )
        decision = item.locator(".jp-SlurmRay-decision")
        expect(decision).to_have_text(scaled["scaling"][-1])  # text, never markup
        assert decision.get_attribute("title") == "\n".join(scaled["scaling"])
        page.locator("#jp-SlurmRay-sidebar").screenshot(
            path=str(artifacts / "labextension-worker-groups.png")
        )
    expect(card(page, cluster.id).locator(".jp-SlurmRay-decision")).to_have_count(0)


def test_stop_ends_the_slurm_job(page, cluster, artifacts):
    open_sidebar(page)
    item = card(page, cluster.id)
    item.get_by_role("button", name="Stop").click()
    dialog = page.locator(".jp-Dialog")
    expect(dialog).to_contain_text("Stop the cluster?")
    dialog.get_by_role("button", name="Stop").click()
    badge = item.locator(".jp-SlurmRay-badge")
    expect(badge).to_have_text(re.compile("STOPPED|CANCELLED"), timeout=90_000)
    page.screenshot(path=str(artifacts / "labextension-stopped.png"))
    deadline = time.monotonic() + 30
    while _squeue_state(cluster.job_id) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _squeue_state(cluster.job_id) == ""


def _squeue_state(job_id: str) -> str:
    return subprocess.run(
        ["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, check=False
    ).stdout.strip()


def test_forget_removes_an_ended_cluster(page, root, cluster):
    open_sidebar(page)
    item = card(page, cluster.id)
    expect(item.locator(".jp-SlurmRay-badge")).to_have_text(re.compile("STOPPED|CANCELLED"))
    # an ended cluster is folded under the sidebar's "Recent: N ended" group
    recent = page.locator(".jp-SlurmRay-recent summary")
    expect(recent).to_have_text(re.compile(r"Recent: \d+ ended"))
    expect(item).to_be_hidden()
    open_recent(page)
    expect(item).to_be_visible()
    expect(item.get_by_role("button", name="Stop")).to_be_disabled()
    item.get_by_role("button", name="Forget").click()
    dialog = page.locator(".jp-Dialog")
    expect(dialog).to_contain_text("Forget the cluster?")
    dialog.get_by_role("button", name="Forget").click()
    expect(item).to_have_count(0, timeout=30_000)
    assert not (root / "state" / "clusters" / f"{cluster.id}.json").exists()
    page.locator(".jp-SlurmRay-refresh").click()
    page.wait_for_timeout(1000)
    expect(item).to_have_count(0)  # not back with the next listing
