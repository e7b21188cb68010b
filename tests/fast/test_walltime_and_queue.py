"""The walltime people notice and the queue explained: when the warning is due (once per
cluster in the notebook), extending a job's time limit (amount checked, Slurm's refusal and what
to do, the new time left) from the magic, the CLI and the REST API, and a pending cluster's
reason in plain words with its estimated start and what it waits for."""

from __future__ import annotations

import json
import time
from datetime import datetime

import pytest

from jupyter_slurm_ray.cluster import SlurmRayCluster
from jupyter_slurm_ray.errors import SpecError
from jupyter_slurm_ray.naming import job_comment
from jupyter_slurm_ray.registry import ClusterRecord, Registry
from jupyter_slurm_ray.slurm.queueinfo import explain_reason, queue_insight, reasons
from jupyter_slurm_ray.slurm.walltime import parse_extension, warning_due
from jupyter_slurm_ray.spec import ClusterSpec
from jupyter_slurm_ray.states import State, Status
from jupyter_slurm_ray.ui.cli import main
from jupyter_slurm_ray.ui.formatting import status_line
from jupyter_slurm_ray.ui.live import Notices
from jupyter_slurm_ray.ui.reprs import cluster_line

from ..helpers.fakeslurm import FakeJob
from ..helpers.ipyshell import *  # noqa: F403  (the fixtures ipython_shell and magic)
from ..helpers.ipyshell import one_line_error


# -- the amount to add ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("amount", "minutes"),
    [("+30", 30), ("30", 30), (45, 45), ("+1:00:00", 60), ("+1-00:00:00", 1440), ("+2:30", 3)],
)
def test_an_amount_is_minutes_or_a_slurm_duration(amount, minutes):
    assert parse_extension(amount) == minutes


@pytest.mark.parametrize("amount", ["-10", "+0", "soon", "", "+", "1:99:00", None, True, 1.5])
def test_a_bad_amount_is_refused_naming_the_field(amount):
    with pytest.raises(SpecError) as refused:
        parse_extension(amount)
    assert refused.value.field == "amount"
    assert "minutes to add, like +30, or a Slurm duration like +1:00:00" in str(refused.value)


# -- the warning ----------------------------------------------------------------------------------
def up(time_left: int | None, warned: bool = False, state: State = State.CONNECTED) -> Status:
    return Status(state, at=time.time(), job_id="7", time_left=time_left, walltime_warning=warned)


def test_the_warning_is_due_from_the_jobs_event_or_the_time_left():
    def due(status: Status) -> bool:
        return warning_due(status, 120, now=status.at)

    assert due(up(100))  # within the warning
    assert not due(up(600))
    assert due(up(170, warned=True))  # Slurm signalled a bit early
    assert not due(up(2000, warned=True))  # extended since
    assert due(up(None, warned=True))
    assert not due(up(10, state=State.TIMEOUT))


def test_the_status_line_says_almost_over_until_the_walltime_is_extended():
    cluster = SlurmRayCluster(ClusterSpec(name="w", time="10", walltime_warning=60))
    cluster._status = up(50, warned=True)
    assert cluster_line(cluster).endswith(" left · walltime almost over")
    cluster._status = up(1850, warned=True)  # +30 min since the job's warning
    line = cluster_line(cluster)
    assert " 0:30:" in line and "almost over" not in line


async def test_the_notebook_prints_the_warning_once(make_cluster, slurm):
    cluster = make_cluster(name="short", walltime_warning=60)
    await cluster.up_async(wait=False)
    slurm.run(slurm.only_job().job_id)
    slurm.only_job().time_left = "0:50"
    lines: list[str] = []
    notices = Notices(cluster, lines.append)
    await cluster.refresh_async()
    notices.check(cluster.status)
    notices.check(cluster.status)
    assert len(lines) == 1
    assert lines[0].startswith(f"⚠ short (job {cluster.job_id}): walltime almost over, 0:00:")
    assert "`%slurm_ray extend short +30`" in lines[0]


# -- extending ------------------------------------------------------------------------------------
def record(registry: Registry, slurm, name: str, state: str = "READY", **job) -> str:
    """A cluster's record, and its job 7 in the fake Slurm (running unless PENDING)."""
    cluster_id = f"{name}-0000"
    job.setdefault("state", "PENDING" if state == "PENDING" else "RUNNING")
    job.setdefault("nodes", "" if state == "PENDING" else "node1")
    slurm.jobs["7"] = FakeJob("7", "", comment=job_comment(cluster_id), **job)
    spec = ClusterSpec(name=name, time="10", partition="short").to_dict()
    registry.save(
        ClusterRecord(
            id=cluster_id, name=name, target="fake", job_dir=f"/nowhere/{name}", job_id="7",
            state=state, spec=spec,
        )
    )  # fmt: skip
    return cluster_id


def test_the_magic_extend_refused_shows_slurms_words_and_what_to_do(magic, slurm, site):
    record(Registry(), slurm, "walled")
    _, err, error = magic.run("%slurm_ray extend walled +30")
    line = one_line_error(err)
    assert "Slurm refused to extend job 7 by 30 min: Access/permission denied for job 7." in line
    assert "ask an operator or your site's support" in line and error is not None
    assert ("scontrol", "update", "JobId=7", "TimeLimit=+30") in slurm.calls


def test_the_magic_extend_allowed_shows_the_new_time_left(magic, slurm, site):
    slurm.may_extend = True
    record(Registry(), slurm, "walled", time_left="9:00", time_limit="10:00")
    out, _, error = magic.run("%slurm_ray extend walled +1:00:00")
    assert error is None
    assert out.strip() == "walled: walltime extended by 60 min: 1:09:00 left (time limit 1:10:00)"


@pytest.mark.parametrize("amount", ["soon", "-10"])
def test_the_magic_extend_checks_the_amount_first(magic, slurm, amount):
    _, err, error = magic.run(f"%slurm_ray extend {amount}")
    assert one_line_error(err).startswith(f"UsageError: amount: '{amount}' is not allowed;")
    assert error is not None and slurm.calls == []


@pytest.mark.usefixtures("root_logging_kept")
def test_the_cli_extend_checks_its_arguments(site, slurm, capsys):
    assert main(["extend", "ray", "soon"]) == 1
    assert capsys.readouterr().err.startswith("jupyter slurm-ray: error: amount: 'soon'")
    assert main(["extend", "+30"]) == 1
    assert "give a cluster NAME and the walltime to add" in capsys.readouterr().err
    assert slurm.calls == []


@pytest.mark.usefixtures("root_logging_kept")
def test_the_cli_extend_prints_the_new_time_left(site, slurm, capsys):
    slurm.may_extend = True
    record(Registry(), slurm, "walled", time_left="9:00", time_limit="10:00")
    assert main(["extend", "walled", "+30"]) == 0
    assert capsys.readouterr().out.strip() == (
        "walled: walltime extended by 30 min: 0:39:00 left (time limit 0:40:00)"
    )


async def _post(jp_fetch, cluster_id: str, body) -> tuple[int, dict]:
    response = await jp_fetch(
        "slurm-ray", "api", "clusters", cluster_id, "extend", method="POST",
        body=json.dumps(body), raise_error=False,
    )  # fmt: skip
    return response.code, json.loads(response.body)


async def test_rest_extend_refused_is_a_403_with_slurms_words(
    jp_fetch, server_manager, slurm, site
):
    cluster_id = record(Registry(site["JUPYTER_SLURM_RAY_STATE_DIR"]), slurm, "walled")
    code, answer = await _post(jp_fetch, cluster_id, {"amount": "+30"})
    assert code == 403 and "Access/permission denied for job 7" in answer["message"]
    code, answer = await _post(jp_fetch, cluster_id, {"amount": "later"})
    assert (code, answer["field"]) == (400, "amount")
    code, answer = await _post(jp_fetch, cluster_id, {})
    assert (code, answer["field"]) == (400, "amount")


async def test_rest_extend_allowed_returns_the_new_time_left(jp_fetch, server_manager, slurm, site):
    slurm.may_extend = True
    registry = Registry(site["JUPYTER_SLURM_RAY_STATE_DIR"])
    cluster_id = record(registry, slurm, "walled", time_left="1:00", time_limit="10:00")
    before = json.loads((await jp_fetch("slurm-ray", "api", "clusters", cluster_id)).body)
    assert before["walltime_warning"] is True and before["walltime_warning_seconds"] == 120
    assert before["extendable"] is True and before["partition"] == "short"
    code, answer = await _post(jp_fetch, cluster_id, {"amount": 30})
    assert code == 200 and answer["extended_by_minutes"] == 30
    assert answer["time_left"] == 31 * 60 and answer["time_limit"] == 40 * 60
    assert answer["walltime_warning"] is False


async def test_rest_extend_of_an_ended_cluster_is_a_conflict(jp_fetch, server_manager, slurm, site):
    cluster_id = record(Registry(site["JUPYTER_SLURM_RAY_STATE_DIR"]), slurm, "walled")
    slurm.end("7")
    code, answer = await _post(jp_fetch, cluster_id, {"amount": "+30"})
    assert code == 409 and "only an active cluster can be extended" in answer["message"]


# -- the queue ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("reason", "meaning", "never"),
    [
        ("Priority", "jobs of higher priority are ahead of it", False),
        ("Resources", "the nodes it needs are busy", False),
        ("QOSMaxNodePerJobLimit", "more nodes than its QOS allows per job", True),
        ("PartitionNodeLimit", "more nodes than the partition allows (MaxNodes)", True),
        ("AssocGrpCpuLimit", "group CPU limit (GrpTRES=cpu)", False),
        ("ReqNodeNotAvail, UnavailableNodes:node[2-3]", "unavailable (down, drained", False),
        ("BeginTime", "not to start before a given time", False),
        ("JobHeldUser", "held it", True),
        ("Dependency", "waits for another job", False),
        ("AssocGrpGRES", "a group limit of your account (association) (AssocGrpGRES)", False),
        ("QOSMaxMemoryPerJob", "more than your QOS allows per job (QOSMaxMemoryPerJob)", True),
        ("QOSMaxCpuPerUserLimit", "as much as your QOS allows (QOSMaxCpuPerUserLimit)", False),
    ],
)
def test_slurms_reasons_in_plain_words(reason, meaning, never):
    explained, action, never_starts = explain_reason(reason)
    assert meaning in explained and action and never_starts is never


def test_unavailable_nodes_are_named_and_an_unknown_reason_is_passed_on():
    assert explain_reason("ReqNodeNotAvail, UnavailableNodes:node[2-3]")[0].endswith("node[2-3]")
    assert explain_reason("SomethingNew") == ("Slurm's reason: SomethingNew", None, False)
    assert all(action for _, action, _ in reasons().values())


def test_a_pending_status_line_explains_the_reason_and_what_it_waits_for():
    pending = Status(
        State.PENDING, at=100.0, reason="Resources", job_id="7", nodes_wanted=2,
        estimated_start=datetime(2030, 1, 2, 3, 4),
    )  # fmt: skip
    queue = queue_insight(pending, partition="gpu")
    assert queue is not None and queue.hint == "waiting for 2 nodes in partition gpu"
    assert status_line(pending, now=100.0, queue=queue) == (
        "PENDING · (Resources: the nodes it needs are busy) · job 7 · "
        "waiting for 2 nodes in partition gpu · est. start 2030-01-02 03:04"
    )
    assert queue_insight(Status(State.CONNECTED, reason="x")) is None


async def test_rest_shows_a_pending_clusters_queue_insight(jp_fetch, server_manager, slurm, site):
    cluster_id = record(
        Registry(site["JUPYTER_SLURM_RAY_STATE_DIR"]), slurm, "queued", state="PENDING",
        reason="QOSMaxNodePerJobLimit", start="2030-01-02T03:04:05",
    )  # fmt: skip
    listing = json.loads((await jp_fetch("slurm-ray", "api", "clusters")).body)
    (view,) = [c for c in listing["clusters"] if c["id"] == cluster_id]
    assert view["state"] == "PENDING" and view["reason"] == "QOSMaxNodePerJobLimit"
    assert view["queue"] == {
        "reason": "QOSMaxNodePerJobLimit",
        "meaning": "it asks for more nodes than its QOS allows per job",
        "action": "ask for fewer nodes (-N) or use another QOS (-q)",
        "never_starts": True,
        "hint": None,
        "estimated_start": "2030-01-02T03:04:05",
    }
    assert view["estimated_start"] == "2030-01-02T03:04:05"
