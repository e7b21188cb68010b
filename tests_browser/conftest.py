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


#: The files that wait longest (a cluster's two-minute walltime running out, a Lab restarted,
#: a hub spawning servers as Slurm jobs), collected first: under ``--dist loadfile
#: --no-loadscope-reorder`` (scripts/run-tests) pytest-xdist hands files to its workers in
#: collection order, so the short files fill the other workers meanwhile instead of one of
#: them being left with a long file at the end.
WAIT_LONGEST = ("test_walltime_notification.py", "test_lab_state.py", "test_hub.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        name = item.path.name
        return WAIT_LONGEST.index(name) if name in WAIT_LONGEST else len(WAIT_LONGEST)

    items.sort(key=rank)  # stable: a file's tests keep their order
