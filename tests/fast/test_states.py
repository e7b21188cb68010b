"""How Slurm's view plus the bootstrap's events become one truthful state (pure logic)."""

from __future__ import annotations

from datetime import datetime

from jupyter_slurm_ray.scheduler.records import JobInfo
from jupyter_slurm_ray.states import EventSummary, State, Status, derive_status
from jupyter_slurm_ray.ui.formatting import status_line

START = Status(State.PENDING, nodes_wanted=3, job_id="9")


def job(state: str, **kw) -> JobInfo:
    return JobInfo(job_id="9", state=state, **kw)


def events(*evs: dict) -> EventSummary:
    summary = EventSummary()
    summary.add(evs)
    return summary


def test_pending_carries_slurms_reason_and_estimated_start():
    when = datetime(2026, 11, 29, 20, 0)
    status = derive_status(START, job("PENDING", reason="Resources", start_time=when), events())
    assert (status.state, status.reason, status.estimated_start) == (
        State.PENDING,
        "Resources",
        when,
    )
    assert "Resources" in status_line(status) and "est. start" in status_line(status)


def test_starting_carries_phase_and_nodes_joined():
    evs = events({"event": "phase", "phase": "waiting_for_nodes"}, {"event": "nodes", "joined": 2})
    status = derive_status(START, job("RUNNING", nodes=("node1", "node2", "node3")), evs)
    assert (status.state, status.phase, status.nodes_joined) == (
        State.STARTING,
        "waiting_for_nodes",
        2,
    )
    assert "2/3 nodes" in status_line(status)


def test_ready_then_connected():
    evs = events({"event": "ready", "node_count": 3})
    assert derive_status(START, job("RUNNING"), evs).state is State.READY
    assert derive_status(START, job("RUNNING"), evs, connected=True).state is State.CONNECTED


def test_bootstrap_error_is_failed_with_its_log_even_while_the_job_runs():
    evs = events({"event": "error", "reason": "ray not found on PATH", "log": ["line1", "line2"]})
    status = derive_status(START, job("RUNNING"), evs)
    assert (status.state, status.reason, status.log_tail) == (
        State.FAILED,
        "ray not found on PATH",
        "line1\nline2",
    )


def test_slurm_final_states_map_to_ours():
    ready = events({"event": "ready"})
    assert derive_status(START, job("TIMEOUT"), ready).state is State.TIMEOUT
    assert derive_status(START, job("CANCELLED"), ready).state is State.CANCELLED
    assert derive_status(START, job("NODE_FAIL"), ready).state is State.NODE_FAIL
    assert derive_status(START, job("PREEMPTED"), ready).state is State.PREEMPTED
    failed = derive_status(START, job("FAILED", exit_code=3), events(), log_tail="boom")
    assert failed.state is State.FAILED and "exit code 3" in (failed.reason or "")
    assert failed.log_tail == "boom"


def test_our_own_cancel_is_stopped_not_cancelled():
    status = derive_status(START, job("CANCELLED"), events({"event": "ready"}), stopping=True)
    assert status.state is State.STOPPED


def test_lease_stale_stop_says_why():
    status = derive_status(START, job("COMPLETED"), events({"event": "lease_stale"}))
    assert status.state is State.STOPPED and "lease" in (status.reason or "")


def test_final_state_never_changes_again():
    stopped = Status(State.STOPPED, job_id="9")
    assert derive_status(stopped, job("RUNNING"), events()) is stopped


def test_walltime_warning_is_shown_while_ready():
    evs = events({"event": "ready"}, {"event": "walltime_warning"})
    status = derive_status(START, job("RUNNING", time_left=100), evs)
    assert status.state is State.READY and status.walltime_warning


def test_a_job_slurm_forgot_without_accounting_is_stopped_not_running_forever():
    ready = events({"event": "ready"})
    assert derive_status(START, None, ready).state is State.PENDING  # one miss: no change
    status = derive_status(START, None, ready, job_forgotten=True)
    assert status.state is State.STOPPED and "no longer knows" in (status.reason or "")


def test_a_stop_another_process_asked_for_is_stopped_not_cancelled():
    running = Status(State.CONNECTED, nodes_wanted=1, job_id="9")
    asked = {"event": "stop_requested", "role": "client", "pid": 4242, "host": "login1"}
    status = derive_status(running, job("CANCELLED"), events(asked))
    assert (status.state, status.reason) == (State.STOPPED, "stopped by pid 4242 on login1")


def test_a_cancel_nobody_here_asked_for_stays_cancelled():
    running = Status(State.CONNECTED, nodes_wanted=1, job_id="9")
    not_a_client = {"event": "stop_requested", "role": "head", "pid": 1, "host": "node1"}
    for evs in (events(), events(not_a_client)):
        assert derive_status(running, job("CANCELLED"), evs).state is State.CANCELLED
