"""How durations and statuses read for humans: one formatter for every view of a cluster."""

from __future__ import annotations

import time

from .states import State, Status

__all__ = ["format_duration", "status_line", "walltime_left"]


def format_duration(seconds: float | None) -> str:
    """``3725`` → ``"1:02:05"``; days as ``"2-03:04:05"``; ``"?"`` when unknown."""
    if seconds is None:
        return "?"
    seconds = max(0, int(seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    clock = f"{hours}:{rest // 60:02d}:{rest % 60:02d}"
    return f"{days}-{hours:02d}:{rest // 60:02d}:{rest % 60:02d}" if days else clock


def walltime_left(status: Status, now: float | None = None) -> float | None:
    """Seconds of walltime left now, counted down from Slurm's last answer."""
    if status.time_left is None:
        return None
    now = time.time() if now is None else now
    return max(0.0, status.time_left - (now - status.at))


def status_line(status: Status, *, since: float | None = None, now: float | None = None) -> str:
    """One line: state, Slurm's reason or start-up phase, est. start, elapsed, time left."""
    now = time.time() if now is None else now
    parts = [status.state.value]
    if status.state is State.STARTING:
        joined = f"{status.nodes_joined}/{status.nodes_wanted} nodes"
        parts.append(f"({status.phase or 'starting'}, {joined})")
    elif status.reason:
        parts.append(f"({status.reason})")
    if status.job_id:
        parts.append(f"job {status.job_id}")
    if status.state is State.PENDING and status.estimated_start:
        parts.append(f"est. start {status.estimated_start:%Y-%m-%d %H:%M}")
    if since is not None and not status.state.is_final:
        parts.append(f"elapsed {format_duration(now - since)}")
    left = walltime_left(status, now)
    if left is not None and status.state.is_up:
        parts.append(f"{format_duration(left)} left")
    if status.walltime_warning and not status.state.is_final:
        parts.append("walltime almost over")
    if status.slurm_unreachable_since is not None and not status.state.is_final:
        silent = format_duration(now - status.slurm_unreachable_since)
        parts.append(f"Slurm not answering for {silent} (last known state shown)")
    elif status.notice and not status.state.is_final:
        parts.append(status.notice)
    return " · ".join(parts)
