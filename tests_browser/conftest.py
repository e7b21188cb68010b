"""Shared by the browser tests: Debian's Chromium for Playwright, and where screenshots go.

Each test file starts what it needs (a JupyterLab, a cluster); keep this file small and re-read
it before editing, it is shared.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    """pytest-playwright launches Debian's Chromium (no downloaded browser builds here)."""
    return {
        **browser_type_launch_args,
        "executable_path": CHROMIUM,
        "args": CHROMIUM_ARGS,
        "headless": True,
    }


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
