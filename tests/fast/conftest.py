"""The fast tier: no root, no testbed, no Ray; Slurm is scripted (tests/helpers/fakeslurm.py).

Event loops. pytest-asyncio runs every ``async def`` test and fixture (``asyncio_mode = "auto"``,
a fresh loop per test: ``asyncio_default_fixture_loop_scope = "function"``, pyproject.toml). The
REST tests call the server extension, loaded in-process, with pytest-jupyter's ``jp_fetch``,
whose fixtures are sync and drive a loop of their own (``jp_asyncio_loop``) with
``run_until_complete``. Two choices make the two agree:

- pytest-jupyter is NOT loaded as a plugin (no ``pytest_plugins``, no ``-p``): its hooks would
  run every coroutine test on its own loop instead of pytest-asyncio's, and its autouse fixtures
  would make a ServerApp for every test. This conftest star-imports tests/helpers/jp_fixtures.py,
  which names only the fixtures ``jp_fetch`` needs.
- ``jp_asyncio_loop`` is overridden there by an async fixture returning the loop pytest-asyncio
  runs the test on: pytest-jupyter's sync fixtures set the server up on that loop while it is
  idle (between fixtures), the requests run on it, and it is closed after every fixture using it
  was torn down. ``server_manager`` below does the cleanup pytest-jupyter's autouse
  ``jp_server_cleanup`` would have done, and stops what the extension started.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from jupyter_server.serverapp import ServerApp
from traitlets.config import Config

from jupyter_slurm_ray import config as config_module
from jupyter_slurm_ray import session as session_module
from jupyter_slurm_ray.cluster import SlurmRayCluster
from jupyter_slurm_ray.naming import DASHBOARD_BASE_ENV
from jupyter_slurm_ray.owner import ProcessIdentity
from jupyter_slurm_ray.registry import Registry
from jupyter_slurm_ray.server.manager import ClusterManager
from jupyter_slurm_ray.slurm.schedulers import watcher_for
from jupyter_slurm_ray.spec import ClusterSpec

from ..helpers.fakeslurm import FakeSlurm, FakeTransport
from ..helpers.jp_fixtures import *  # noqa: F403  (pytest-jupyter's fixtures for jp_fetch)
from ..helpers.processes import StandIn
from ..helpers.site import write_profiles


@pytest.fixture
def slurm() -> FakeSlurm:
    return FakeSlurm()


@pytest.fixture
def transport(slurm: FakeSlurm) -> FakeTransport:
    return FakeTransport(slurm)


@pytest.fixture
def registry(tmp_path: Path) -> Registry:
    return Registry(tmp_path / "state")


@pytest.fixture
def jobs_root(tmp_path: Path) -> Path:
    root = tmp_path / "jobs"
    root.mkdir(mode=0o700)
    return root


@pytest.fixture
async def make_cluster(transport, registry, jobs_root):
    """A cluster on the fake Slurm, polled every 50 ms, job dirs under the test's tmp dir.

    At the end the clusters are closed and their watcher has stopped: a task cancelled while
    it starts a subprocess can hang the loop's shutdown.
    """
    made: list[SlurmRayCluster] = []

    def make(process: ProcessIdentity | None = None, **spec) -> SlurmRayCluster:
        settings = dict(time="10", job_dir_root=str(jobs_root), owner_timeout=8)
        settings.update(spec)
        cluster = SlurmRayCluster(
            ClusterSpec(**settings),
            transport,
            registry=registry,
            poll_interval=0.05,
            steady_poll_interval=0.05,
            process=process,  # another kernel's identity (test_ownership.py), else this one
        )
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        await cluster.close_async()
    await watcher_stopped(transport)


@pytest.fixture
def stand_ins() -> Iterator[Callable[[], StandIn]]:
    """``stand_in()``: a live process standing for another kernel; killed at the end."""
    made: list[StandIn] = []

    def make() -> StandIn:
        made.append(StandIn())
        return made[-1]

    yield make
    for stand_in in made:
        stand_in.kill()


def emit(cluster: SlurmRayCluster, *events: dict) -> None:
    """Append the bootstrap's events to the cluster's events.jsonl, as the job would."""
    assert cluster.job_dir
    with open(Path(cluster.job_dir) / "events.jsonl", "a") as f:
        for event in events:
            f.write(json.dumps(event) + "\n")


def write_connection(cluster: SlurmRayCluster, **overrides) -> None:
    assert cluster.job_dir
    info = dict(
        head_ip="10.0.0.1",
        client_port=10001,
        dashboard_port=8265,
        gcs_address="10.0.0.1:6379",
        ray_version="2.60.0",
        python_version="3.11.2",
        node_count=1,
    )
    info.update(overrides)
    listeners = {"client": info["client_port"], "dashboard": info["dashboard_port"]}
    info.setdefault("verified", {"uid": os.getuid(), "listeners": listeners})  # the bootstrap's
    (Path(cluster.job_dir) / "connection.json").write_text(json.dumps(info))


async def watcher_stopped(transport: FakeTransport) -> None:
    """Wait until the transport's job watcher has stopped (it stops once nothing is watched)."""
    watcher = watcher_for(transport)
    if watcher._task is not None:
        await asyncio.wait_for(watcher._task, 10)


# -- a site whose Slurm is the fake ------------------------------------------------------------
@pytest.fixture
def site(tmp_path: Path, jobs_root: Path, transport: FakeTransport, monkeypatch) -> dict[str, str]:
    """This process configured as a site (profiles ``testbed`` and ``gpu-small``, registry and
    job dirs in the test's tmp dir) whose transport is ``transport``, the fake Slurm's.

    Every transport the package makes from its configuration is that one: ``make_transport``
    is replaced where the package looks it up (the server extension imports it from
    ``config`` when it loads; ``session`` bound the name at import).
    """
    for name in [n for n in os.environ if n.startswith("JUPYTER_SLURM_RAY_")]:
        monkeypatch.delenv(name)
    environment = {
        "JUPYTER_SLURM_RAY_STATE_DIR": str(tmp_path / "state"),
        "JUPYTER_SLURM_RAY_PROFILES_FILE": str(write_profiles(tmp_path)),
        "JUPYTER_SLURM_RAY_JOB_DIR_ROOT": str(jobs_root),
        "JUPYTER_SLURM_RAY_POLL_INTERVAL": "0.5",
    }
    for name, value in environment.items():
        monkeypatch.setenv(name, value)

    def make_transport(config=None, environ=None) -> FakeTransport:
        return transport

    monkeypatch.setattr(config_module, "make_transport", make_transport)
    monkeypatch.setattr(session_module, "make_transport", make_transport)
    return environment


# -- the server extension, in-process ----------------------------------------------------------
@pytest.fixture
def jp_server_config(site: dict[str, str], monkeypatch) -> Iterator[Config]:
    """A Jupyter server with only this package's extension, on the fake site.

    Loading the extension sets ``$JUPYTER_SLURM_RAY_DASHBOARD_BASE`` and hands the package's
    logger to the server's handlers: both are put back afterwards.
    """
    monkeypatch.setenv(DASHBOARD_BASE_ENV, "")  # restored (unset) at the end
    log = logging.getLogger("jupyter_slurm_ray")
    handlers, propagate, level = list(log.handlers), log.propagate, log.level
    extensions = {"jupyter_slurm_ray.server": True, "jupyter_server_terminals": False}
    yield Config({"ServerApp": {"jpserver_extensions": extensions}})
    log.handlers[:] = handlers
    log.propagate = propagate
    log.setLevel(level)


@pytest.fixture
async def server_manager(jp_fetch, jp_serverapp, transport) -> AsyncIterator[ClusterManager]:
    """The extension's ClusterManager; at the end its housekeeping, the clusters it created
    and the job watcher are stopped, and the server app is cleaned up."""
    manager: ClusterManager = jp_serverapp.web_app.settings["slurm_ray_manager"]
    yield manager
    for cluster in list(manager._clusters.values()):
        await cluster.close_async()
    await manager.close()
    await watcher_stopped(transport)
    await jp_serverapp._cleanup()
    if hasattr(jp_serverapp, "kernel_manager"):
        jp_serverapp.kernel_manager.context.destroy()
    ServerApp.clear_instance()
