"""Usage per cluster from sacct: the parsing, the arithmetic (CPU- and GPU-hours allocated, CPU
efficiency, max RSS per node), the one-line summary, what is said without accounting, the
cache, and where it shows: the notebook's line when a cluster ends, the REST API."""

from __future__ import annotations

import json
from typing import get_type_hints

import pytest

from jupyter_slurm_ray.naming import job_comment
from jupyter_slurm_ray.registry import ClusterRecord, Registry
from jupyter_slurm_ray.server.views import UsageView
from jupyter_slurm_ray.slurm.formats import parse_cpu_time
from jupyter_slurm_ray.slurm.output import parse_usage
from jupyter_slurm_ray.slurm.usage import Usage, fetch_usage, usage_of_rows
from jupyter_slurm_ray.spec.units import parse_size
from jupyter_slurm_ray.ui.formatting import format_bytes, usage_summary
from jupyter_slurm_ray.ui.live import Notices

from ..helpers.fakeslurm import FakeJob
from ..helpers.waiting import until

#: sacct -n -P --noconvert -o USAGE_FIELDS of a finished one-node job (as the testbed prints it)
ONE_NODE = [
    "25|COMPLETED|10|billing=1,cpu=1,mem=1G,node=1|1|00:07.832|||node1",
    "25.batch|COMPLETED|10|cpu=1,mem=1G,node=1|1|00:07.830|219426816|node1|node1",
    "25.0|COMPLETED|2|cpu=1,mem=1G,node=1|1|00:00.001|||node1",
]
#: a two-node job with GPUs: the head's batch step and the workers' step
TWO_NODES = [
    "40|COMPLETED|3600|billing=4,cpu=4,gres/gpu=2,mem=2G,node=2|4|01:00:00|||node[1-2]",
    "40.batch|COMPLETED|3600|cpu=2,gres/gpu=1,mem=1G,node=1|2|45:00.000|1288490188|node1|node1",
    "40.0|COMPLETED|3590|cpu=2,gres/gpu=1,mem=1G,node=1|2|15:00.000|536870912|node2|node2",
]


def test_cpu_times_and_sizes_read_as_sacct_prints_them():
    assert parse_cpu_time("00:07.832") == pytest.approx(7.832)
    assert parse_cpu_time("01:02:03") == 3723 and parse_cpu_time("1-00:00:01") == 86401
    assert parse_cpu_time("") is None
    assert parse_size("219426816") == 219426816 and parse_size("214284K") == 214284 * 1024
    assert parse_size("1.5G") == int(1.5 * 1024**3) and parse_size("") is None


def test_allocations_and_steps_parse():
    alloc, batch, step = parse_usage("\n".join(ONE_NODE))
    assert (alloc.allocation, alloc.step, alloc.elapsed, alloc.alloc_tres["cpu"]) == (
        "25",
        None,
        10,
        "1",
    )
    assert (batch.step, batch.max_rss, batch.max_rss_node) == ("batch", 219426816, "node1")
    assert step.step == "0" and step.max_rss is None and step.nodes == ("node1",)


def test_the_arithmetic_of_a_two_node_gpu_job():
    usage = usage_of_rows(["40"], parse_usage("\n".join(TWO_NODES)))
    assert usage.final and usage.elapsed == 3600
    assert (usage.cpu_hours, usage.gpu_hours) == (4.0, 2.0)
    assert usage.cpu_efficiency == pytest.approx(3600 / 14400)
    assert usage.max_rss_by_node == {"node1": 1288490188, "node2": 536870912}
    assert usage.max_rss == ("node1", 1288490188)
    assert usage_summary(usage) == (
        "used 4 CPU-hours, 2 GPU-hours, CPU efficiency 25 %, max RSS 1.2 GiB on node1"
    )


def test_usage_across_several_jobs_adds_them_up():
    usage = usage_of_rows(["25", "40"], parse_usage("\n".join(ONE_NODE + TWO_NODES)))
    assert usage.cpu_seconds == 10 + 4 * 3600 and usage.gpu_seconds == 2 * 3600
    assert usage.cpu_used == pytest.approx(7.830 + 0.001 + 2700 + 900)
    assert usage.elapsed == 3600  # the longest allocation


def test_a_running_job_has_no_efficiency_yet_and_says_so():
    running = [line.replace("COMPLETED", "RUNNING") for line in ONE_NODE[:1]]
    usage = usage_of_rows(["25"], parse_usage("\n".join(running)))
    assert not usage.final and usage.cpu_efficiency is None
    assert usage_summary(usage) == (
        "used 0.0028 CPU-hours, 0 GPU-hours, in 0:00:10 so far (efficiency and memory when it ends)"
    )


def test_without_accounting_the_summary_says_what_is_unavailable():
    usage = Usage(("7",), unavailable="Slurm's accounting did not answer (disabled)")
    assert usage_summary(usage) == (
        "usage unavailable: Slurm's accounting did not answer (disabled)"
    )
    assert usage.to_dict()["available"] is False


def test_bytes_read_for_humans():
    assert format_bytes(512) == "512 B" and format_bytes(1288490188) == "1.2 GiB"
    assert format_bytes(None) == "?"


async def test_a_final_usage_is_asked_once_and_kept(slurm, transport):
    slurm.accounting = True
    slurm.jobs["25"] = FakeJob("25", "", state="COMPLETED", usage=list(ONE_NODE))
    first = await fetch_usage(transport, ["25"])
    again = await fetch_usage(transport, ["25"], max_age=0)
    assert first is again and first.final
    assert [call[0] for call in slurm.calls] == ["sacct"]
    assert "--noconvert" in slurm.calls[0]


async def test_without_accounting_usage_is_unavailable_with_slurms_words(slurm, transport):
    usage = await fetch_usage(transport, ["7"])
    assert not usage.available and "accounting storage is disabled" in (usage.unavailable or "")


async def test_the_notebook_prints_the_usage_once_when_the_cluster_ends(make_cluster, slurm):
    slurm.accounting = True
    cluster = make_cluster(name="summed")
    await cluster.up_async(wait=False)
    job = slurm.only_job()
    job.usage = [line.replace("25", job.job_id) for line in ONE_NODE]
    lines: list[str] = []
    notices = Notices(cluster, lines.append)
    slurm.end(job.job_id)
    await until(lambda: lines, 10, "the usage line")
    assert notices.summary is not None
    notices.summary.result(5)
    assert lines == [
        "summed (STOPPED): used 0.0028 CPU-hours, 0 GPU-hours, CPU efficiency 78 %, "
        "max RSS 209.3 MiB on node1"
    ]
    notices.check(cluster.status)
    assert len(lines) == 1


async def test_the_end_of_run_line_counts_the_worker_jobs_as_cluster_usage_does(
    make_cluster, slurm, monkeypatch
):
    slurm.accounting = True
    cluster = make_cluster(name="elastic")
    await cluster.up_async(wait=False)
    head = slurm.only_job()
    head.usage = [line.replace("25", head.job_id) for line in ONE_NODE]
    worker = FakeJob("40", "/nowhere/worker.sbatch", state="COMPLETED", usage=TWO_NODES)
    slurm.jobs["40"] = worker  # a worker job the cluster scaled out to
    monkeypatch.setattr(cluster, "slurm_job_ids", lambda: [head.job_id, "40"])
    lines: list[str] = []
    notices = Notices(cluster, lines.append)
    slurm.end(head.job_id)
    await until(lambda: lines, 10, "the usage line")
    notices.summary.result(5)
    everything = await cluster.usage_async()
    assert everything.cpu_seconds == 10 + 4 * 3600  # the head's and the worker job's
    assert lines == [f"elastic (STOPPED): {usage_summary(everything)}"]
    assert "4 CPU-hours, 2 GPU-hours" in lines[0]


# -- REST -----------------------------------------------------------------------------------------
def _record(registry: Registry, job_id: str, name: str, state: str = "READY") -> str:
    cluster_id = f"{name}-0000"
    registry.save(
        ClusterRecord(
            id=cluster_id, name=name, target="fake", job_dir=f"/nowhere/{name}", job_id=job_id,
            state=state,
        )
    )  # fmt: skip
    return cluster_id


async def test_rest_get_has_the_usage_and_the_list_a_compact_form_on_request(
    jp_fetch, server_manager, slurm, site
):
    slurm.accounting = True
    registry = Registry(site["JUPYTER_SLURM_RAY_STATE_DIR"])
    cluster_id = _record(registry, "40", "gpus", state="STOPPED")
    slurm.jobs["40"] = FakeJob(
        "40", "", comment=job_comment(cluster_id), state="COMPLETED", usage=list(TWO_NODES)
    )
    response = await jp_fetch("slurm-ray", "api", "clusters", cluster_id)
    usage = json.loads(response.body)["usage"]
    assert usage["cpu_hours"] == 4.0 and usage["gpu_hours"] == 2.0
    assert usage["cpu_efficiency"] == 0.25 and usage["max_rss_node"] == "node1"
    assert usage["max_rss_by_node"] == {"node1": 1288490188, "node2": 536870912}
    assert sorted(usage) == sorted(get_type_hints(UsageView))  # figures: the words are the UI's
    plain = json.loads((await jp_fetch("slurm-ray", "api", "clusters")).body)
    assert "usage" not in plain["clusters"][0]
    listed = await jp_fetch("slurm-ray", "api", "clusters", params={"usage": "true"})
    compact = json.loads(listed.body)["clusters"][0]["usage"]
    assert compact == {
        "available": True,
        "final": True,
        "cpu_hours": 4.0,
        "gpu_hours": 2.0,
        "cpu_efficiency": 0.25,
        "max_rss": 1288490188,
    }
    sacct_usage = [call for call in slurm.calls if "--noconvert" in call]
    assert len(sacct_usage) == 1  # final: asked once, kept


async def test_rest_usage_without_accounting_says_why(jp_fetch, server_manager, slurm, site):
    registry = Registry(site["JUPYTER_SLURM_RAY_STATE_DIR"])
    cluster_id = _record(registry, "41", "noacct")
    slurm.jobs["41"] = FakeJob("41", "", comment=job_comment(cluster_id), state="RUNNING")
    response = await jp_fetch("slurm-ray", "api", "clusters", cluster_id)
    usage = json.loads(response.body)["usage"]
    assert usage["available"] is False and "accounting" in usage["unavailable"]
    assert "summary" not in usage  # the labextension says it from ``unavailable``
