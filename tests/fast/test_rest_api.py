"""The clusters REST API (``slurm-ray/api/clusters``): the server extension loaded in-process,
called with ``jp_fetch``, on a scripted Slurm. Every answer is JSON; refused input names its field.

The server's transport is the fake's (the ``site`` fixture replaces ``make_transport``): the
tests move jobs in the fake Slurm's table and write records and job dirs as a kernel would.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from jupyter_slurm_ray.naming import job_comment
from jupyter_slurm_ray.registry import ClusterRecord, Registry
from jupyter_slurm_ray.server.views import ClusterView, UnreadableView

from ..helpers.fakeslurm import FakeJob, FakeSlurm
from ..helpers.waiting import until
from .test_cluster_logic import ready

API = ("slurm-ray", "api", "clusters")


@pytest.fixture
def api(jp_fetch, server_manager):
    """``await api(METHOD, *path, body=…, params=…, headers=…)``: (HTTP status, JSON body)."""

    async def call(method: str, *path: str, body=None, **kwargs) -> tuple[int, object]:
        if body is not None:
            kwargs["body"] = body if isinstance(body, str | bytes) else json.dumps(body)
        elif method == "POST":
            kwargs["body"] = b""
        response = await jp_fetch(*API, *path, method=method, raise_error=False, **kwargs)
        return response.code, json.loads(response.body) if response.body else None

    return call


@pytest.fixture
def registry(site) -> Registry:
    """The registry the server reads (the site's state dir)."""
    return Registry(site["JUPYTER_SLURM_RAY_STATE_DIR"])


def record(job_id: str | None, name: str, state: str = "READY", **fields) -> ClusterRecord:
    fields.setdefault("target", "fake")
    fields.setdefault("job_dir", f"/nowhere/{name}-0000")
    return ClusterRecord(id=f"{name}-0000", name=name, job_id=job_id, state=state, **fields)


def running(slurm: FakeSlurm, job_id: str, cluster_id: str, **fields) -> FakeJob:
    """A job of the fake Slurm, tagged for ``cluster_id`` as the package's job script tags it."""
    fields.setdefault("state", "RUNNING")
    fields.setdefault("nodes", "node1")
    job = FakeJob(job_id, "", comment=job_comment(cluster_id), **fields)
    slurm.jobs[job_id] = job
    return job


def plant(registry: Registry, cluster_id: str, text: str) -> Path:
    """A record file with ``text`` as content, as a broken or hostile writer left it."""
    registry.save(record(None, "anchor", state="STOPPED"))  # makes the directories
    path = registry.path / "clusters" / f"{cluster_id}.json"
    path.write_text(text)
    path.chmod(0o600)
    return path


async def test_the_api_needs_jupyter_auth(api, registry, slurm):
    registry.save(record("7", "live"))
    anonymous = {"Authorization": ""}
    assert (await api("GET", headers=anonymous))[0] == 403
    assert (await api("GET", "live-0000", headers=anonymous))[0] == 403
    assert (await api("DELETE", "live-0000", headers=anonymous))[0] == 403
    assert (await api("POST", body={"profile": "testbed"}, headers=anonymous))[0] == 403
    assert slurm.calls == [] and registry.load("live-0000") is not None


async def test_the_listing_reconciles_every_record_with_slurm(api, registry, slurm, jp_base_url):
    running(slurm, "7", "live-0000", time_left="8:00")
    registry.save(record("7", "live", nodes_wanted=1, nodes_joined=1))
    slurm.jobs["8"] = FakeJob("8", "", comment=job_comment("stale-0000"), state="COMPLETED")
    registry.save(record("8", "stale"))  # its kernel died: the record still says READY
    registry.save(record("9", "elsewhere", target="ssh://bob@login2"))
    code, listing = await api("GET")
    assert code == 200
    views = {view["id"]: view for view in listing["clusters"]}
    live = views["live-0000"]
    assert (live["state"], live["slurm_state"], live["time_left"]) == ("READY", "RUNNING", 480)
    assert live["nodes"] == ["node1"] and live["nodes_joined"] == live["nodes_wanted"] == 1
    assert live["dashboard_url"] == f"{jp_base_url}slurm-ray/dashboard/live-0000/"
    assert live["attach_command"] == "%slurm_ray attach live"
    assert (views["stale-0000"]["state"], views["stale-0000"]["slurm_state"]) == (
        "STOPPED",
        "COMPLETED",
    )
    elsewhere = views["elsewhere-0000"]  # another target: shown as recorded, not asked about
    assert elsewhere["state"] == "READY" and elsewhere["reachable"] is False
    asked = [call[0] for call in slurm.calls]
    assert asked.count("squeue") == 1  # one for all of them; the ended one's exit code after
    assert (
        asked[1:] == ["sacct", "sacct", "scontrol"]
        and ("scontrol", "show", "job", "-o", "8") in slurm.calls
    )


async def test_a_silent_slurm_keeps_the_last_state_and_says_since_when(api, registry, slurm):
    running(slurm, "7", "live-0000")
    registry.save(record("7", "live"))
    slurm.down = True
    code, listing = await api("GET")
    assert code == 200
    (view,) = listing["clusters"]
    assert view["state"] == "READY" and view["slurm_unreachable_since"] is not None
    assert "Unable to contact" in view["notice"]


async def test_unreadable_records_are_listed_last_and_can_be_forgotten(api, registry):
    registry.save(record(None, "good", state="STOPPED"))
    broken = plant(registry, "trunc-0001", '{"id": "trunc-0001", "name": "tr')
    wrong_type = {**json.loads(record("1", "x").to_json()), "id": "types-0001", "nodes_wanted": "a"}
    plant(registry, "types-0001", json.dumps(wrong_type))
    code, listing = await api("GET")
    assert code == 200
    ids = [view["id"] for view in listing["clusters"]]
    assert set(ids[-2:]) == {"trunc-0001", "types-0001"}  # after the readable ones
    views = {view["id"]: view for view in listing["clusters"]}
    trunc = views["trunc-0001"]
    assert trunc["unreadable"] and trunc["state"] == "UNREADABLE" and trunc["forgettable"]
    assert "not valid JSON" in trunc["error"]
    assert "nodes_wanted" in views["types-0001"]["error"]
    code, view = await api("GET", "trunc-0001")
    assert code == 200 and view["unreadable"]
    code, answer = await api("DELETE", "trunc-0001", params={"forget": "true"})
    assert (code, answer) == (200, {"id": "trunc-0001", "forgotten": True})
    assert not broken.exists()


async def test_every_listed_row_has_the_keys_its_typed_view_declares(api, registry, slurm):
    running(slurm, "7", "live-0000")
    registry.save(record("7", "live"))
    plant(registry, "trunc-0001", '{"id": "trunc-0001", "name": "tr')
    code, listing = await api("GET", params={"usage": "true"})
    assert code == 200
    rows = {row["id"]: set(row) for row in listing["clusters"]}
    for row_id, view in (("live-0000", ClusterView), ("trunc-0001", UnreadableView)):
        assert view.__required_keys__ <= rows[row_id]  # the sidebar may rely on every one
        assert sorted(rows[row_id] - view.__required_keys__) == ["dashboard_url", "usage"]


async def test_a_group_writable_registry_is_refused_and_the_api_says_so(api, registry):
    registry.save(record(None, "good", state="STOPPED"))
    (registry.path / "clusters").chmod(0o770)
    code, listing = await api("GET")
    assert code == 200
    (only,) = listing["clusters"]
    assert only["unreadable"] and "writable by other users" in only["error"]
    assert only["forgettable"] is False


async def test_get_one_has_recent_events_and_a_log_tail(api, registry, slurm, tmp_path):
    job_dir = tmp_path / "live-0000"
    job_dir.mkdir(mode=0o700)
    events = [{"event": "phase", "phase": p, "t": 1.0} for p in ("submit", "bootstrap", "ports")]
    (job_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (job_dir / "slurm-7.out").write_text("starting\nready\n")
    running(slurm, "7", "live-0000")
    registry.save(record("7", "live", job_dir=str(job_dir)))
    code, view = await api("GET", "live-0000", params={"events": "2", "tail": "1"})
    assert code == 200 and view["id"] == "live-0000" and view["state"] == "READY"
    assert [e["phase"] for e in view["events"]] == ["bootstrap", "ports"]
    assert view["log_tail"] == "==> slurm-7.out <==\nready"


async def test_an_unknown_cluster_is_a_json_404(
    api, http_server_client, jp_auth_header, jp_base_url
):
    code, answer = await api("GET", "nosuch-0000")
    assert code == 404 and "nosuch-0000" in answer["message"]
    assert (await api("DELETE", "nosuch-0000"))[0] == 404
    escaped = f"{jp_base_url}slurm-ray/api/clusters/..%2f..%2fetc"  # not decoded into a path
    response = await http_server_client.fetch(escaped, headers=jp_auth_header, raise_error=False)
    assert response.code == 404


@pytest.mark.parametrize(
    ("method", "params", "field"),
    [
        ("GET", {"tail": "lots"}, "tail"),
        ("GET", {"events": "0"}, "events"),
        ("GET", {"tail": "5001"}, "tail"),
        ("DELETE", {"forget": "maybe"}, "forget"),
    ],
)
async def test_bad_query_arguments_name_the_field(api, registry, method, params, field):
    registry.save(record(None, "old", state="STOPPED"))
    code, answer = await api(method, "old-0000", params=params)
    assert code == 400 and answer["field"] == field and field in answer["message"]
    assert registry.load("old-0000") is not None


async def test_delete_stops_the_cluster(api, registry, slurm, tmp_path):
    job_dir = tmp_path / "live-0000"
    job_dir.mkdir(mode=0o700)
    running(slurm, "7", "live-0000")
    registry.save(record("7", "live", job_dir=str(job_dir)))
    code, view = await api("DELETE", "live-0000")
    assert code == 200, view
    assert view["state"] in ("STOPPED", "CANCELLED") and view["final"]
    assert slurm.jobs["7"].state == "CANCELLED"
    assert ("scancel", "7") in slurm.calls
    code, again = await api("DELETE", "live-0000")  # nothing left to stop
    assert code == 200 and again["state"] == view["state"]


async def test_forget_refuses_an_active_cluster_and_removes_an_ended_one(api, registry, slurm):
    running(slurm, "7", "live-0000")
    registry.save(record("7", "live"))
    registry.save(record("8", "old", state="CANCELLED"))
    code, answer = await api("DELETE", "live-0000", params={"forget": "true"})
    assert code == 409 and "stop it before" in answer["message"]
    code, answer = await api("DELETE", "old-0000", params={"forget": "true"})
    assert (code, answer) == (200, {"id": "old-0000", "forgotten": True})
    assert [r.id for r in registry.all()] == ["live-0000"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"profile": "testbed", "nodes": 0}, "nodes"),
        ({"profile": "testbed", "time": "25:99"}, "time"),
        ({"profile": "nosuch"}, "profile"),
        ({"profile": "testbed", "nodez": 2}, "nodez"),
        ({"profile": 3}, "profile"),
        ({"nodes": 1}, "time"),
        ([1, 2], "body"),
        ("{nope", "body"),
    ],
)
async def test_post_refuses_bad_input_naming_the_field(api, registry, slurm, body, field):
    code, answer = await api("POST", body=body)
    assert code == 400, answer
    assert answer["field"] == field and field in answer["message"]
    assert slurm.calls == [] and registry.all() == []  # nothing submitted, nothing recorded


async def test_post_that_slurm_refuses_is_a_400_with_slurms_words(api, registry, slurm):
    slurm.refuse_submit = "invalid partition specified: nosuch"
    code, answer = await api("POST", body={"profile": "testbed", "partition": "nosuch"})
    assert code == 400 and "invalid partition specified: nosuch" in answer["message"]
    assert slurm.jobs == {} and registry.all() == []


async def test_post_creates_a_server_owned_cluster_from_a_profile(api, registry, slurm, jobs_root):
    code, created = await api("POST", body={"profile": "testbed", "name": "posted"})
    assert code == 201, created
    assert created["name"] == "posted" and created["server_owned"] is True
    assert created["owner_pid"] == os.getpid() and created["state"] == "PENDING"
    job = slurm.only_job()
    assert created["job_id"] == job.job_id and job.comment == job_comment(created["id"])
    assert job.name == "posted" and Path(job.script_path).parent.parent == jobs_root
    assert registry.load(created["id"]).state == "PENDING"
    code, stopped = await api("DELETE", created["id"])
    assert code == 200 and stopped["state"] in ("STOPPED", "CANCELLED")
    assert job.state == "CANCELLED"


async def test_post_takes_the_leases_former_name_with_a_warning_but_not_both_names(
    api, registry, slurm
):
    with pytest.warns(DeprecationWarning, match="idle_timeout is now named owner_timeout"):
        code, created = await api(
            "POST", body={"profile": "testbed", "name": "formerly", "idle_timeout": 60}
        )
    assert code == 201, created
    assert registry.load(created["id"]).spec["owner_timeout"] == 60
    assert (await api("DELETE", created["id"]))[0] == 200
    both = {"profile": "testbed", "idle_timeout": 60, "owner_timeout": 70}
    code, answer = await api("POST", body=both)
    assert (
        code == 400 and answer["field"] == "idle_timeout" and "owner_timeout" in answer["message"]
    )
    assert len(slurm.jobs) == 1  # the first one only


async def test_takeover_makes_the_server_the_owner_and_the_kernel_is_told(
    api, registry, slurm, make_cluster, stand_ins
):
    kernel = stand_ins()  # the kernel that owns the cluster (a real process)
    owned = await ready(make_cluster, slurm, owner_timeout=5, process=kernel.identity)
    code, listing = await api("GET")
    (view,) = listing["clusters"]
    assert code == 200 and view["can_take_over"] and not view["server_owned"]
    assert view["owner_pid"] == kernel.identity.pid and view["owner_term"] == 0
    code, view = await api("POST", owned.id, "takeover")
    assert code == 200, view
    assert view["server_owned"] and not view["can_take_over"]
    assert (view["owner_pid"], view["owner_term"]) == (os.getpid(), 1)
    await until(lambda: not owned.owned_here, 10, "the kernel standing down")
    assert (
        owned.status.ownership == f"taken over; owned by pid {os.getpid()} on {view['owner_host']}"
    )
    code, listing = await api("GET")
    assert [o["pid"] for o in listing["clusters"][0]["observers"]] == [kernel.identity.pid]
    code, again = await api("POST", owned.id, "takeover")  # it owns it already
    assert code == 200 and again["owner_term"] == 1
    code, stopped = await api("DELETE", owned.id)
    assert code == 200 and stopped["final"]
    code, refused = await api("POST", owned.id, "takeover")
    assert code == 409 and "only an active cluster can be taken over" in refused["message"]
    assert (await api("POST", "nosuch-0000", "takeover"))[0] == 404
