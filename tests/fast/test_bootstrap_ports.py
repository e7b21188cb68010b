"""The bootstrap's port blocks: claims under a lock, busy ports named, the lock never fatal nor
endless, and a port Ray failed to bind recognised in its logs. Pure: a tmp lock dir, this user."""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ..helpers.bootstrap import BOOTSTRAP_DIR, bootstrap_module, claims
from ..helpers.clock import VirtualClock

# the job's Python imports them top-level, from the shipped directory
portblock = bootstrap_module("portblock")
portlock = bootstrap_module("portlock")
portconflict = bootstrap_module("portconflict")
BootstrapError = bootstrap_module("jsr_base").BootstrapError


CLAIMER = """
import json, random, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import portblock
blocks = [
    portblock.claim_port_block(
        27, strategy="random", port_range=(20000, 24000), fixed_base=None,
        lock_dir=Path(sys.argv[2]), job=sys.argv[3],
    )
    for _ in range(15)
]
print(json.dumps([b.start for b in blocks]), flush=True)
sys.stdin.read()  # hold the claims until the test closes stdin
"""


def test_concurrent_claims_get_disjoint_blocks(tmp_path: Path) -> None:
    lock_dir = tmp_path / "locks"
    lock_dir.mkdir()
    module_dir = str(BOOTSTRAP_DIR)
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CLAIMER, module_dir, str(lock_dir), f"job{i}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    try:
        starts = [json.loads(child.stdout.readline()) for child in children]  # type: ignore[union-attr]
        blocks = sorted(start for found in starts for start in found)
        assert len(blocks) == 30
        assert all(b - a >= 27 for a, b in itertools.pairwise(blocks)), blocks
        low, _high = portblock.ephemeral_port_range()
        assert blocks[-1] + 27 <= low
        assert len(claims(str(lock_dir))) == 30
    finally:
        for child in children:
            child.communicate("", timeout=10)
    # the claimers are gone: their claims are stale, and the next claim removes them
    block = portblock.claim_port_block(
        27, strategy="random", port_range=(20000, 24000), fixed_base=None,
        lock_dir=lock_dir, job="next",
    )  # fmt: skip
    assert [c["job_id"] for c in claims(str(lock_dir))] == ["next"]
    block.release()
    assert claims(str(lock_dir)) == []


def test_configured_lock_dir_gets_a_lock_and_claims_others_can_read(tmp_path: Path) -> None:
    lock_dir = tmp_path / "locks"
    lock_dir.mkdir()
    old = os.umask(0o077)
    try:
        block = portblock.claim_port_block(
            12, strategy="random", port_range=(21000, 22000), fixed_base=None,
            lock_dir=lock_dir, job="j",
        )  # fmt: skip
    finally:
        os.umask(old)
    assert oct((lock_dir / "lock").stat().st_mode & 0o777) == oct(0o644)
    assert block.claim_file is not None and block.claim_file.parent == lock_dir
    assert oct(block.claim_file.stat().st_mode & 0o777) == oct(0o644)
    assert (
        block.ports["node_manager"] == block.start
        and block.ports["dashboard_metrics"] == block.start + 5
    )
    assert block.ports["min_worker"] == block.start + 6
    assert block.ports["max_worker"] == block.start + 11
    assert "gcs" not in block.ports  # the GCS's port is kernel-assigned (rayargs.py)
    block.release()
    assert not list(lock_dir.glob("*.claim"))


def free_ports_below_the_ephemeral_range(count: int) -> int:
    """The first of ``count`` consecutive ports that bind now, below the ephemeral range (so
    that no outgoing connection of another process takes one of them meanwhile)."""
    for base in range(30000, 32000, count):
        sockets = []
        try:
            for port in range(base, base + count):
                sock = socket.socket()
                sockets.append(sock)
                sock.bind(("", port))
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise AssertionError(f"no {count} free consecutive ports from 30000 to 32000")


def test_fixed_block_names_the_busy_port(tmp_path: Path) -> None:
    with socket.socket() as listener:
        busy = free_ports_below_the_ephemeral_range(40) + 2
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("", busy))
        listener.listen()
        with pytest.raises(BootstrapError, match=rf"port {busy} \(client\) is already in use"):
            portblock.claim_port_block(
                20, strategy="fixed", port_range=(0, 0), fixed_base=busy - 2,
                lock_dir=tmp_path, job="j",
            )  # fmt: skip
    first = portblock.claim_port_block(
        20, strategy="fixed", port_range=(0, 0), fixed_base=busy, lock_dir=tmp_path, job="one"
    )
    with pytest.raises(BootstrapError, match="claimed by job one"):
        portblock.claim_port_block(
            20, strategy="fixed", port_range=(0, 0), fixed_base=busy + 5,
            lock_dir=tmp_path, job="two",
        )  # fmt: skip
    first.release()


def test_no_block_outside_the_ephemeral_range(tmp_path: Path) -> None:
    low, high = portblock.ephemeral_port_range()
    with pytest.raises(BootstrapError, match="no free block of 20 consecutive ports"):
        portblock.claim_port_block(
            20, strategy="random", port_range=(low, high), fixed_base=None,
            lock_dir=tmp_path, job="j",
        )  # fmt: skip


HOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
sys.stdin.read()
"""


def test_port_lock_is_never_fatal_nor_endless(tmp_path: Path, monkeypatch) -> None:
    reasons: list[str] = []
    clock = VirtualClock()
    monkeypatch.setattr(portlock, "time", clock.as_time_module())
    os.mkfifo(tmp_path / "lock")  # a FIFO: opening it must not wait for a writer
    with portlock.port_lock(tmp_path, reasons.append, wait=5) as held:
        assert not held
    assert clock.slept == 0
    assert (
        reasons[-1]
        == f"cannot open the port lock {tmp_path}/lock: {tmp_path}/lock is not a regular file"
    )
    (tmp_path / "lock").unlink()
    (tmp_path / "lock").symlink_to("/etc/passwd")
    with portlock.port_lock(tmp_path, reasons.append) as held:
        assert not held
    assert "Too many levels of symbolic links" in reasons[-1]
    (tmp_path / "lock").unlink()

    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path / "lock")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with portlock.port_lock(tmp_path, reasons.append, wait=0.5) as held:
            assert not held
        assert clock.slept == pytest.approx(0.5, abs=0.06)  # waited its 0.5 s, no longer
        assert reasons[-1] == (
            f"the port lock {tmp_path}/lock stayed locked for 0.5 s by pid {holder.pid} "
            f"(uid {os.getuid()}); going on without it (every port is still probed)"
        )
    finally:
        holder.communicate("", timeout=10)
    with portlock.port_lock(tmp_path, reasons.append, wait=0.5) as held:
        assert held
    assert oct((tmp_path / "lock").stat().st_mode & 0o777) == oct(0o644)


# What Ray 2.60 logs when a port of the block is held by another process (measured).
RAY_260_LINES = {
    "raylet.err": (0, "[2026-12-01 00:31:47,509 C 1345 1345] (raylet) grpc_server.cc:134: Check "
    "failed: server_ Failed to start the grpc server. The specified port is {port}."),
    "ray-head-node1.log": (3, "ValueError: Failed to bind to 10.200.0.13:{port} because it's "
    "already occupied. You can use `ray start --dashboard-port ...`"),
    "ray_client_server.err": (2, "RuntimeError: Failed to bind to address 10.200.0.13:{port}; set "
    "GRPC_VERBOSITY=debug environment variable to see detailed error message."),
    "monitor.log": (4, "OSError: [Errno 98] Address already in use"),
    "dashboard.log": (5, "OSError: [Errno 98] Address already in use"),
}  # fmt: skip
# Ray's processes whose ports are kernel-assigned: what they log is not about the block.
KERNEL_ASSIGNED_LINES = {
    "gcs_server.err": "[2026-12-01 00:30:54,995 C 32756 32756] (gcs_server) grpc_server.cc:134:"
    "  Check failed: server_ Failed to start the grpc server. The specified port is 41089.",
    "dashboard_agent.log": "OSError: [Errno 98] error while attempting to bind on address "
    "('10.200.0.13', 41090): address already in use",
    "runtime_env_agent.err": "OSError: [Errno 98] Address already in use",
}  # fmt: skip


@pytest.mark.parametrize("log_name", sorted(RAY_260_LINES))
def test_a_taken_port_is_recognised_in_rays_logs(tmp_path: Path, log_name: str) -> None:
    block = portblock.PortBlock(27100, 27)
    ray_log, session = tmp_path / "ray-head-node1.log", tmp_path / "session"
    session.mkdir()
    ray_log.write_text("Failed to bind to 10.0.0.1:27104 because it's already occupied\n")
    scan = portconflict.ConflictScan(block, ray_log, session)  # earlier attempts: not news
    offset, line = RAY_260_LINES[log_name]
    path = ray_log if log_name == ray_log.name else session / log_name
    with open(path, "a") as handle:
        handle.write("2026-12-01 00:33:03,523 INFO Starting Ray on port 27100\n")
        assert scan.check() is None
        handle.write(line.format(port=27100 + offset) + "\n")
    conflict = scan.check()
    assert conflict is not None
    assert conflict.ports == [27100 + offset]
    assert conflict.names == [portblock.port_name(offset)]
    assert scan.check() is None  # read once


@pytest.mark.parametrize("log_name", sorted(KERNEL_ASSIGNED_LINES))
def test_a_kernel_assigned_ports_trouble_is_not_about_the_block(
    tmp_path: Path, log_name: str
) -> None:
    block = portblock.PortBlock(27100, 22)
    ray_log, session = tmp_path / "ray-head-node1.log", tmp_path / "session"
    session.mkdir()
    scan = portconflict.ConflictScan(block, ray_log, session)
    (session / log_name).write_text(KERNEL_ASSIGNED_LINES[log_name] + "\n")
    assert scan.check() is None


# /proc/self/mountinfo lines: the host's /tmp, and a job's (job_container/tmpfs binds a
# directory of its BasePath there)
NODE_TMP = "36 25 0:32 / /tmp rw,nosuid,nodev shared:15 - tmpfs tmpfs rw\n"
JOB_TMP = (
    "812 36 259:1 /var/spool/slurmd/tmpfs/node1/12/.tmp /tmp rw,relatime - ext4 /dev/sda1 rw\n"
)
ROOT = "24 1 259:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"


@pytest.mark.parametrize(
    ("mountinfo", "private"),
    [(ROOT, False), (ROOT + NODE_TMP, False), (ROOT + NODE_TMP + JOB_TMP, True), ("", False)],
)
def test_a_tmp_bound_for_the_job_alone_is_recognised(
    tmp_path: Path, mountinfo: str, private: bool
) -> None:
    trust = bootstrap_module("trust")
    (tmp_path / "mountinfo").write_text(mountinfo)
    assert trust.tmp_private_to_job(str(tmp_path / "mountinfo")) is private
    assert trust.tmp_private_to_job(str(tmp_path / "missing")) is False


def test_port_claims_go_where_the_users_other_jobs_see_them(monkeypatch) -> None:
    """Under /var/tmp when the job's /tmp is its own; Ray's temp dirs stay in that /tmp."""
    trust = bootstrap_module("trust")
    made: list[Path] = []
    monkeypatch.setattr(trust, "private_dir", lambda path: made.append(path) or path)
    uid = os.getuid()
    monkeypatch.setattr(trust, "tmp_private_to_job", lambda: True)
    assert trust.user_temp_dir(node_wide=True) == Path(f"/var/tmp/jsr-{uid}")
    assert trust.user_temp_dir() == Path(f"/tmp/jsr-{uid}")
    monkeypatch.setattr(trust, "tmp_private_to_job", lambda: False)
    assert trust.user_temp_dir(node_wide=True) == Path(f"/tmp/jsr-{uid}")
