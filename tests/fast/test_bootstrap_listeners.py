"""The token goes only to listeners verified as the job's own Ray: /proc/net/tcp read right,
a listener judged by the process that holds it, a block lost to someone else named as such,
hash_jobid blocks derived from the job id, claims that hold no exact port until Ray bound
its ports, a token renewed in place, clients that refuse an unverified connection.json.
Pure: tmp dirs, a fake /proc, this process's own sockets."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import stat
import sys
from pathlib import Path

import pytest

from jupyter_slurm_ray.client.connect import ConnectionInfo
from jupyter_slurm_ray.errors import ConnectError

from ..helpers.bootstrap import bootstrap_module, claims

listeners = bootstrap_module("listeners")
portblock = bootstrap_module("portblock")
jsr_base = bootstrap_module("jsr_base")
rayports = bootstrap_module("rayports")

HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"  # noqa: E501


def row(address: str, state: str, uid: int, inode: int) -> str:
    return f"   0: {address} 00000000:0000 {state} 00000000:00000000 00:00000000 00000000 {uid:5d} 0 {inode} 1 0 100 0 0 10 0\n"  # noqa: E501


def hex4(ip: str, port: int) -> str:
    packed = socket.inet_aton(ip)
    if sys.byteorder == "little":
        packed = packed[::-1]
    return f"{packed.hex().upper()}:{port:04X}"


def test_proc_net_tcp_addresses_are_read_in_the_hosts_byte_order() -> None:
    assert listeners.parse_address(hex4("127.0.0.1", 8080)) == ("127.0.0.1", 8080)
    assert listeners.parse_address(hex4("10.200.0.13", 34385)) == ("10.200.0.13", 34385)
    if sys.byteorder == "little":  # as Linux on x86 and arm64 prints them (measured)
        assert listeners.parse_address("0100007F:1F90") == ("127.0.0.1", 8080)
        assert listeners.parse_address("0" * 32 + ":A081") == ("::", 41089)
        mapped = "0000000000000000FFFF00000D00C80A:6255"
        assert listeners.parse_address(mapped) == ("::ffff:10.200.0.13", 25173)


def fake_proc(tmp_path: Path, rows: list[str], fds: dict[int, list[int]]) -> Path:
    """A /proc with net/tcp (the rows), net/tcp6 (empty) and each pid's socket fds."""
    proc = tmp_path / "proc"
    (proc / "net").mkdir(parents=True)
    (proc / "net" / "tcp").write_text(HEADER + "".join(rows))
    (proc / "net" / "tcp6").write_text(HEADER)
    for pid, inodes in fds.items():
        (proc / str(pid) / "fd").mkdir(parents=True)
        for fd, inode in enumerate(inodes):
            os.symlink(f"socket:[{inode}]", proc / str(pid) / "fd" / str(fd))
        os.symlink("/dev/null", proc / str(pid) / "fd" / "99")
    return proc


def test_only_listen_rows_count(tmp_path: Path) -> None:
    rows = [row(hex4("10.0.0.5", 21000), "0A", 1001, 11), row(hex4("10.0.0.5", 21001), "01", 7, 12)]
    proc = fake_proc(tmp_path, rows, {})
    assert listeners.listeners(proc) == [listeners.Listener("10.0.0.5", 21000, 1001, 11)]


def own(proc: Path, session: set[int], block: range = range(21000, 21010)):
    names = {21000: "node_manager", 21002: "client", 21003: "dashboard"}
    return listeners.OwnListeners(lambda: session, block, names, proc)


def test_a_listener_held_by_our_ray_is_ours(tmp_path: Path) -> None:
    me = os.getuid()
    rows = [row(hex4("10.0.0.5", 21003), "0A", me, 51), row(hex4("127.0.0.1", 21003), "0A", me, 52)]
    proc = fake_proc(tmp_path, rows, {4242: [51, 52, 60]})
    checked = own(proc, {4242})
    checked.scan()
    checked.check_block()
    assert checked.verify("client", 21002) is False  # nothing listens there yet
    assert checked.verify("dashboard", 21003) is True
    assert checked.ports() == {"dashboard": 21003}
    assert checked.still_ours("dashboard")


def test_a_listener_of_another_user_loses_the_block(tmp_path: Path) -> None:
    me, bob = os.getuid(), os.getuid() + 1
    rows = [row(hex4("10.0.0.5", 21003), "0A", me, 51), row(hex4("0.0.0.0", 21003), "0A", bob, 77)]
    proc = fake_proc(tmp_path, rows, {4242: [51]})
    checked = own(proc, {4242})
    checked.scan()
    with pytest.raises(jsr_base.PortConflict) as taken:
        checked.check_block()  # before anything is asked: someone else listens in the block
    assert (taken.value.ports, taken.value.names, taken.value.by_uids) == (
        [21003],
        ["dashboard"],
        [bob],
    )
    assert taken.value.reason.startswith(
        f"port 21003 (dashboard) was taken after the probe (listening there: another user: "
        f"uid {bob}"
    )
    with pytest.raises(jsr_base.PortConflict):
        checked.verify("dashboard", 21003)
    assert checked.ports() == {}


def test_a_listener_of_ours_outside_our_ray_is_not_trusted(tmp_path: Path) -> None:
    rows = [row(hex4("10.0.0.5", 21002), "0A", os.getuid(), 61)]
    proc = fake_proc(tmp_path, rows, {4242: [51]})
    checked = own(proc, {4242})
    checked.scan()
    checked.check_block()  # this user's uid: not someone else's squat
    with pytest.raises(jsr_base.PortConflict, match="another process of this user"):
        checked.verify("client", 21002)


def test_a_verified_listener_replaced_is_checked_again(tmp_path: Path) -> None:
    me, bob = os.getuid(), os.getuid() + 1
    proc = fake_proc(tmp_path, [row(hex4("10.0.0.5", 21003), "0A", me, 51)], {4242: [51]})
    checked = own(proc, {4242})
    checked.scan()
    assert checked.verify("dashboard", 21003)
    (proc / "net" / "tcp").write_text(HEADER + row(hex4("10.0.0.5", 21003), "0A", bob, 90))
    checked.scan()
    assert not checked.still_ours("dashboard")
    with pytest.raises(jsr_base.PortConflict, match=f"uid {bob}"):
        checked.verify("dashboard", 21003)


def test_this_processs_own_listener_is_found_through_the_real_proc() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        block = range(port, port + 1)
        mine = listeners.OwnListeners(lambda: {os.getpid()}, block, {port: "client"})
        mine.scan()
        mine.check_block()
        assert mine.verify("client", port) and mine.ports() == {"client": port}
        others = listeners.OwnListeners(set, block, {port: "client"})  # not in "our Ray"
        others.scan()
        with pytest.raises(jsr_base.PortConflict, match="another process of this user"):
            others.verify("client", port)


def test_a_stranger_on_the_same_port_of_another_address_is_no_ones_concern(
    tmp_path: Path,
) -> None:
    """Bob binds loopback's twin of our dashboard's port: nothing sent to the node's address
    reaches him, so the node's listener is still verified (no denial by a loopback squat); on
    every address (or on the node's), he would take connections: that one is a conflict."""
    me, bob = os.getuid(), os.getuid() + 1
    ours = row(hex4("10.0.0.5", 21003), "0A", me, 51)
    rows = [ours, row(hex4("127.0.0.1", 21003), "0A", bob, 77)]
    proc = fake_proc(tmp_path, rows, {4242: [51]})
    checked = listeners.OwnListeners(lambda: {4242}, range(0), {}, proc, ip="10.0.0.5")
    checked.scan()
    assert checked.verify("dashboard", 21003)
    assert listeners.still_listening("10.0.0.5", 21003, frozenset({51}), proc)
    (proc / "net" / "tcp").write_text(HEADER + ours + row(hex4("0.0.0.0", 21003), "0A", bob, 78))
    checked.scan()
    with pytest.raises(jsr_base.PortConflict, match=f"uid {bob}"):
        checked.verify("dashboard", 21003)


def test_still_listening_says_whether_the_verified_socket_took_the_connection(
    tmp_path: Path,
) -> None:
    me, bob = os.getuid(), os.getuid() + 1
    proc = fake_proc(tmp_path, [row(hex4("10.0.0.5", 21003), "0A", me, 51)], {})
    assert listeners.still_listening("10.0.0.5", 21003, frozenset({51}), proc)
    assert not listeners.still_listening("10.0.0.5", 21003, frozenset({52}), proc)
    (proc / "net" / "tcp").write_text(HEADER + row(hex4("10.0.0.5", 21003), "0A", bob, 90))
    assert not listeners.still_listening("10.0.0.5", 21003, frozenset({51}), proc)  # replaced
    (proc / "net" / "tcp").write_text(HEADER)
    assert not listeners.still_listening("10.0.0.5", 21003, frozenset({51}), proc)  # gone


def session_dir(tmp_path: Path) -> Path:
    session = tmp_path / "session_2026-12-02_03-52-34_980013_15923"
    (session / "logs").mkdir(parents=True)
    (tmp_path / "session_latest").symlink_to(session)
    return session


def test_the_gcs_port_is_the_one_ray_announces(tmp_path: Path) -> None:
    assert rayports.gcs_port(tmp_path) is None
    session = session_dir(tmp_path)
    (session / "gcs_server_port_aaa745f6").write_text("41089")
    assert rayports.gcs_port(tmp_path) == 41089


def test_the_ports_ray_bound_and_its_node_id_are_read_as_ray_260_tells_them(
    tmp_path: Path,
) -> None:
    """Lines as Ray 2.60 wrote them on the testbed (raylet.out, dashboard.log)."""
    assert rayports.node_id(tmp_path) is None and rayports.dashboard_port(tmp_path) is None
    session = session_dir(tmp_path)
    node = "c355a8d714cd10bd0189fc6a1f6e4448101db73c937695a0a6da2d50"
    (session / f"metrics_agent_port_{node}").write_text("33077")
    (session / "logs" / "raylet.out").write_text(
        "[2026-12-06 11:31:29,101 I 10947 10947] (raylet) grpc_server.cc:144: ObjectManager "
        "server started, listening on port 44495.\n"
        "[2026-12-06 11:31:29,106 I 10947 10947] (raylet) grpc_server.cc:144: NodeManager "
        "server started, listening on port 40059.\n"
    )
    (session / "logs" / "dashboard.log").write_text(
        "2026-12-06 11:31:27,512\tINFO http_server_head.py:498 -- Dashboard head http "
        "address: 127.0.0.2:36393\n"
    )
    assert rayports.node_id(tmp_path) == node
    assert rayports.raylet_ports(tmp_path) == {"node_manager": 40059, "object_manager": 44495}
    assert rayports.dashboard_port(tmp_path) == 36393


# ------------------------------------------------------------------ blocks and claims


def test_hash_jobid_blocks_are_derived_from_the_job_id() -> None:
    size, port_range = 22, (20000, 20219)  # ten slots
    first = int(hashlib.sha256(b"4711").hexdigest(), 16) % 10
    order = portblock.derived_starts("4711", size, port_range, [])
    assert order[:3] == [20000 + ((first + i) % 10) * size for i in range(3)]
    assert sorted(order) == list(range(20000, 20220, size))  # every slot, in the job's order
    assert portblock.derived_starts("4711", size, port_range, []) == order  # deterministic
    assert portblock.derived_starts("4712", size, port_range, []) != order
    taken = [{"start": order[0], "size": size, "uid": os.getuid()}]
    assert portblock.derived_starts("4711", size, port_range, taken)[0] == order[1]
    low, _high = portblock.ephemeral_port_range()
    assert portblock.derived_starts("4711", size, (low, low + 10 * size - 1), []) == []


def test_hash_jobid_moves_to_the_next_derived_block_when_one_is_taken(tmp_path: Path) -> None:
    size, port_range = 22, (30000, 30219)
    order = portblock.derived_starts("4711", size, port_range, [])
    block = portblock.claim_port_block(
        size, strategy="hash_jobid", port_range=port_range, fixed_base=None,
        lock_dir=tmp_path, job="4711",
    )  # fmt: skip
    assert block.start == order[0]
    block.release()
    with socket.socket() as squatter:
        squatter.bind(("", order[0] + 3))
        squatter.listen()
        moved = portblock.claim_port_block(
            size, strategy="hash_jobid", port_range=port_range, fixed_base=None,
            lock_dir=tmp_path, job="4711",
        )  # fmt: skip
    assert moved.start == order[1]
    moved.release()
    again = portblock.claim_port_block(
        size, strategy="hash_jobid", port_range=port_range, fixed_base=None,
        lock_dir=tmp_path, job="4711", avoid=((order[0], size),),
    )  # fmt: skip
    assert again.start == order[1]  # a block given up: the next derived one
    again.release()


def test_a_claim_others_can_read_holds_no_exact_port_until_published(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    os.chmod(shared, 0o755)
    block = portblock.claim_port_block(
        22, strategy="random", port_range=(30000, 31999), fixed_base=None,
        lock_dir=shared, job="j",
    )  # fmt: skip
    (window,) = claims(str(shared))
    assert window["start"] <= block.start and block.start + 22 <= window["start"] + window["size"]
    assert window["size"] > 22  # a window around the block, not the block
    block.publish()
    (exact,) = claims(str(shared))
    assert (exact["start"], exact["size"]) == (block.start, 22)
    block.release()
    assert claims(str(shared)) == []

    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    block = portblock.claim_port_block(
        22, strategy="random", port_range=(30000, 31999), fixed_base=None,
        lock_dir=private, job="j",
    )  # fmt: skip
    assert [(c["start"], c["size"]) for c in claims(str(private))] == [(block.start, 22)]
    block.release()
    predictable = portblock.claim_port_block(
        22, strategy="hash_jobid", port_range=(30000, 31999), fixed_base=None,
        lock_dir=shared, job="4711",
    )  # fmt: skip
    assert [(c["start"], c["size"]) for c in claims(str(shared))] == [(predictable.start, 22)]
    predictable.release()


def test_the_token_is_renewed_in_place(tmp_path: Path) -> None:
    token = tmp_path / "ray_token"
    token.write_text("old\n")
    os.chmod(token, 0o600)
    jsr_base.renew_token(token)
    new = token.read_text()
    assert new.strip() and new.strip() != "old" and new.endswith("\n")
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["ray_token"]  # no temp file left


# ------------------------------------------------------------------ clients


CONNECTION = {
    "head_ip": "10.0.0.1",
    "client_port": 21002,
    "dashboard_port": 21003,
    "gcs_address": "10.0.0.1:41089",
    "ray_version": "2.60.0",
    "python_version": "3.11.2",
    "node_count": 1,
}


def test_clients_refuse_a_connection_json_that_names_unverified_ports() -> None:
    verified = {"uid": 1001, "listeners": {"gcs": 41089, "client": 21002, "dashboard": 21003}}
    info = ConnectionInfo.from_json(json.dumps({**CONNECTION, "verified": verified}))
    assert (info.client_port, info.dashboard_port) == (21002, 21003)
    other = {"uid": 1001, "listeners": {"client": 21002, "dashboard": 22003}}
    for bad in ({}, {"verified": None}, {"verified": {"listeners": []}}, {"verified": other}):
        with pytest.raises(ConnectError, match="were verified as the cluster's own Ray"):
            ConnectionInfo.from_json(json.dumps({**CONNECTION, **bad}))


def test_a_lost_blocks_ports_are_told_in_runs() -> None:
    ports = [21005, 21006, 21007, 21008, 21010]
    names = ["dashboard_metrics", "worker", "worker", "worker", "worker"]
    assert jsr_base.port_list(ports, names) == (
        "21005 (dashboard_metrics), 21006-21008 (worker), 21010 (worker)"
    )


def test_the_bootstrap_takes_the_three_port_strategies(tmp_path: Path) -> None:
    settings = tmp_path / "bootstrap.json"
    for strategy in ("random", "fixed", "hash_jobid"):
        settings.write_text(
            json.dumps({"cluster_id": "c", "port_strategy": strategy, "fixed_port_base": 30000})
        )
        assert jsr_base.Config.load(settings).port_strategy == strategy
    settings.write_text(json.dumps({"cluster_id": "c", "port_strategy": "sequential"}))
    with pytest.raises(jsr_base.BootstrapError, match="random, fixed or hash_jobid"):
        jsr_base.Config.load(settings)
