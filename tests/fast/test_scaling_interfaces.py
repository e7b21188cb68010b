"""Scaling from the magic, the CLI and the REST API (issue 9), on a scripted Slurm: bad input is
one line naming ``nodes``; a process that does not own the cluster asks its owner, which
applies the request; the status line shows alive / wanted / pending worker jobs."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from jupyter_slurm_ray.cluster import SlurmRayCluster
from jupyter_slurm_ray.config import SlurmRay
from jupyter_slurm_ray.elastic.adapt import Adapter
from jupyter_slurm_ray.elastic.policy import AdaptSettings
from jupyter_slurm_ray.elastic.raydemand import RayView, Shape
from jupyter_slurm_ray.elastic.scaling import recorded_adapting
from jupyter_slurm_ray.naming import job_comment
from jupyter_slurm_ray.registry import ClusterRecord, Registry
from jupyter_slurm_ray.session import Session
from jupyter_slurm_ray.spec import ClusterSpec
from jupyter_slurm_ray.states import State, Status, WorkerJobStatus
from jupyter_slurm_ray.ui.cli import main
from jupyter_slurm_ray.ui.formatting import status_line
from jupyter_slurm_ray.ui.widget import ClusterPanel

from ..helpers.fakeslurm import FakeJob
from ..helpers.ipyshell import *  # noqa: F403  (the fixtures ipython_shell and magic)
from ..helpers.ipyshell import one_line_error
from ..helpers.waiting import until
from .conftest import emit, write_connection


async def up_and_ready(cluster: SlurmRayCluster, slurm) -> None:
    """Submit on the scripted Slurm, run the job, and say its one node is up: READY."""
    await cluster.up_async(wait=False)
    slurm.run(cluster.job_id)
    write_connection(cluster)
    emit(cluster, {"event": "ready", "joined": 1, "node_count": 1})
    await until(lambda: cluster.state is State.READY, 5, "READY")


def owned_elsewhere(registry: Registry, slurm, jobs_root: Path, name: str = "grow") -> str:
    """A READY cluster's record and job dir, owned by another live process (this one's pid,
    but no cluster object here owns it)."""
    cluster_id = f"{name}-0123abcd"
    job_dir = jobs_root / cluster_id
    job_dir.mkdir(mode=0o700)
    (job_dir / "events.jsonl").write_text("")
    slurm.jobs["7"] = FakeJob("7", "", comment=job_comment(cluster_id), state="RUNNING")
    spec = ClusterSpec(name=name, time="10").to_dict()
    registry.save(
        ClusterRecord(
            id=cluster_id, name=name, target="fake", job_dir=str(job_dir), job_id="7",
            state="READY", nodes_joined=1, spec=spec,
        )
    )  # fmt: skip
    return cluster_id


def requests_in(job_dir: Path) -> list[dict]:
    lines = (job_dir / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e.get("event") == "scale_request"]


@pytest.mark.parametrize("bad", ["-1", "1.5", "three"])
def test_the_magic_scale_refuses_a_bad_count_in_one_line(magic, slurm, bad):
    _, err, error = magic.run(f"%slurm_ray scale {bad} somewhere")
    assert one_line_error(err).startswith(f"UsageError: nodes: '{bad}' is not allowed;")
    assert error is not None and slurm.calls == []


@pytest.mark.usefixtures("root_logging_kept")
def test_the_cli_scale_checks_its_arguments(site, slurm, capsys):
    assert main(["scale", "-2", "ray"]) == 1
    assert capsys.readouterr().err.startswith("jupyter slurm-ray: error: nodes: '-2'")
    assert main(["scale", "3"]) == 1
    assert "give the node count and a cluster NAME" in capsys.readouterr().err
    assert slurm.calls == []


@pytest.mark.usefixtures("root_logging_kept")
def test_the_cli_asks_the_owner_to_scale(site, slurm, jobs_root, capsys):
    cluster_id = owned_elsewhere(Registry(), slurm, jobs_root)
    assert main(["scale", "3", "grow"]) == 0
    assert "scaling to 3 nodes asked of its owner" in capsys.readouterr().out
    (request,) = requests_in(jobs_root / cluster_id)
    assert request["nodes"] == 3 and request["role"] == "client"
    assert [call for call in slurm.calls if call[0] == "sbatch"] == []  # the owner submits


async def test_the_owner_applies_requests_made_after_it_took_the_cluster(
    make_cluster, slurm, transport
):
    cluster = make_cluster()
    await cluster.up_async(wait=False)
    slurm.run(cluster.job_id)
    emit(cluster, {"t": 0, "event": "scale_request", "role": "client", "nodes": 4})  # stale
    write_connection(cluster)
    emit(cluster, {"event": "ready", "joined": 1, "node_count": 1})
    await until(lambda: cluster.state is State.READY, 15, "READY")
    assert cluster.workers.jobs == {}  # a request older than this owner is not applied
    record = cluster.registry.load(cluster.id)
    other = SlurmRayCluster.from_record(record, transport, registry=cluster.registry)
    assert not other.owned_here and cluster.owned_here
    await other.request_scale_async(3)
    await until(lambda: len(cluster.workers.jobs) == 2, 15, "two worker jobs submitted")
    assert cluster.status.nodes_wanted == 3
    events = Path(cluster.job_dir) / "events.jsonl"

    def decisions() -> list[dict]:
        lines = events.read_text().splitlines()
        return [e for e in map(json.loads, lines) if e.get("event") == "scaled"]

    # the decision is written once its jobs are recorded: just after they show
    (decision,) = await until(decisions, 15, "the scaled event")
    assert (decision["nodes_before"], decision["nodes"]) == (1, 3)
    assert sorted(decision["submitted"]) == sorted(cluster.workers.jobs)
    assert decision["cause"].startswith("asked by pid ")


async def _post(jp_fetch, cluster_id: str, body) -> tuple[int, dict]:
    response = await jp_fetch(
        "slurm-ray", "api", "clusters", cluster_id, "scale", method="POST",
        body=json.dumps(body), raise_error=False,
    )  # fmt: skip
    return response.code, json.loads(response.body)


async def test_rest_scale_asks_the_owner_and_refuses_bad_counts(
    jp_fetch, server_manager, slurm, site, jobs_root
):
    cluster_id = owned_elsewhere(Registry(site["JUPYTER_SLURM_RAY_STATE_DIR"]), slurm, jobs_root)
    for bad in ({"nodes": -1}, {"nodes": "many"}, {"nodes": 2.5}, {}):
        code, answer = await _post(jp_fetch, cluster_id, bad)
        assert (code, answer["field"]) == (400, "nodes")
    assert requests_in(jobs_root / cluster_id) == []
    for bad_group in ({"nodes": 1, "group": "GPU"}, {"nodes": 1, "group": 3}):
        code, answer = await _post(jp_fetch, cluster_id, bad_group)
        assert (code, answer["field"]) == (400, "group")
    code, answer = await _post(jp_fetch, cluster_id, {"nodes": 2})
    assert code == 202 and answer["applied"] is False and answer["worker_jobs"] == []
    assert answer["scaling"] == []
    assert [r["nodes"] for r in requests_in(jobs_root / cluster_id)] == [2]
    slurm.end("7")
    server_manager.inventory.expire()  # the listing is kept 3 s
    code, answer = await _post(jp_fetch, cluster_id, {"nodes": 2})
    assert code == 409 and "only an active cluster can be scaled" in answer["message"]


def test_the_status_line_shows_alive_wanted_and_pending_worker_jobs():
    status = Status(
        State.READY,
        job_id="7",
        nodes_joined=2,
        nodes_wanted=4,
        worker_jobs=(
            WorkerJobStatus("8", "RUNNING", None, "node2", True),
            WorkerJobStatus("9", "PENDING", "Resources"),
            WorkerJobStatus("10", "PENDING", "Priority"),
        ),
    )
    line = status_line(status, now=time.time())
    assert "2/4 nodes alive, worker jobs: 1 running, 2 pending (Priority, Resources)" in line
    assert "worker jobs" not in status_line(Status(State.READY, job_id="7"))


async def test_the_panels_plus_and_minus_scale_by_one_node(site, make_cluster, slurm, monkeypatch):
    cluster = make_cluster()
    await up_and_ready(cluster, slurm)
    panel = ClusterPanel(session=Session(SlurmRay()), cluster=cluster)
    actions: list = []
    monkeypatch.setattr(panel, "_run", actions.append)  # run here, on this test's loop
    try:
        assert not panel.grow_button.disabled and panel.shrink_button.disabled
        panel.grow_button.click()
        await actions.pop()
        (worker,) = cluster.workers.jobs
        assert cluster.status.nodes_wanted == 2 and not panel.shrink_button.disabled
        panel.shrink_button.click()
        await actions.pop()
        assert slurm.job(worker).state == "CANCELLED" and cluster.status.nodes_wanted == 1
        assert panel.shrink_button.disabled
    finally:
        panel.close()


# -- adapt from elsewhere: the CLI and the REST API ask the owner --------------------------------
def adapt_requests_in(job_dir: Path) -> list[dict]:
    lines = (job_dir / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e.get("event") == "adapt_request"]


@pytest.mark.usefixtures("root_logging_kept")
def test_the_cli_asks_the_owner_to_adapt_and_to_stop(site, slurm, jobs_root, capsys):
    cluster_id = owned_elsewhere(Registry(), slurm, jobs_root)
    assert main(["adapt", "grow", "--maximum", "0"]) == 1
    assert capsys.readouterr().err.startswith("jupyter slurm-ray: error: maximum: 0 is not")
    assert main(["adapt", "grow", "--minimum", "3", "--maximum", "2"]) == 1
    assert "at least the minimum (3)" in capsys.readouterr().err
    assert main(["adapt", "grow"]) == 1
    assert "give --maximum N" in capsys.readouterr().err
    assert main(["adapt", "grow", "--maximum", "4", "--idle", "30"]) == 0
    assert "adapting 1-4 nodes (idle 30 s" in capsys.readouterr().out
    assert main(["adapt", "grow", "--off"]) == 0
    asked = adapt_requests_in(jobs_root / cluster_id)
    assert [(r.get("minimum"), r.get("maximum"), r.get("off")) for r in asked] == [
        (1, 4, None), (None, None, True)
    ]  # fmt: skip
    assert slurm.calls == [call for call in slurm.calls if call[0] == "squeue"]


async def test_rest_adapt_asks_the_owner_and_refuses_bad_bodies(
    jp_fetch, server_manager, slurm, site, jobs_root
):
    cluster_id = owned_elsewhere(Registry(site["JUPYTER_SLURM_RAY_STATE_DIR"]), slurm, jobs_root)

    async def post(body) -> tuple[int, dict]:
        response = await jp_fetch(
            "slurm-ray", "api", "clusters", cluster_id, "adapt", method="POST",
            body=json.dumps(body), raise_error=False,
        )  # fmt: skip
        return response.code, json.loads(response.body)

    for bad, field in (
        ({"minimum": 2}, "maximum"),
        ({"maximum": -1}, "maximum"),
        ({"maximum": 3, "idle_timeout": 0}, "idle_timeout"),
        ({"maximum": 3, "nodes": 3}, "nodes"),
    ):
        code, answer = await post(bad)
        assert (code, answer["field"]) == (400, field), answer
    assert adapt_requests_in(jobs_root / cluster_id) == []
    code, answer = await post({"maximum": 3, "max_pending": 1})
    assert code == 202 and answer["applied"] is False
    code, answer = await post({"off": True})
    asked = adapt_requests_in(jobs_root / cluster_id)
    assert [(r.get("maximum"), r.get("max_pending"), r.get("off")) for r in asked] == [
        (3, 1, None), (None, None, True)
    ]  # fmt: skip


# -- adapt's settings left out come from the configuration, on every path (issue 21, item 3) --
CONFIGURED = {
    "JUPYTER_SLURM_RAY_ADAPT_IDLE_TIMEOUT": "45",
    "JUPYTER_SLURM_RAY_ADAPT_MAX_PENDING": "3",
}


@pytest.mark.usefixtures("root_logging_kept")
def test_the_cli_fills_in_the_configured_adapt_settings(site, slurm, jobs_root, monkeypatch):
    for name, value in CONFIGURED.items():
        monkeypatch.setenv(name, value)
    cluster_id = owned_elsewhere(Registry(), slurm, jobs_root)
    assert main(["adapt", "grow", "--maximum", "4"]) == 0
    (asked,) = adapt_requests_in(jobs_root / cluster_id)
    assert (asked["maximum"], asked["idle_timeout"], asked["max_pending"]) == (4, 45.0, 3)


async def test_rest_fills_in_the_configured_adapt_settings(
    jp_fetch, server_manager, slurm, site, jobs_root, monkeypatch
):
    for name, value in CONFIGURED.items():
        monkeypatch.setenv(name, value)
    cluster_id = owned_elsewhere(Registry(site["JUPYTER_SLURM_RAY_STATE_DIR"]), slurm, jobs_root)
    body = json.dumps({"maximum": 5})
    await jp_fetch("slurm-ray", "api", "clusters", cluster_id, "adapt", method="POST", body=body)
    (asked,) = adapt_requests_in(jobs_root / cluster_id)
    assert (asked["maximum"], asked["idle_timeout"], asked["max_pending"]) == (5, 45.0, 3)


async def test_the_magics_cluster_adapts_with_the_kernels_configured_settings(
    make_cluster, slurm, transport, monkeypatch
):
    monkeypatch.setattr(Adapter, "start", lambda self: None)  # the settings, not the loop
    config = SlurmRay(adapt_idle_timeout=45.0, adapt_max_pending=3)
    made = Session(config).new_cluster(ClusterSpec(time="10"))
    assert made.adapt_defaults() == {"idle_timeout": 45.0, "max_pending": 3}
    cluster = make_cluster()
    cluster.adapt_defaults = made.adapt_defaults
    await up_and_ready(cluster, slurm)
    settings = await cluster.adapt_async(1, 3)
    assert settings is not None and (settings.idle_timeout, settings.max_pending) == (45.0, 3)
    await cluster.stop_adapting_async()


async def test_the_owner_applies_an_adapt_request(make_cluster, slurm, transport):
    cluster = make_cluster()
    await up_and_ready(cluster, slurm)
    record = cluster.registry.load(cluster.id)
    other = SlurmRayCluster.from_record(record, transport, registry=cluster.registry)
    await other.request_adapt_async(1, 3, idle_timeout=20)
    await until(lambda: cluster.adapting is not None, 5, "the owner adapting")
    assert cluster.adapting.settings.maximum == 3
    assert cluster.adapting.settings.idle_timeout == 20
    await other.request_adapt_async(off=True)
    await until(lambda: cluster.adapting is None, 5, "the owner no longer adapting")


async def test_another_process_reads_every_adapt_setting_as_data(make_cluster, slurm, transport):
    """What the owner adapts with reaches other processes whole: its record keeps the settings
    as data, and a request made after the record was written counts with all of its own."""
    cluster = make_cluster()
    await up_and_ready(cluster, slurm)
    await cluster.adapt_async(1, 3, idle_timeout=25, max_pending=2)
    wanted = AdaptSettings(1, 3, 25.0, 2)

    def recorded() -> dict | None:
        return cluster.registry.load(cluster.id).adapting

    await until(lambda: recorded() == wanted.to_dict(), 5, "the settings in the record")
    record = cluster.registry.load(cluster.id)
    job_dir = cluster.job_directory()
    assert await recorded_adapting(record, job_dir) == wanted
    other = SlurmRayCluster.from_record(record, transport, registry=cluster.registry)
    await other.request_adapt_async(1, 4, idle_timeout=40, max_pending=3)
    asked = AdaptSettings(1, 4, 40.0, 3)
    assert await recorded_adapting(record, job_dir) == asked
    # the owner applies the request when it reads it: stopping before would race that
    await until(lambda: recorded() == asked.to_dict(), 5, "the owner applying the request")
    await cluster.stop_adapting_async()
    await until(lambda: recorded() is None, 5, "no settings in the record")


# -- scale and adapt never fight: the REST API (issue 18, item 6) ---------------------------------
async def test_rest_scale_in_of_a_server_owned_cluster_answers_while_the_drain_goes_on(
    jp_fetch, server_manager, slurm, site, monkeypatch
):
    """200 when done (scale-out), 202 at once for a scale-in whose drain goes on, the drain
    in the status; 409 with the bounds while the cluster adapts."""
    response = await jp_fetch(
        "slurm-ray", "api", "clusters", method="POST", body=json.dumps({"profile": "testbed"})
    )
    cluster_id = json.loads(response.body)["id"]
    cluster = server_manager._clusters[cluster_id]
    slurm.run(cluster.job_id)
    write_connection(cluster)
    emit(cluster, {"event": "ready", "joined": 1, "node_count": 1})
    await until(lambda: cluster.state is State.READY, 10, "READY")
    code, answer = await _post(jp_fetch, cluster_id, {"nodes": 2})
    assert (code, answer["applied"], answer["nodes_wanted"]) == (200, True, 2)
    (worker,) = cluster.workers.jobs
    slurm.run(worker, "node2")
    await until(lambda: cluster.workers.jobs[worker].state == "RUNNING", 10, "it runs")

    code, answer = await _post(jp_fetch, cluster_id, {"nodes": 1})
    assert (code, answer["applied"], answer["under_way"]) == (202, True, True)
    assert answer["nodes_wanted"] == 1
    assert f"draining worker job {worker}: it ends once its tasks are done" in answer["scaling"]
    assert (Path(cluster.job_dir) / f"drain-{worker}").exists()
    assert slurm.job(worker).state == "RUNNING"  # answered while it drains
    slurm.end(worker)
    await until(lambda: not cluster.workers.draining(), 10, "the drain seen out")

    async def quiet(self):
        return RayView((), {"10.0.0.1": True}, Shape(1.0))

    monkeypatch.setattr(Adapter, "read_ray", quiet)
    response = await jp_fetch(
        "slurm-ray", "api", "clusters", cluster_id, "adapt", method="POST",
        body=json.dumps({"minimum": 1, "maximum": 3}),
    )  # fmt: skip
    assert response.code == 200 and cluster.adapting is not None
    code, answer = await _post(jp_fetch, cluster_id, {"nodes": 2})
    assert code == 409 and answer == {
        "message": cluster.adapting.settings.refuses_scale(cluster.spec.name),
        "field": None,
    }
    await cluster.stop_adapting_async()


async def test_rest_scale_of_a_cluster_another_process_adapts_is_refused_from_its_record(
    jp_fetch, server_manager, slurm, site, jobs_root
):
    registry = Registry(site["JUPYTER_SLURM_RAY_STATE_DIR"])
    cluster_id = owned_elsewhere(registry, slurm, jobs_root)
    record = registry.load(cluster_id)
    record.scaling = [AdaptSettings(1, 4).describe(), "12:00:00 1 → 2 nodes (submitted 8): …"]
    record.adapting = AdaptSettings(1, 4).to_dict()  # what the owner's record keeps
    registry.save(record)
    code, answer = await _post(jp_fetch, cluster_id, {"nodes": 2})
    assert code == 409 and answer["message"] == AdaptSettings(1, 4).refuses_scale("grow")
    assert requests_in(jobs_root / cluster_id) == []
    response = await jp_fetch(
        "slurm-ray", "api", "clusters", cluster_id, "adapt", method="POST",
        body=json.dumps({"off": True}),
    )  # fmt: skip
    assert response.code == 202  # asked of the owner, which applies it before what follows
    code, answer = await _post(jp_fetch, cluster_id, {"nodes": 2})
    assert (code, answer["applied"]) == (202, False)
    assert [r["nodes"] for r in requests_in(jobs_root / cluster_id)] == [2]
