"""Shared by the browser tests: Debian's Chromium for Playwright, and where screenshots go.

Each test file starts what it needs (a JupyterLab, a cluster); keep this file small and re-read
it before editing, it is shared.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, sync_playwright

from tests.helpers.paths import ARTIFACTS  # `tests` is importable: pythonpath in pytest.ini

CHROMIUM = os.environ.get("JSR_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test here is marked ``browser`` (scripts/run-tests selects them by it where the
    host's Chromium and Slurm are: the bookworm flavour)."""
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.browser)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Debian's Chromium (no downloaded browser builds here), one per test file.

    Not pytest-playwright's session-wide browser: Playwright's sync API leaves its event loop
    the thread's running loop for as long as it lives, and scripts/run-tests runs these files in
    the real tier's session, where an asyncio test that comes after them on the same worker
    could not start its own loop ("Runner.run() cannot be called from a running event loop").
    """
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True
        )
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture(scope="session")
def artifacts() -> Path:
    """``test-artifacts/`` at the repository root (screenshots, logs)."""
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


@pytest.fixture(scope="session")
def testbed_user() -> str:
    if os.environ.get("JSR_TESTBED") != "1":
        pytest.fail(
            "run inside the testbed: scripts/testbed exec -- python -m pytest tests_browser"
        )
    return os.environ["JSR_USER"]
