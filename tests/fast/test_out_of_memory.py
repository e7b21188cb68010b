"""Out of memory told as such: the job's memory cgroup read as Linux lays it out (v1, v2), the
bootstrap's one line (where, the limit, what to ask), and the states it makes: OUT_OF_MEMORY
when the kernel killed Ray itself or Slurm says so at the end, a notice in the status while Ray
goes on after a task's worker was killed. Pure: tmp dirs standing for /sys/fs/cgroup."""

from __future__ import annotations

from pathlib import Path

from jupyter_slurm_ray.scheduler.records import JobInfo
from jupyter_slurm_ray.states import EventSummary, State, Status, derive_status

from ..helpers.bootstrap import bootstrap_module

memcgroup = bootstrap_module("memcgroup")
noderun = bootstrap_module("noderun")

JOB = "slurm_node1/uid_2101/job_42"


def cgroup_v1(tmp_path: Path, limit: int, kills: int) -> tuple[Path, Path]:
    """A /proc/self/cgroup of a step, and a v1 memory hierarchy with the job's limit."""
    root = tmp_path / "cgroup"
    step = root / "memory" / JOB / "step_batch"
    step.mkdir(parents=True)
    (step.parent / "memory.limit_in_bytes").write_text(f"{limit}\n")
    (step.parent / "memory.oom_control").write_text(
        f"oom_kill_disable 0\nunder_oom 0\noom_kill {kills}\n"
    )
    (step / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # no limit of its own
    (step / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
    proc = tmp_path / "cgroup-of-self"
    proc.write_text(f"12:pids:/{JOB}/step_batch\n4:memory:/{JOB}/step_batch\n0::/\n")
    return proc, root


def test_the_jobs_limit_and_kills_are_read_on_cgroup_v1(tmp_path: Path) -> None:
    proc, root = cgroup_v1(tmp_path, 1024 * 2**20, kills=0)
    cgroup = memcgroup.own_memory_cgroup(proc, root)
    assert cgroup is not None and not cgroup.v2
    assert cgroup.limit_mb() == 1024 and cgroup.oom_kills() == 0
    (root / "memory" / JOB / "memory.oom_control").write_text("oom_kill 2\n")
    assert cgroup.oom_kills() == 2


def test_the_jobs_limit_and_kills_are_read_on_cgroup_v2(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    step = root / JOB / "step_batch"
    step.mkdir(parents=True)
    (step.parent / "memory.max").write_text("2147483648\n")
    (step.parent / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    (step / "memory.max").write_text("max\n")
    proc = tmp_path / "cgroup-of-self"
    proc.write_text(f"0::/{JOB}/step_batch\n")
    cgroup = memcgroup.own_memory_cgroup(proc, root)
    assert cgroup is not None and cgroup.v2
    assert (cgroup.limit_mb(), cgroup.oom_kills()) == (2048, 1)


def test_no_memory_cgroup_means_no_kills_and_no_limit(tmp_path: Path) -> None:
    proc = tmp_path / "cgroup-of-self"
    proc.write_text("")
    assert memcgroup.own_memory_cgroup(proc, tmp_path) is None
    assert memcgroup.OomWatch(None).since() == (0, None)


def test_the_line_says_where_the_limit_and_what_to_ask() -> None:
    fatal = noderun.out_of_memory_reason("node1", 1, 1024, fatal=True)
    assert fatal == (
        "out of memory on node1: the kernel killed Ray's processes that went over the job's limit "
        "of 1024 MB; ask for more with --mem (mem_per_node), e.g. --mem 1.5G"
    )
    kept = noderun.out_of_memory_reason("node2", 3, 2048, fatal=False)
    assert "a task's worker, most likely" in kept and "(3 so far)" in kept
    assert kept.endswith("e.g. --mem 3G")


def running(**fields: object) -> JobInfo:
    return JobInfo(job_id="42", state="RUNNING", **fields)  # type: ignore[arg-type]


def summary(*events: dict) -> EventSummary:
    found = EventSummary()
    found.add([{"t": 1.0, "role": "head", **event} for event in events])
    return found


READY = ({"event": "head_ready", "joined": 1}, {"event": "ready", "joined": 1})


def test_ray_killed_at_the_limit_is_out_of_memory_not_a_ray_traceback() -> None:
    reason = noderun.out_of_memory_reason("node1", 1, 1024, fatal=True)
    events = summary(
        {"event": "out_of_memory", "fatal": True, "reason": reason},
        {"event": "error", "reason": reason, "log": ["ray-head-node1.log: Traceback"]},
    )
    status = derive_status(Status(State.STARTING), running(), events)
    assert status.state is State.OUT_OF_MEMORY and status.state.is_final
    assert status.reason == reason
    ended = derive_status(Status(State.STARTING), JobInfo("42", "OUT_OF_MEMORY"), events)
    assert ended.state is State.OUT_OF_MEMORY and ended.reason == reason


def test_a_tasks_worker_killed_at_the_limit_is_told_while_ray_goes_on() -> None:
    reason = noderun.out_of_memory_reason("node1", 1, 1536, fatal=False)
    events = summary(*READY, {"event": "out_of_memory", "fatal": False, "reason": reason})
    status = derive_status(Status(State.READY), running(), events, connected=True)
    assert status.state is State.CONNECTED and status.reason == reason
    stopped = derive_status(
        status, JobInfo("42", "CANCELLED"), summary(*READY, *events.events[2:]), stopping=True
    )
    assert stopped.state is State.STOPPED
    assert stopped.reason == f"stopped on request; earlier, {reason}"


def test_slurms_out_of_memory_alone_names_the_setting() -> None:
    ended = derive_status(Status(State.READY), JobInfo("42", "OUT_OF_MEMORY"), summary(*READY))
    assert ended.state is State.OUT_OF_MEMORY
    assert "Slurm: OUT_OF_MEMORY" in (ended.reason or "") and "mem_per_node" in (ended.reason or "")
