"""Faults injected for real into the testbed: the Slurm controller, nodes, sshd sessions.

Every fault is undone by the context manager that injects it (the controller resumed or
restarted, the node resumed), so a failing test leaves the testbed as it found it. Figures
(what the user saw, and when) go to ``test-artifacts/fault-figures.jsonl``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from .paths import ARTIFACTS
from .waiting import wait_for

RUN = Path("/run/jsr-testbed")
#: slurmctld's saved job state (StateSaveLocation in scripts/testbed's slurm.conf)
JOB_STATE = Path("/var/spool/jsr-testbed/ctld/job_state")
DAEMON_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


def daemon_pid(name: str) -> int:
    return int((RUN / f"{name}.pid").read_text().split()[0])


def slurm_answers() -> bool:
    done = subprocess.run(["sinfo", "-h"], capture_output=True, timeout=30, check=False)
    return done.returncode == 0


@contextlib.contextmanager
def controller_paused() -> Iterator[int]:
    """slurmctld stopped with SIGSTOP (its clients then time out), resumed on exit."""
    pid = daemon_pid("slurmctld")
    os.kill(pid, signal.SIGSTOP)
    try:
        yield pid
    finally:
        os.kill(pid, signal.SIGCONT)
        wait_for(slurm_answers, 60, "slurmctld to answer again", step=1)


def restart_controller(down_for: float, while_down: Callable[[], object] | None = None) -> None:
    """Kill slurmctld (SIGKILL: no goodbye), wait (calling ``while_down`` once meanwhile),
    start it again from its saved state.

    Only once it has saved its job state since the jobs it runs started: killed before its
    first save (a freshly started testbed), it came back knowing no job and gave the next one
    the running job's id, and its node drained with "Duplicate jobid" (seen on 24.11). Saved
    in the second the job started is not enough: that save may still show it pending (seen on
    26.05: "Registered PENDING JobId=1 StepId=1.batch", then the same drain). A controller
    saves when a job changes, and 22.05 had nothing more to save after the start: the newest
    job is changed to what it is (nice=0) once its second has passed, and that save awaited."""
    started, newest = _newest_job()
    time.sleep(max(0.0, started + 1 - time.time()))
    poked = time.time()
    if newest:
        subprocess.run(["scontrol", "update", f"jobid={newest}", "nice=0"], check=False, timeout=30)
    wait_for(
        lambda: JOB_STATE.exists() and JOB_STATE.stat().st_mtime >= max(started + 1, poked),
        60,
        "slurmctld to save the state of the running jobs",
    )
    pid = daemon_pid("slurmctld")
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not Path(f"/proc/{pid}").exists(), 10, "slurmctld to die", step=0.1)
    down_since = time.monotonic()
    if while_down is not None:
        while_down()
    time.sleep(max(0.0, down_for - (time.monotonic() - down_since)))
    # -i: Slurm 26.05 refuses to start without the associations' usage file, which a
    # controller saves only every few minutes (here it may be younger); the jobs' state is
    # saved at each change and is read all the same
    subprocess.run(["slurmctld", "-i"], env=DAEMON_ENV, cwd="/", check=True, timeout=30)
    wait_for(slurm_answers, 60, "the restarted slurmctld to answer", step=1)


def _newest_job() -> tuple[float, str]:
    """When the newest of the running jobs started (epoch seconds) and its id; (0, "") when
    none runs."""
    shown = subprocess.run(
        ["squeue", "-h", "-t", "running", "-o", "%S %i"], capture_output=True, text=True, timeout=30
    ).stdout.splitlines()
    jobs = [
        (time.mktime(time.strptime(start, "%Y-%m-%dT%H:%M:%S")), job_id)
        for start, job_id in (line.split() for line in shown if line.strip())
    ]
    return max(jobs, default=(0.0, ""))


@contextlib.contextmanager
def node_down(node: str, reason: str = "jsr fault test") -> Iterator[None]:
    """``scontrol update state=down`` for a node; resumed (and idle again) on exit."""
    subprocess.run(
        ["scontrol", "update", f"nodename={node}", "state=down", f"reason={reason}"], check=True
    )
    try:
        yield
    finally:
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)
        wait_for(lambda: _node_state(node) in ("idle", "mixed", "allocated"), 60, f"{node} back")


def _node_state(node: str) -> str:
    done = subprocess.run(
        ["sinfo", "-h", "-N", "-n", node, "-o", "%T"], capture_output=True, text=True, check=False
    )
    return done.stdout.split()[0] if done.stdout.split() else ""


def ssh_client_ports(server_port: int) -> set[int]:
    """The local ports of this process's TCP connections to ``server_port`` (its SSH ones)."""
    return {local for local, remote in _connections(os.getpid()) if remote == server_port}


def sshd_sessions_from(client_ports: set[int], daemon: int | None = None) -> list[int]:
    """PIDs of the sshd processes (children of the daemon, by default the login node's)
    serving the connections that come from ``client_ports``: one client's sessions, not the
    other sessions of its user (other tests' beside it)."""
    daemon = daemon_pid("sshd") if daemon is None else daemon
    return [
        pid
        for pid in _children(daemon)
        if any(remote in client_ports for _, remote in _connections(pid))
    ]


def _children(parent: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
            found.append(int(entry.name))
    return found


def _connections(pid: int) -> list[tuple[int, int]]:
    """(local port, remote port) of the TCP sockets ``pid`` holds, as its network namespace
    sees them."""
    inodes = set()
    try:
        fds = list(os.scandir(f"/proc/{pid}/fd"))
    except OSError:
        return []
    for fd in fds:
        with contextlib.suppress(OSError):
            target = os.readlink(fd.path)
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    found = []
    for table in ("tcp", "tcp6"):
        try:
            rows = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            words = row.split()
            if len(words) > 9 and int(words[9]) in inodes:
                found.append((_port(words[1]), _port(words[2])))
    return found


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1], 16)


def record_figure(fault: str, **figures: object) -> None:
    """One line of figures for a fault: what the user saw, when reported, when all gone."""
    ARTIFACTS.mkdir(exist_ok=True)
    with open(ARTIFACTS / "fault-figures.jsonl", "a") as f:
        f.write(json.dumps({"fault": fault, **figures}) + "\n")
