"""Worker groups (issue 9): the setting's shape, each group's spec, the magics' option, bad
input named by its field."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from jupyter_slurm_ray.bootstrap.jsr_wire import group_resource
from jupyter_slurm_ray.elastic.adapt import recent_decisions
from jupyter_slurm_ray.elastic.rotation import due_for_rotation, replaced_and_joined
from jupyter_slurm_ray.elastic.workerjob import WorkerJob
from jupyter_slurm_ray.elastic.workerjobs import WorkerJobs
from jupyter_slurm_ray.errors import SlurmError, SpecError
from jupyter_slurm_ray.job.script import render_job_script
from jupyter_slurm_ray.slurm.client import SlurmClient
from jupyter_slurm_ray.spec import ClusterSpec, resolve
from jupyter_slurm_ray.spec.groups import group_names, group_spec, parse_group_option
from jupyter_slurm_ray.states import State, Status, WorkerJobStatus, status_of_record
from jupyter_slurm_ray.transport import LocalTransport
from jupyter_slurm_ray.ui.formatting import scaling_text
from jupyter_slurm_ray.ui.magic_args import parse, spec_arguments

from ..helpers.waiting import until
from .conftest import emit, write_connection

GPU = {"partition": "short", "gpus_per_node": 1, "time": "20", "setup": ["echo gpu"]}


def cluster(**groups) -> ClusterSpec:
    return ClusterSpec(
        time="1:00:00", partition="debug", setup=("echo head",), worker_groups=groups
    )


def test_a_group_changes_the_worker_jobs_shape_and_keeps_the_rest() -> None:
    spec = cluster(gpu=GPU)
    assert group_names(spec) == ["default", "gpu"]
    gpu = group_spec(spec, "gpu")
    assert (gpu.partition, gpu.gpus_per_node, gpu.time, gpu.nodes) == ("short", 1, "00:20:00", 1)
    assert gpu.setup == ("echo head", "echo gpu")  # the cluster's setup, then the group's
    assert dict(gpu.env)["JSR_WORKER_GROUP"] == "gpu"  # the bootstrap's Ray resource
    assert gpu.worker_groups == () and gpu.job_dir_root == spec.job_dir_root
    default = group_spec(spec, "default")
    assert (default.partition, default.gpus_per_node, default.nodes) == ("debug", 0, 1)
    assert group_resource("gpu") == "group:gpu"


def test_the_worker_job_script_of_a_group_asks_for_its_partition_and_gpus() -> None:
    gpu = group_spec(cluster(gpu=GPU), "gpu")
    script = render_job_script(
        gpu,
        cluster_id="ray-0123abcd",
        job_dir="/home/a/jobs/ray-0123abcd",
        command=["python"],
        worker=True,
    )
    assert "#SBATCH --partition=short" in script and "#SBATCH --gpus-per-node=1" in script
    assert "JSR_WORKER_GROUP=gpu" in script


def test_groups_are_kept_normalised_and_read_back_equal() -> None:
    spec = cluster(gpu=GPU)
    again = ClusterSpec.from_mapping(spec.to_dict())
    assert again == spec and group_spec(again, "gpu") == group_spec(spec, "gpu")


@pytest.mark.parametrize(
    ("groups", "field", "says"),
    [
        ({"GPU": {}}, "worker_groups name", "lowercase letter"),
        ({"gpu": {"partiton": "x"}}, "worker_groups.gpu", "did you mean partition?"),
        ({"gpu": {"python": "/x"}}, "worker_groups.gpu", "a setting a worker group may change"),
        ({"gpu": {"gpus_per_node": -1}}, "worker_groups.gpu.gpus_per_node", "-1"),
        ({"gpu": {"time": "forever"}}, "worker_groups.gpu.time", "walltime"),
        ({"gpu": "partition=gpu"}, "worker_groups.gpu", "a table of worker settings"),
    ],
)
def test_a_bad_group_is_one_error_naming_where(groups, field, says) -> None:
    with pytest.raises(SpecError) as error:
        cluster(**groups)
    assert error.value.field == field and says in str(error.value)
    assert "\n" not in str(error.value)


def test_an_unknown_group_names_the_groups_there_are() -> None:
    with pytest.raises(SpecError) as error:
        group_spec(cluster(gpu=GPU), "bigmem")
    assert error.value.field == "group" and "default, gpu" in str(error.value)


def test_the_magics_option_is_group_colon_settings() -> None:
    assert parse_group_option("gpu:partition=short,gpus_per_node=1") == (
        "gpu",
        {"partition": "short", "gpus_per_node": "1"},
    )
    assert parse_group_option("cpu") == ("cpu", {})
    for bad in ("gpu:partition", "Gpu:partition=x", ":x=1"):
        with pytest.raises(SpecError) as error:
            parse_group_option(bad)
        assert error.value.field == "--worker-group"


def test_the_status_line_counts_worker_jobs_by_group_when_there_are_groups() -> None:
    jobs = (
        WorkerJobStatus("11", "RUNNING", host="node2", joined=True),
        WorkerJobStatus("12", "PENDING", "Resources", group="gpu"),
        WorkerJobStatus("13", "RUNNING", host="node3", joined=True, group="gpu"),
    )
    status = Status(State.READY, nodes_joined=3, nodes_wanted=4, worker_jobs=jobs)
    assert scaling_text(status) == (
        "3/4 nodes alive, worker jobs: default: 1 running; gpu: 1 running, 1 pending (Resources)"
    )
    only_default = Status(State.READY, nodes_joined=2, nodes_wanted=2, worker_jobs=jobs[:1])
    assert scaling_text(only_default) == "2/2 nodes alive, worker jobs: 1 running"


def test_the_magics_take_groups_on_up_and_a_group_on_scale() -> None:
    up = parse(
        "up -t 1:00:00 --worker-group gpu:partition=short,gpus_per_node=1 --worker-group cpu"
    )
    arguments = spec_arguments(up)
    assert arguments["worker_groups"] == {
        "gpu": {"partition": "short", "gpus_per_node": "1"},
        "cpu": {},
    }
    configured = {"gpu": {"partition": "gpu"}, "bigmem": {"mem_per_node": "500G"}}
    spec, _ = resolve([("config", {"worker_groups": configured}), ("argument", arguments)])
    assert group_names(spec) == ["default", "bigmem", "cpu", "gpu"]  # added, gpu replaced
    assert group_spec(spec, "gpu").partition == "short"
    scale = parse("scale 2 ray --group gpu")
    assert (scale.nodes, scale.name, scale.group) == ("2", "ray", "gpu")


# -- walltime rotation (elastic/rotation.py) ----------------------------------------------
def joined_job(job_id: str, ends_at: float | None, **fields) -> WorkerJob:
    return WorkerJob(job_id, "RUNNING", joined=True, ends_at=ends_at, group="short", **fields)


def test_a_worker_job_near_its_end_and_well_before_the_heads_is_due() -> None:
    now, head_ends = 1000.0, 5000.0
    jobs = [
        joined_job("1", now + 50),  # due
        joined_job("2", now + 500),  # not yet
        joined_job("3", now + 50, replaced_by="9"),  # already replaced
        joined_job("4", head_ends - 30),  # ends with the head: a replacement could not outlive it
        WorkerJob("5", "RUNNING", joined=False, ends_at=now + 50),  # not joined yet
        joined_job("6", None),  # its end unknown
    ]
    assert [j.job_id for j in due_for_rotation(jobs, now, 60, head_ends - 0)] == ["1"]
    assert [j.job_id for j in due_for_rotation(jobs[:1], now, 60, None)] == ["1"]


def test_the_old_job_is_drained_only_once_its_replacement_joined() -> None:
    old = joined_job("1", 1050.0, replaced_by="2")
    new = WorkerJob("2", "PENDING", group="short")
    jobs = {"1": old, "2": new}
    assert replaced_and_joined(jobs) == []
    new.state, new.joined = "RUNNING", True
    assert replaced_and_joined(jobs) == [old]
    old.leaving = True
    assert replaced_and_joined(jobs) == []


async def test_rotation_submits_a_replacement_of_the_group_then_drains_the_old(make_cluster, slurm):
    cluster = make_cluster(worker_rotation=60, worker_groups={"short": {"time": "5"}})
    await cluster.up_async(wait=False)
    slurm.run(cluster.job_id)
    write_connection(cluster)
    emit(cluster, {"event": "ready", "joined": 1, "node_count": 1})
    await until(lambda: cluster.status.state.is_up, 5, "READY")
    await cluster.scale_async(1, group="short")
    (old,) = cluster.workers.jobs
    assert "#SBATCH --time=00:05:00" in Path(cluster.job_dir, "workers-short.sbatch").read_text()
    slurm.run(old, "node2")
    emit(cluster, {"event": "worker_joined", "role": "worker", "host": "node2", "worker_job": old})
    await until(lambda: cluster.workers.jobs[old].joined, 5, "the worker joined")
    cluster.workers.jobs[old].ends_at = time.time() + 30  # as squeue would say near its end
    emit(cluster, {"event": "nodes", "joined": 2, "wanted": 1})
    # the new job is listed as sbatch answers, in a task of its own; the old one names it
    # a few loop turns later
    await until(lambda: cluster.workers.jobs[old].replaced_by, 5, "a replacement submitted")
    new = next(job_id for job_id in cluster.workers.jobs if job_id != old)
    assert cluster.workers.jobs[new].group == "short"
    assert cluster.workers.jobs[old].replaced_by == new
    assert not Path(cluster.job_dir, f"drain-{old}").exists()  # not before the new one joined
    slurm.run(new, "node3")
    emit(cluster, {"event": "worker_joined", "role": "worker", "host": "node3", "worker_job": new})
    await until(lambda: Path(cluster.job_dir, f"drain-{old}").exists(), 5, "the old one drained")

    def rotated() -> list[dict]:  # its event is read on a later tick than the drain file
        return [e for e in cluster.events if e.get("event") == "rotated"]

    await until(lambda: len(rotated()) >= 2, 5, "the draining told in the events")
    assert [e["step"] for e in rotated()][:2] == ["submitted", "draining"]
    assert "ends in" in rotated()[0]["cause"]
    slurm.end(old, "COMPLETED")


async def test_a_group_slurm_refuses_is_one_line_naming_it_and_changes_nothing(make_cluster, slurm):
    cluster = make_cluster(worker_groups={"gpu": {"partition": "nosuch"}})
    await cluster.up_async(wait=False)
    slurm.run(cluster.job_id)
    write_connection(cluster)
    emit(cluster, {"event": "ready", "joined": 1, "node_count": 1})
    await until(lambda: cluster.status.state.is_up, 5, "READY")
    slurm.refuse_submit = "invalid partition specified: nosuch"
    with pytest.raises(SlurmError) as error:
        await cluster.scale_async(1, group="gpu")
    assert str(error.value) == (
        "submitted 0 of 1 worker jobs of group gpu; Slurm refused the next: "
        "sbatch failed: invalid partition specified: nosuch"
    )
    assert cluster.workers.jobs == {} and cluster.status.nodes_wanted == 1
    assert not [e for e in cluster.events if e.get("event") == "scaled"]


async def test_worker_jobs_of_a_packed_cluster_run_the_bootstrap_as_the_head_does(tmp_path):
    """environment = "pack" on the login node: the nodes need not share the kernel's Python,
    so worker jobs run the bootstrap with python3 as the head's job does."""
    spec = ClusterSpec(time="10", job_dir_root=str(tmp_path), environment="pack")
    transport = LocalTransport()
    workers = WorkerJobs(transport, SlurmClient(transport), "ray-0123abcd", spec)
    job_dir = tmp_path / "ray-0123abcd"
    job_dir.mkdir(mode=0o700)
    await workers.script(str(job_dir), None, "default")
    assert "exec python3 " in (job_dir / "workers.sbatch").read_text()


async def test_the_record_keeps_each_jobs_group_and_the_last_decisions_for_everyone(
    make_cluster, slurm
):
    """What the REST listing and the sidebar read (status_of_record): per-group worker jobs
    with Slurm's reason and estimated start, and the last scaling decisions with their cause."""
    cluster = make_cluster(worker_groups={"gpu": {"gpus_per_node": 1}})
    await cluster.up_async(wait=False)
    slurm.run(cluster.job_id)
    write_connection(cluster)
    emit(cluster, {"event": "ready", "joined": 1, "node_count": 1})
    await until(lambda: cluster.status.state.is_up, 5, "READY")
    await cluster.scale_async(2, group="gpu", cause="more GPUs for train()")
    await until(lambda: cluster.status.scaling, 5, "the decision in the status")
    (line,) = cluster.status.scaling
    assert re.fullmatch(
        r"\d\d:\d\d:\d\d 1 → 2 nodes \(gpu\) \(submitted \d+, \d+\): "
        r"more GPUs for train\(\)",
        line,
    ), line
    await until(lambda: cluster.registry.load(cluster.id).scaling, 5, "the record")
    seen = status_of_record(cluster.registry.load(cluster.id))
    assert seen.scaling == (line,)
    assert {job.group for job in seen.worker_jobs} == {"gpu"}
    assert "gpu: 0 running, 2 pending" in scaling_text(seen)


def test_the_last_decisions_are_told_from_the_events_oldest_first() -> None:
    events = [
        {"t": 0, "event": "scaled", "nodes_before": 1, "nodes": 3, "submitted": ["11", "12"],
         "retired": [], "cause": "scale() by its owner"},
        {"t": 0, "event": "phase", "phase": "ready"},
        {"t": 0, "event": "rotated", "step": "submitted", "old": "11", "new": "13",
         "cause": "worker job 11 (default) ends in 60 s, before the head"},
        {"t": 0, "event": "scaled", "nodes_before": 3, "nodes": 1, "group": "default",
         "submitted": [], "retired": ["12", "13"], "cause": "asked by pid 7 on login1"},
    ]  # fmt: skip
    lines = recent_decisions(events)
    assert [line.split(" ", 1)[1] for line in lines] == [
        "1 → 3 nodes (submitted 11, 12): scale() by its owner",
        "rotation: submitted 11 → 13",
        "3 → 1 nodes (retired 12, 13): asked by pid 7 on login1",
    ]
    assert recent_decisions(events, count=1) == lines[-1:]
