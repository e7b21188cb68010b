"""The bootstrap directory: pure helpers here, then real Ray clusters on the Slurm testbed as alice.

The cluster tests submit their own small sbatch scripts (tests/bootstrap_helpers.py) and judge
only what a client can see: events.jsonl, connection.json, squeue, /proc, and a Ray Client
session in a subprocess.
"""

from __future__ import annotations

import ast
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from jupyter_slurm_ray.shipping import bootstrap_files

from .bootstrap_helpers import (
    BOOTSTRAP_DIR,
    DEFAULT_SETUP,
    JobDir,
    assert_cleaned_up,
    bootstrap_module,
    cancel_and_check_cleanup,
    cancel_leftovers,
    claims,
    in_node,
    job_state,
    log,
    processes_matching,
    python_listener,
    run_ray_client,
    scancel,
    wait_until_gone,
)

# the job's Python imports them top-level, from the shipped directory
jsr_base = bootstrap_module("jsr_base")
jsr_events = bootstrap_module("jsr_events")
portblock = bootstrap_module("portblock")
nodeaddr = bootstrap_module("nodeaddr")
rayargs = bootstrap_module("rayargs")
dashapi = bootstrap_module("dashapi")
workerstep = bootstrap_module("workerstep")
BootstrapError, Config = jsr_base.BootstrapError, jsr_base.Config

# ------------------------------------------------------------------------ pure helpers

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
        block.ports["gcs"] == block.start and block.ports["dashboard_metrics"] == block.start + 10
    )
    assert block.ports["min_worker"] == block.ports["max_worker"] == block.start + 11
    block.release()
    assert not list(lock_dir.glob("*.claim"))


def test_fixed_block_names_the_busy_port(tmp_path: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("", 0))
        listener.listen()
        busy = listener.getsockname()[1]
        with pytest.raises(
            BootstrapError, match=rf"port {busy} \(object_manager\) is already in use"
        ):
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


def test_address_parsing() -> None:
    ip_output = textwrap.dedent("""\
        1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever
        2: eth0    inet 10.200.0.12/24 brd 10.200.0.255 scope global eth0\\       valid_lft
        3: ib0    inet 192.168.7.4/16 scope global ib0
        """)
    assert nodeaddr.ipv4_addresses(ip_output) == ["10.200.0.12", "192.168.7.4"]
    config = "SlurmctldAddr           = (null)\nSlurmctldHost[0]        = vm(10.200.0.1)\n"
    assert nodeaddr.slurmctld_host(config) == "10.200.0.1"
    assert nodeaddr.slurmctld_host("SlurmctldHost[0] = ctl1\n") == "ctl1"
    assert nodeaddr.slurmctld_host("SlurmctldAddr = 10.9.9.9\nSlurmctldHost[0] = a(b)\n") == (
        "10.9.9.9"
    )
    assert nodeaddr.slurmctld_host("") is None
    assert nodeaddr.route_source_address("127.0.0.1") == "127.0.0.1"
    assert not nodeaddr.usable_address("127.0.1.1")


def test_node_address_sources() -> None:
    command = Config(cluster_id="c", node_ip_address_command="echo 10.1.2.3 second-word")
    assert nodeaddr.node_address(command, toward=None) == "10.1.2.3"
    loopback = Config(cluster_id="c", node_ip_address_command="echo 127.0.1.1")
    with pytest.raises(BootstrapError, match="no usable address"):
        nodeaddr.node_address(loopback, None)
    with pytest.raises(BootstrapError, match="network_interface nosuchif0"):
        nodeaddr.node_address(Config(cluster_id="c", network_interface="nosuchif0"), None)


def test_allocation_sizing() -> None:
    assert rayargs.allocated_cpus({"SLURM_CPUS_ON_NODE": "4", "SLURM_CPUS_PER_TASK": "2"}) == 4
    assert rayargs.allocated_cpus({"SLURM_CPUS_PER_TASK": "2"}) == 2
    assert rayargs.visible_gpus({"CUDA_VISIBLE_DEVICES": "0,1"}) == 2
    assert rayargs.visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == 0
    assert rayargs.visible_gpus({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}) == 0
    assert rayargs.visible_gpus({}) == 0
    assert workerstep.worker_step_cpus({"SLURM_JOB_CPUS_PER_NODE": "2(x3)"}) == 2
    assert workerstep.worker_step_cpus({"SLURM_JOB_CPUS_PER_NODE": "8,4(x2),6"}) == 4
    assert workerstep.worker_step_cpus({}) is None
    mib = 1024 * 1024
    assert rayargs.object_store_bytes(None, {"SLURM_MEM_PER_NODE": "1000"}, 2) == 300 * mib
    assert rayargs.object_store_bytes(None, {"SLURM_MEM_PER_CPU": "100"}, 2) == 80 * mib
    assert rayargs.object_store_bytes(None, {"SLURM_MEM_PER_NODE": "100000"}, 2) == 2048 * mib
    assert rayargs.object_store_bytes(123456789, {}, 2) == 123456789


def test_temp_dir_is_short_and_private() -> None:
    path = rayargs.node_temp_dir("4294967295", "a-very-long-compute-node-name-0001")
    try:
        assert len(str(path)) <= rayargs.MAX_TEMP_DIR
        assert path.parent == Path(f"/tmp/jsr-{os.getuid()}")
        assert path.parent.stat().st_mode & 0o777 == 0o700  # Ray makes `path` itself 0777
    finally:
        path.rmdir()


def test_ray_interpreter_from_shebang(tmp_path: Path) -> None:
    script = tmp_path / "ray"
    script.write_text("#!/opt/venv/bin/python3\nimport sys\n")
    assert rayargs.ray_interpreter(str(script)) == "/opt/venv/bin/python3"
    script.write_text("#!/bin/sh\n'''exec' /very/long/venv/bin/python3 \"$0\" \"$@\"\n' '''\n")
    assert rayargs.ray_interpreter(str(script)) == "/very/long/venv/bin/python3"
    script.write_text("#!/usr/bin/env python3\n")
    assert rayargs.ray_interpreter(str(script)) == __import__("shutil").which("python3")
    assert rayargs.ray_versions(str(Path(sys.executable).parent / "ray"))[0] == "2.60.0"


def test_node_rows_from_the_state_api() -> None:
    rows = [
        {"node_ip": "10.0.0.2", "state": "ALIVE", "resources_total": {"slurm_ray_node": 1}},
        {"node_ip": "10.0.0.1", "state": "ALIVE", "resources_total": {"slurm_ray_node": 1}},
        {"node_ip": "10.0.0.3", "state": "DEAD", "resources_total": {"slurm_ray_node": 1}},
        {"node_ip": "10.0.0.4", "state": "ALIVE", "resources_total": {"CPU": 1}},
    ]
    payload = {"result": True, "msg": "", "data": {"result": {"total": 4, "result": rows}}}
    assert dashapi.alive_slurm_nodes(dashapi.node_rows(payload)) == ["10.0.0.1", "10.0.0.2"]
    assert dashapi.node_rows({"data": None}) == []


def test_lease_watch_judges_content_changes(tmp_path: Path, monkeypatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(jsr_events.time, "monotonic", lambda: clock[0])
    (tmp_path / "lease").write_text("1")
    watch = jsr_events.LeaseWatch(tmp_path, idle_timeout=10)
    clock[0] += 9
    assert not watch.stale()
    (tmp_path / "lease").write_text("2")  # a change restarts the clock
    clock[0] += 9
    assert not watch.stale()  # seen at 1018
    clock[0] += 9
    assert not watch.stale()
    clock[0] += 2
    assert watch.stale()  # unchanged since 1018 for 11 s
    (tmp_path / "detached").touch()
    clock[0] += 20
    assert not watch.stale()


def test_help() -> None:
    done = subprocess.run(
        [sys.executable, str(BOOTSTRAP_DIR), "--help"], capture_output=True, text=True, check=True
    )
    assert "head" in done.stdout and "worker" in done.stdout and "events.jsonl" in done.stdout


def test_shipped_modules_are_stdlib_only_and_shadow_nothing() -> None:
    files = bootstrap_files()
    assert "__main__.py" in files and set(files) == {p.name for p in BOOTSTRAP_DIR.glob("*.py")}
    ours = {name.removesuffix(".py") for name in files}
    assert not ours & sys.stdlib_module_names  # the directory comes first on sys.path
    for name, text in files.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                tops = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{name}: a relative import fails in `python DIR`"
                tops = [(node.module or "").split(".")[0]]
            else:
                continue
            assert all(top in ours or top in sys.stdlib_module_names for top in tops), (name, tops)


# ------------------------------------------------------------ real clusters on the testbed


@pytest.fixture
def jobs(testbed) -> Iterator[list[JobDir]]:
    """Job dirs a test submits; whatever still runs afterwards is cancelled."""
    created: list[JobDir] = []
    yield created
    cancel_leftovers(created)


def log_ready_time(what: str, job: JobDir) -> None:
    ready = next(e for e in job.events() if e["event"] == "ready")
    queued = job.events()[0]["t"] - (time.time() - (time.monotonic() - job.submitted_at))
    log(f"{what}: job start -> ready {ready['elapsed']:.1f} s (queued {queued:.1f} s)")


def assert_ports_are_claimed_and_open(job: JobDir, connection: dict) -> None:
    ports = connection["ports"]
    mine = [c for c in claims() if c["job_id"] == job.job_id]
    assert len(mine) == connection["node_count"]
    head_claim = next(c for c in mine if c["host"] == connection["head_host"])
    assert head_claim["start"] == ports["gcs"]
    assert (
        head_claim["size"]
        == 11 + job.settings["worker_ports"]
        == ports["max_worker"] - ports["gcs"] + 1
    )
    for name in ("gcs", "client", "dashboard"):
        with socket.create_connection((connection["head_ip"], ports[name]), timeout=2):
            pass


def assert_dashboard_needs_the_token(connection: dict) -> None:
    url = f"http://{connection['head_ip']}:{connection['dashboard_port']}/api/v0/nodes"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with pytest.raises(urllib.error.HTTPError) as refused:
        opener.open(url, timeout=5)
    assert refused.value.code in (401, 403)


@pytest.mark.testbed
@pytest.mark.ray
def test_three_node_cluster(jobs: list[JobDir]) -> None:
    job = JobDir.create(nodes=3)
    jobs.append(job)
    job.submit(extra_sbatch=["--gres=gpu:1"])
    connection = job.wait_ready(90)
    log_ready_time("3 nodes", job)

    assert connection["node_count"] == 3
    assert sorted(n["host"] for n in connection["nodes"]) == ["node1", "node2", "node3"]
    assert connection["gcs_address"] == f"{connection['head_ip']}:{connection['ports']['gcs']}"
    assert (connection["ray_version"], connection["python_version"]) == ("2.60.0", "3.11.2")
    assert (job.path / "connection.json").stat().st_mode & 0o777 == 0o600
    assert_ports_are_claimed_and_open(job, connection)
    assert_dashboard_needs_the_token(connection)
    phases = [e["phase"] for e in job.events() if e["event"] == "phase"]
    assert phases == [
        "bootstrap", "ports", "head_starting", "workers_starting", "head_up",
        "waiting_for_nodes", "ready",
    ]  # fmt: skip

    used = run_ray_client(job)
    assert used["hosts"] == ["node1", "node2", "node3"]
    assert used["resources"]["GPU"] == 3 and used["resources"]["CPU"] == 3

    scancel(job.job_id, options=("--signal=USR1", "--batch"))
    job.wait_for_event(lambda e: e["event"] == "walltime_warning", 10)
    time.sleep(1)
    assert job_state(job.job_id) == "RUNNING"
    assert not [e for e in job.events() if e["event"] in ("stopping", "stopped")]

    log(f"3 nodes: scancel -> clean {cancel_and_check_cleanup(job):.1f} s")
    stopped = [e for e in job.events() if e["event"] == "worker_stopped"]
    assert sorted(e["host"] for e in stopped) == ["node2", "node3"]


@pytest.mark.testbed
@pytest.mark.ray
def test_two_clusters_share_a_node(jobs: list[JobDir]) -> None:
    pair = [JobDir.create(nodes=1, object_store_memory=None) for _ in range(2)]
    jobs.extend(pair)
    pair[0].submit(extra_sbatch=["--mem=1000"])
    node = pair[0].wait_started()["host"]  # whichever node is free on the shared testbed
    pair[1].submit(extra_sbatch=[f"--nodelist={node}", "--mem=1000"])
    connections = [job.wait_ready(90) for job in pair]
    for job in pair:
        log_ready_time("1 node (2 at once)", job)

    assert [c["head_host"] for c in connections] == [node, node]
    first, second = ({*c["ports"].values()} for c in connections)
    assert not first & second
    assert connections[0]["temp_dir"] != connections[1]["temp_dir"]
    for job, connection in zip(pair, connections, strict=True):
        assert_ports_are_claimed_and_open(job, connection)
    with ThreadPoolExecutor(2) as pool:  # two client subprocesses at once
        usage = list(pool.map(run_ray_client, pair))
    for used in usage:
        assert used["hosts"] == [node]
        assert used["resources"]["CPU"] == 1
        assert used["resources"]["object_store_memory"] == 300 * 1024 * 1024  # 30 % of 1000 MB
    for job in pair:
        cancel_and_check_cleanup(job)


@pytest.mark.testbed
@pytest.mark.ray
def test_stale_lease_stops_the_cluster_unless_detached(jobs: list[JobDir]) -> None:
    owned = JobDir.create(nodes=2, idle_timeout=8.0)
    detached = JobDir.create(nodes=1, idle_timeout=8.0)
    detached.detach()
    jobs.extend([owned, detached])
    for job in (owned, detached):
        job.submit()
    owned.wait_started()
    beat, started = 0, time.monotonic()
    while not [e for e in owned.events() if e["event"] == "ready"]:  # the owner is alive
        assert time.monotonic() - started < 90, owned.diagnostics()
        beat += 1
        owned.lease(f"{beat}\n")
        last_beat = time.monotonic()
        time.sleep(2)
    detached.wait_ready(60)
    detached_ready = time.monotonic()

    stale = owned.wait_for_event(lambda e: e["event"] == "lease_stale", 20)
    assert stale["idle_timeout"] == 8.0
    assert time.monotonic() - last_beat >= 8
    wait_until_gone(owned.job_id, 10)
    assert [e for e in owned.events() if e["event"] == "stopped"][-1]["reason"] == "lease_stale"
    assert_cleaned_up(owned)

    time.sleep(max(0.0, detached_ready + 12 - time.monotonic()))
    assert job_state(detached.job_id) == "RUNNING"
    assert not [e for e in detached.events() if e["event"] in ("lease_stale", "stopping")]
    cancel_and_check_cleanup(detached)


@pytest.mark.testbed
@pytest.mark.ray
def test_missing_ray_fails_fast(jobs: list[JobDir]) -> None:
    job = JobDir.create(nodes=1)
    jobs.append(job)
    job.submit(setup="export PATH=/usr/bin:/bin", python="/usr/bin/python3")
    error = job.wait_for_event(lambda e: e["event"] == "error", 15, fail_on_error=False)
    assert "`ray` command is not on PATH (/usr/bin:/bin)" in error["reason"]
    assert "ray[default]" in error["reason"]
    began = next(e for e in job.events() if e.get("phase") == "bootstrap")
    assert error["t"] - began["t"] < 5
    wait_until_gone(job.job_id, 10)
    assert job.events()[-1]["event"] == "stopped" and job.events()[-1]["exit_code"] == 1


@pytest.mark.testbed
@pytest.mark.ray
def test_fixed_port_in_use_fails_fast(jobs: list[JobDir]) -> None:
    busy = 24000 + os.getpid() % 2000
    listener = subprocess.Popen(
        in_node(1, *python_listener(busy)), stdout=subprocess.PIPE, text=True
    )
    try:
        assert listener.stdout is not None and listener.stdout.readline().strip() == "listening"
        job = JobDir.create(nodes=1, port_strategy="fixed", fixed_port_base=busy - 1)
        jobs.append(job)
        job.submit(extra_sbatch=["--nodelist=node1"])
        error = job.wait_for_event(lambda e: e["event"] == "error", 20, fail_on_error=False)
        assert f"port {busy} (node_manager) is already in use on node1" in error["reason"]
        wait_until_gone(job.job_id, 10)
    finally:
        listener.terminate()
        listener.wait(5)


@pytest.mark.testbed
@pytest.mark.ray
def test_a_worker_that_cannot_start_fails_the_cluster_fast(jobs: list[JobDir]) -> None:
    command = (
        'if [ "$(hostname)" = node2 ]; then echo nothing-here; exit 3; fi; '
        'ip -o -4 addr show scope global | awk \'{sub("/.*", "", $4); print $4; exit}\''
    )
    job = JobDir.create(nodes=2, node_ip_address_command=command)
    jobs.append(job)
    job.submit(extra_sbatch=["--nodelist=node1,node2"])
    error = job.wait_for_event(
        lambda e: e["event"] == "error" and e["role"] == "head", 30, fail_on_error=False
    )
    assert error["reason"].startswith("the worker on node2 failed: node_ip_address_command")
    began = next(e for e in job.events() if e.get("phase") == "bootstrap")
    assert error["t"] - began["t"] < 10
    wait_until_gone(job.job_id, 15)
    assert_cleaned_up(job)


def pids_of(marker: str, program: str) -> list[int]:
    return [pid for pid, cmd in processes_matching([marker]) if program in cmd.split(" ")[0]]


def nodes_event(joined: int, after: float) -> Callable[[dict], bool]:
    return lambda e: e["event"] == "nodes" and e["t"] >= after and e["joined"] == joined


@pytest.mark.testbed
@pytest.mark.ray
def test_each_lost_worker_and_a_dead_head_are_reported(jobs: list[JobDir]) -> None:
    job = JobDir.create(nodes=3)
    jobs.append(job)
    # a job submitted with a list of names: srun would pass on only those without --export=ALL
    probe = "JSR_SETUP_PROBE=from-the-batch-shell"
    job.submit(extra_sbatch=["--export=PATH,HOME,USER"], setup=f"{DEFAULT_SETUP}; export {probe}")
    connection = job.wait_ready(90)
    starts = {e["host"]: e for e in job.events() if e["event"] == "worker_starting"}  # last
    workers = [starts[host] for host in sorted(starts)]
    head = next(e for e in job.events() if e.get("phase") == "head_starting")
    everyone = sorted(n["host"] for n in connection["nodes"])
    for worker in workers:  # the environment the setup lines built reached the workers
        raylets = pids_of(worker["temp_dir"], "raylet")
        assert raylets and probe.encode() in Path(f"/proc/{raylets[0]}/environ").read_bytes()

    for left, worker in enumerate(workers, start=1):  # one loss, then a second one
        for pid in pids_of(worker["temp_dir"], "raylet"):  # this test's own cluster, by pid
            os.kill(pid, signal.SIGKILL)
        lost = job.wait_for_event(
            lambda e, host=worker["host"]: e["event"] == "node_lost" and e["hosts"] == [host], 45
        )
        assert lost["log"], lost
        assert lost["reason"] in (
            f"1 node(s) left the cluster: {worker['host']}",  # seen by the head's state API
            "the worker step (srun) exited with status 1: no Ray worker nodes left",  # the last
        )
        assert (lost["joined"], lost["wanted"]) == (3 - left, 3)
        alive = [h for h in everyone if h not in {w["host"] for w in workers[:left]}]
        # the head's state API may see the loss only after the worker step ended
        nodes = job.wait_for_event(nodes_event(joined=3 - left, after=lost["t"] - 1), 45)
        assert (nodes["joined"], nodes["wanted"], nodes["hosts"]) == (3 - left, 3, alive)
    assert len([e for e in job.events() if e["event"] == "node_lost"]) == 2
    assert job_state(job.job_id) == "RUNNING"

    for pid in pids_of(head["temp_dir"], "gcs_server"):
        os.kill(pid, signal.SIGKILL)
    error = job.wait_for_event(lambda e: e["event"] == "error", 30, fail_on_error=False)
    assert error["reason"].startswith("`ray start --head` exited with status")
    assert any("ray-head-" in line for line in error["log"])
    wait_until_gone(job.job_id, 15)
    assert_cleaned_up(job)
