"""One owner per cluster, with real kernels on the testbed, a Jupyter server's housekeeping on.

Kernel A owns a connected cluster and runs tasks on it. Kernel B attaches it (an observer),
runs tasks too and exits normally; a second B attaches and is SIGKILLed. Each time A's cluster
keeps running (also through the server's housekeeping, which reaped a cluster whose recorded
owner was gone) and A's tasks run. Then kernel C takes it over with ``--takeover``: A is told
(its status says ``owned by pid N on host``) and A's exit no longer cancels it. C stops it, and
nothing is left: no job, no Ray process, no record claiming it is alive.
"""

from __future__ import annotations

import re
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from jupyter_slurm_ray.registry import ClusterRecord, Registry
from jupyter_slurm_ray.ui.cli import main

from .helpers.clusters import wait_until_nothing_left
from .helpers.faults import record_figure
from .helpers.jobs import pending_or_running
from .helpers.notebook import NotebookKernel
from .helpers.server import JupyterServer, jupyter_server
from .helpers.site import configured_site
from .helpers.testbed import USER
from .helpers.waiting import wait_for

pytestmark = pytest.mark.testbed

HOUSEKEEPING = 10.0  # the server's housekeeping interval (manager.py), seconds
TASK = "import ray\nprint(ray.get(ray.remote(lambda: 6 * 7).remote()))"


@pytest.fixture(scope="module")
def site_dir(tmp_path_factory, testbed) -> Iterator[Path]:
    directory = tmp_path_factory.mktemp("owners")
    with configured_site(directory):
        yield directory


@pytest.fixture(scope="module")
def server(site_dir) -> Iterator[JupyterServer]:
    """A Jupyter server with the extension on the same registry: its housekeeping runs."""
    with jupyter_server(site_dir, USER) as running:
        yield running


@pytest.fixture(scope="module")
def owner(site_dir, server) -> Iterator[dict]:
    """Kernel A: it started the cluster (connected) and runs tasks on it."""
    kernel = NotebookKernel()
    name = "o" + uuid.uuid4().hex[:8]
    try:
        kernel.run("%load_ext jupyter_slurm_ray")
        out = kernel.run(f"%slurm_ray up --profile testbed --name {name}")
        assert "CONNECTED" in out, out
        assert kernel.run(TASK) == "42\n"
        yield {"kernel": kernel, "name": name, "pid": kernel.pid, "registry": registry()}
    finally:
        kernel.stop()


def registry() -> Registry:
    return Registry()  # the site's state dir (JUPYTER_SLURM_RAY_STATE_DIR)


def record_of(owner: dict) -> ClusterRecord:
    found = owner["registry"].find(owner["name"])
    assert found is not None
    return found


def observers(record: ClusterRecord) -> list[int]:
    return [process.pid for process in record.observer_processes]


def still_running_for(owner: dict, seconds: float) -> None:
    """The cluster keeps running, for longer than a housekeeping round, and A's tasks run."""
    job_id = record_of(owner).job_id
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert pending_or_running(job_id), f"job {job_id} ended"
        time.sleep(1)
    assert owner["kernel"].run(TASK) == "42\n"
    assert pending_or_running(job_id)


def attach(kernel: NotebookKernel, name: str, *options: str) -> str:
    kernel.run("%load_ext jupyter_slurm_ray")
    return kernel.run(f"%slurm_ray attach {name} {' '.join(options)}".rstrip())


def test_a_second_kernel_observes_and_its_normal_exit_leaves_the_cluster_running(owner, server):
    observer = NotebookKernel()
    try:
        out = attach(observer, owner["name"])
        owned_by = f"observing; owned by pid {owner['pid']} on {socket.gethostname()}"
        assert "CONNECTED" in out and owned_by in out, out
        assert "its exit leaves the cluster running" in out
        assert observer.run(TASK) == "42\n"  # an observer runs tasks too
        pid = observer.pid
        record = record_of(owner)
        assert (record.owner_pid, record.owner_term, observers(record)) == (owner["pid"], 0, [pid])
    finally:
        observer.stop()  # a normal exit: its atexit hooks run
    started = time.monotonic()
    still_running_for(owner, HOUSEKEEPING + 5)
    record = record_of(owner)
    assert (record.owner_pid, observers(record)) == (owner["pid"], [])
    assert "cancelling job" not in server.log()
    record_figure(
        "second kernel attaches and exits", cluster_kept_s=round(time.monotonic() - started, 1)
    )


def test_a_second_kernel_killed_while_observing_leaves_the_cluster_running(owner, server):
    observer = NotebookKernel()
    out = attach(observer, owner["name"])
    assert f"observing; owned by pid {owner['pid']}" in out, out
    pid = observer.pid
    assert observers(record_of(owner)) == [pid]
    observer.kill()
    started = time.monotonic()
    still_running_for(owner, HOUSEKEEPING + 5)
    record = record_of(owner)
    assert record.owner_pid == owner["pid"] and observers(record) == []  # judged gone
    assert "cancelling job" not in server.log()
    record_figure(
        "second kernel attaches and is killed", cluster_kept_s=round(time.monotonic() - started, 1)
    )


@pytest.mark.usefixtures("root_logging_kept")
def test_gc_where_the_owner_keeps_no_record_leaves_the_cluster_to_its_owner(
    owner, tmp_path, monkeypatch, capsys
):
    """``gc`` with a registry that knows nothing of A's cluster (A's is on its laptop, say):
    A's lease in the job dir says A keeps it, so it is no orphan and nothing is cancelled."""
    job_id = record_of(owner).job_id
    assert job_id
    monkeypatch.setenv("JUPYTER_SLURM_RAY_STATE_DIR", str(tmp_path / "elsewhere"))
    assert main(["gc", "--yes", job_id]) == 0
    out = capsys.readouterr().out
    kept = rf"job {job_id} \(cluster {owner['name']}-\w+\): no record of it here, but "
    kept += rf"pid {owner['pid']} on {socket.gethostname()} keeps its lease \(renewed \d+ s ago\)"
    assert re.search(kept, out), out
    assert "no orphaned jobs" in out and f"cancelled job {job_id}" not in out
    still_running_for(owner, 3)


def test_takeover_moves_ownership_the_old_owner_is_told_and_its_exit_cancels_nothing(owner, server):
    a = owner["kernel"]
    taker = NotebookKernel()
    try:
        out = attach(taker, owner["name"], "--takeover")
        assert "CONNECTED" in out and "observing" not in out, out
        pid = taker.pid
        record = record_of(owner)
        assert (record.owner_pid, record.owner_term) == (pid, 1)
        told = f"taken over; owned by pid {pid} on {socket.gethostname()}"

        def status_if_told() -> str | None:
            status = a.run("%slurm_ray status")
            return status if told in status else None

        started = time.monotonic()
        status = wait_for(status_if_told, 40, "kernel A told who owns the cluster now", step=2)
        seen_after = time.monotonic() - started
        assert re.search(r"owner +pid \d+ on .*; this process observes", status), status
        assert a.run(TASK) == "42\n"  # A's Ray Client still works
        assert observers(record_of(owner)) == [owner["pid"]]
        job_id, job_dir = record.job_id, record.job_dir
        a.stop()  # A's normal exit: it no longer owns the cluster, so it cancels nothing
        time.sleep(HOUSEKEEPING + 5)
        assert pending_or_running(job_id)
        assert taker.run(TASK) == "42\n"
        assert "cancelling job" not in server.log()
        out = taker.run(f"%slurm_ray down {owner['name']}")
        assert "STOPPED" in out, out
        wait_until_nothing_left(job_id, job_dir)
        assert record_of(owner).is_final  # no record claims it is alive
        record_figure("takeover", old_owner_told_after_s=round(seen_after, 1))
    finally:
        taker.stop()
