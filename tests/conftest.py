"""Fixtures of the whole suite: the real testbed (scripts/testbed), its users, both transports.

The real tier runs as root inside the testbed's login namespace (``scripts/testbed exec``),
i.e. "on the login node". Local-transport tests act as the unprivileged user through
``runuser``; SSH tests log in to the login node's sshd as that user with the testbed's keys.
The fast tier (``tests/fast``) overrides ``transport`` with a scripted Slurm and needs none of
this. Helpers live in ``tests/helpers``.
"""

from __future__ import annotations

import logging
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from hypothesis import settings

from jupyter_slurm_ray.transport import LocalTransport, SSHTransport

from .helpers.gate import wait_at_the_gate
from .helpers.testbed import Testbed, runuser, ssh_transport, testbed_from_environment

# No example database: tests leave no files outside their tmp dirs (.hypothesis/ included).
settings.register_profile("jupyter-slurm-ray", database=None)
settings.load_profile("jupyter-slurm-ray")


#: The groups that take longest, longest first (seconds in a full run on 2 cores; the bare
#: names are tests_browser/'s files): under ``--no-loadscope-reorder`` (scripts/run-tests)
#: pytest-xdist hands the groups to its workers in this order, so the long ones start first and
#: the short ones (the others, in collection order) fill the workers at the end. A stale list
#: costs time, never a result.
LONGEST_FIRST = (
    "solo",  # 467: every solo test, one after the other
    "bob-squats-ports",  # 399: bob's port games, the hub's and OOD's modules
    "neighbour-after-start",  # 330: bob on the running cluster, three minutes of it draining
    "tests.test_cluster",  # 184
    "tests.test_bootstrap",  # 170
    "tests.test_faults",  # 145
    "tests.test_driver_mode",  # 108
    "tests.test_ownership",  # 99
    "test_walltime_notification",  # 96: a two-minute walltime running out
    "tests.test_containers",  # 91
    "tests.test_local_mode",  # 89
    "tests.test_proxy",  # 76
    "tests.test_cluster_ssh",  # 75
    "test_lab_state",  # 71: a Lab restarted
    "tests.test_packs",  # 68
    "tests.test_server",  # 64
    "tests.test_magics",  # 53
    "tests.test_doctor",  # 51
    "test_labextension",  # 50
    "tests.test_slurm_real",  # 49: its tests that are not solo
    "tests.test_notebooks",  # 42
    "tests.test_accounting",  # 37
    "tests.test_proxy_variables",  # 34
    "test_quickstart_lab",  # 34
    "test_takeover",  # 27
)


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> Iterator[None]:
    """Under ``--dist loadgroup`` (scripts/run-tests) a test module is one group unless its
    tests name another: the module's shared clusters and servers start once, on one worker.
    The tests marked ``solo`` are one group: each takes the whole solo partition. Groups are
    given before pytest-xdist reads them; the groups of :data:`LONGEST_FIRST` come first, once
    pytest has ordered the tests by their fixtures."""
    for item in items:
        if item.get_closest_marker("solo") is not None:
            item.add_marker(pytest.mark.xdist_group("solo"))
        elif item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__ if item.module else ""))
    yield
    items.sort(key=_longest_first)  # stable: a group's tests keep their order


def _longest_first(item: pytest.Item) -> int:
    marker = item.get_closest_marker("xdist_group")
    group = marker.args[0] if marker is not None and marker.args else ""
    return LONGEST_FIRST.index(group) if group in LONGEST_FIRST else len(LONGEST_FIRST)


@pytest.hookimpl(tryfirst=True)  # before a pytest-xdist worker reports its collection
def pytest_collection_finish() -> None:
    """Collected: wait for scripts/run-tests to open the gate (tests/helpers/gate.py)."""
    wait_at_the_gate()


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's, in the controller
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    """Under ``--dist loadgroup`` every test id a worker collected carries its group: when
    none does, pytest-xdist ignores the groups without a word (pytest-xdist#1386, pytest 9.2)
    and tests that must not share the testbed would run at once."""
    if node.config.getoption("dist") != "loadgroup" or not ids:
        return
    if not any("@" in nodeid for nodeid in ids):
        pytest.exit(
            f"--dist loadgroup has no effect with pytest {pytest.__version__} and this "
            f"pytest-xdist ({ids[0]} has no group in its id): install the versions the [test] "
            "extra in pyproject.toml allows (scripts/setup --tests)",
            returncode=pytest.ExitCode.USAGE_ERROR,
        )


@pytest.fixture(scope="session")
def testbed() -> Testbed:
    found = testbed_from_environment()
    if found is None:
        pytest.fail(
            "the Slurm testbed is not up or its environment is missing: run the tests with "
            "scripts/run-tests (or: scripts/testbed up && scripts/testbed exec -- pytest)",
            pytrace=False,
        )
    return found


@pytest.fixture(scope="session")
def solo_nodes(testbed: Testbed) -> tuple[str, ...]:
    """The nodes of the solo partition (:data:`~tests.helpers.testbed.SOLO`), at least 3."""
    if testbed.solo_nodes < 3:
        pytest.fail(
            f"the testbed has {testbed.solo_nodes} solo nodes; the tests marked solo need 3: "
            "scripts/testbed up -s 3 (the default)",
            pytrace=False,
        )
    return testbed.solo_node_names


@pytest.fixture
async def local(testbed: Testbed) -> AsyncIterator[LocalTransport]:
    """The unprivileged user on the login node."""
    async with LocalTransport(runuser(testbed.user)) as transport:
        yield transport


@pytest.fixture
async def ssh(testbed: Testbed) -> AsyncIterator[SSHTransport]:
    """The unprivileged user on the login node, reached over SSH from the laptop side."""
    async with ssh_transport(testbed) as transport:
        yield transport


@pytest.fixture(params=["local", "ssh"])
async def transport(request, testbed: Testbed) -> AsyncIterator:
    """Each test using this runs once per transport."""
    if request.param == "local":
        t = LocalTransport(runuser(testbed.user))
    else:
        t = ssh_transport(testbed)
    async with t:
        yield t


@pytest.fixture
def unique_name() -> str:
    return "t" + uuid.uuid4().hex[:10]


@pytest.fixture
def cancel_jobs() -> Iterator[list[str]]:
    """Tests append the job ids they submit; whatever is still queued is cancelled at the end."""
    jobs: list[str] = []
    yield jobs
    if jobs:
        subprocess.run(["scancel", *jobs], check=False, capture_output=True)


@pytest.fixture
def root_logging_kept() -> Iterator[None]:
    """The root logger's handlers and level as they were: ``cli.main`` calls basicConfig, whose
    handler would keep writing to the test's (then closed) captured stderr."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
