"""A neighbour who races for ports after the start gets nothing either.

bob, in a compute node's namespace, takes every port of alice's running cluster on that node
as soon as nothing of hers listens there any more (``squatter.py freed:``): the ports of a
raylet that was SIGKILLed (as the OOM killer, a crash or Slurm's kill would), of every worker
process that ended. Ray's channels are mutual TLS with the cluster's own CA (``tls``), so
whatever connects to bob's listener sends a TLS ClientHello and nothing else; what bob got,
tried as a token, opens nothing. Every port is the kernel's choice (``port_strategy
kernel``), so he cannot drain a range either; Ray Client's per-client servers take no port
from the range every user shares. Real jobs on the testbed as alice, bob as bob.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from .helpers.bootstrap import (
    DEFAULT_SETUP,
    JobDir,
    cancel_and_check_cleanup,
    cancel_leftovers,
    log,
    run_as_user,
    run_ray_client,
    user_uid,
    wait_until_gone,
    write_as_user,
)
from .helpers.clusters import client_tls_environment
from .helpers.faults import record_figure
from .helpers.neighbour import Bob, Tokens, assert_no_token_reached
from .helpers.paths import VENV_PYTHON

# One worker runs these one after the other (each plays bob on nodes 1-3); beside the other
# groups' bob: this bob takes only ports the test lists (the kernel's, none of a range another
# test watches) or the range 23000-23999 that no cluster uses any more.
pytestmark = pytest.mark.xdist_group("neighbour-after-start")

TLS_HANDSHAKE = b"\x16\x03"  # a TLS record of type handshake: the ClientHello
LISTEN = "0A"
DRAIN_SECONDS = 180.0  # three minutes


@pytest.fixture
def jobs(testbed) -> Iterator[list[JobDir]]:
    created: list[JobDir] = []
    yield created
    cancel_leftovers(created)


@pytest.fixture
def bobs(testbed) -> Iterator[list[Bob]]:
    started: list[Bob] = []
    yield started
    for bob in started:
        bob.leave()


# ----------------------------------------------------------------------------- alice's ports
def ray_pids(temp_dir: str, uid: int | None = None) -> list[int]:
    """The Ray processes of the node whose temp dir this is: their environment names its
    certificate (root reads it; nobody else's process does). ``uid``: only its processes are
    read."""
    marker = f"={temp_dir}/tls/".encode()
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if uid is not None and os.stat(f"/proc/{name}").st_uid != uid:
                    continue
                environment = Path(f"/proc/{name}/environ").read_bytes()
            except OSError:
                continue
            if marker in environment:
                found.append(int(name))
    return found


def listening_ports(pids: list[int]) -> set[int]:
    """The TCP ports these processes (of one node: one network namespace) listen on: their
    sockets, found in their namespace's tables, read once (a read walks every socket of the
    host: milliseconds of CPU)."""
    inodes: set[int] = set()
    for pid in pids:
        try:
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            continue
        inodes |= {int(link[8:-1]) for link in links if link.startswith("socket:[")}
    ports: set[int] = set()
    for pid in pids:
        try:
            rows = [*Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]]
            rows += Path(f"/proc/{pid}/net/tcp6").read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            words = row.split()
            if len(words) > 9 and words[3] == LISTEN and int(words[9]) in inodes:
                ports.add(int(words[1].rsplit(":", 1)[1], 16))
        return ports  # one live process's view of the namespace is every one's
    return ports


def process_named(pids: list[int], name: str) -> int:
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == name:
                return pid
        except OSError:
            continue
    raise AssertionError(f"no {name} among {pids}")


class PortList:
    """The listening ports of a node's Ray, every one seen so far, in a file bob reads (the
    test tells bob which ports are the cluster's: alice's other clusters are not his target).
    The node's Ray processes are looked for every second, their listeners every 0.1 s."""

    def __init__(self, temp_dir: str) -> None:
        self.temp_dir = temp_dir
        self.uid = user_uid()
        self.dir = Path(tempfile.mkdtemp(prefix="jsr-ports-", dir="/tmp"))
        self.dir.chmod(0o755)
        self.path = self.dir / "ports"
        self.ports: set[int] = set()
        self.pids: list[int] = []
        self.running = True
        self.write(find=True)
        self.thread = threading.Thread(target=self.keep, daemon=True)
        self.thread.start()

    def write(self, find: bool) -> None:
        if find:
            self.pids = ray_pids(self.temp_dir, self.uid)
        self.ports |= listening_ports(self.pids)
        tmp = self.dir / ".ports"
        tmp.write_text(" ".join(map(str, sorted(self.ports))))
        tmp.chmod(0o644)
        tmp.replace(self.path)

    def keep(self) -> None:
        turn = 0
        while self.running:
            self.write(find=turn % 10 == 0)
            turn += 1
            time.sleep(0.1)

    def stop(self) -> None:
        self.running = False
        self.thread.join(5)
        for path in (self.path, self.dir / ".ports"):
            path.unlink(missing_ok=True)
        self.dir.rmdir()


# ----------------------------------------------------------------------------- what bob got
def printable_runs(data: bytes, least: int = 16) -> list[str]:
    return [run.decode() for run in re.findall(rb"[\x21-\x7e]{%d,}" % least, data)]


def assert_only_handshakes(bob: Bob) -> None:
    """Every connection bob accepted began with a TLS handshake record (no plain request)."""
    for name, data in bob.received().items():
        assert data.startswith(TLS_HANDSHAKE), f"{name}: {data[:200]!r}"


def assert_what_bob_got_opens_nothing(bob: Bob, connection: dict) -> int:
    """Each printable run of what bob received, tried as the cluster's token at Ray's own
    dashboard port: refused every time. Returns how many were tried."""
    url = f"http://{connection['head_ip']}:{connection['ports']['dashboard']}/api/v0/nodes"
    candidates = {run for data in bob.received().values() for run in printable_runs(data)}
    for candidate in sorted(candidates)[:50]:
        answer = requests.get(
            url, headers={"X-Ray-Authorization": f"Bearer {candidate}"}, timeout=5
        )
        assert answer.status_code in (401, 403), candidate
    return len(candidates)


def worker_temp_dir(job: JobDir, host: str) -> str:
    starting = job.wait_for_event(
        lambda e: e["event"] == "worker_starting" and e.get("host") == host, 60
    )
    return str(starting["temp_dir"])


# ----------------------------------------------------------------------------- the tests
@pytest.mark.testbed
@pytest.mark.ray
@pytest.mark.parametrize("role", ["worker", "head"])
def test_a_dead_raylets_ports_taken_by_the_neighbour_get_no_byte_of_the_token(
    jobs: list[JobDir], bobs: list[Bob], role: str
) -> None:
    """alice's 2-node cluster runs; bob watches the node's Ray ports; its raylet is SIGKILLed
    and bob binds every port it freed within milliseconds. The head (or the workers, when it
    is the head's raylet) keeps calling the dead raylet's address: TLS handshakes, nothing
    more. A worker's loss is reported; the head's ends the cluster, and nothing is left."""
    job = JobDir.create(nodes=2, port_strategy="kernel")
    jobs.append(job)
    job.submit(extra_sbatch=["--nodelist=node1,node2"])
    connection = job.wait_ready()
    assert connection["tls"]
    node, host = (2, "node2") if role == "worker" else (1, "node1")
    temp_dir = worker_temp_dir(job, host) if role == "worker" else connection["temp_dir"]
    tokens = Tokens(job.path / "ray_token")
    ports = PortList(temp_dir)
    try:
        bobs.append(Bob(node=node, mode=f"freed:{ports.path}"))
        bob = bobs[0]
        time.sleep(1.0)  # bob saw them listening
        raylet = process_named(ray_pids(temp_dir), "raylet")
        killed_at = time.time()
        os.kill(raylet, signal.SIGKILL)
        if role == "worker":
            lost = job.wait_for_event(lambda e: e["event"] == "node_lost", 60)
            assert lost["hosts"] == [host], lost
        else:
            job.wait_for_event(
                lambda e: e["event"] in ("error", "stopped") and e["role"] == "head",
                60,
                fail_on_error=False,
            )
        time.sleep(8.0)  # what the cluster's processes send to the dead raylet's ports
    finally:
        ports.stop()
    taken = bob.squatted()
    accepted = [e for e in bob.log() if e["what"] == "accepted"]
    first = min((e["t"] for e in accepted), default=None)
    log(
        f"after the {role}'s raylet was killed: bob took {len(taken)} of its {len(ports.ports)} "
        f"ports, was connected to {len(accepted)} times"
        + (f", first {first - killed_at:.2f} s after the kill" if first else "")
    )
    assert taken, bob.log()  # the attack was real: he held the freed ports
    if role == "worker":  # the head calls a dead worker's raylet within a second (measured)
        assert accepted, bob.log()
    assert_no_token_reached(bob, tokens.stop())
    assert_only_handshakes(bob)
    tried = assert_what_bob_got_opens_nothing(bob, connection)
    if role == "worker":
        cancel_and_check_cleanup(job)
    else:
        wait_until_gone(job.job_id, 60)
    record_figure(
        f"another user takes every port of the {role}'s raylet after it was SIGKILLed",
        bob_ports=len(taken),
        bob_connections=len(accepted),
        first_connection_after_s=round(first - killed_at, 2) if first else None,
        bob_bytes=sum(map(len, bob.received().values())),
        token_pieces_at_bob=0,
        tried_as_token=tried,
    )


WORKER_CHURN = """
import json, sys, time
import ray
from jupyter_slurm_ray.client.connect import connect_ray_client

connect_ray_client(sys.argv[1], sys.argv[2], timeout=30)


@ray.remote(num_cpus=1, max_calls=1)  # each task in a new worker process, which then exits
def work(i):
    return i * 2


until = time.monotonic() + float(sys.argv[3])
done = failed = 0
while time.monotonic() < until:  # a worker started, ended, its port freed: every 1-2 s
    try:
        ray.get(work.remote(done), timeout=60)
        done += 1
    except Exception as exc:
        failed += 1
        print("failed:", repr(exc)[:300], file=sys.stderr, flush=True)
    time.sleep(1.0)
print(json.dumps({"done": done, "failed": failed}))
"""


@pytest.mark.testbed
@pytest.mark.ray
def test_the_neighbour_taking_every_freed_worker_port_for_three_minutes_starves_nothing(
    jobs: list[JobDir], bobs: list[Bob]
) -> None:
    """Each task runs in a worker process of its own that exits after it (``max_calls=1``),
    and bob takes its port the moment it is free, for three minutes. The workers' ports are
    the kernel's choice (no range to drain): every task keeps running, and the cluster is
    never degraded."""
    job = JobDir.create(nodes=1, port_strategy="kernel")
    jobs.append(job)
    job.submit(extra_sbatch=["--nodelist=node3"])
    connection = job.wait_ready()
    tokens = Tokens(job.path / "ray_token")
    ports = PortList(connection["temp_dir"])
    try:
        bobs.append(Bob(node=3, mode=f"freed:{ports.path}"))
        bob = bobs[0]
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        env.update(RAY_USAGE_STATS_ENABLED="0", **client_tls_environment(job.path))
        token = job.path / "ray_token"
        address = f"ray://{connection['head_ip']}:{connection['client_port']}"
        program = textwrap.dedent(WORKER_CHURN)
        argv = [str(VENV_PYTHON), "-c", program, address, str(token), str(DRAIN_SECONDS)]
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=DRAIN_SECONDS + 120, env=env, cwd="/tmp"
        )
    finally:
        ports.stop()
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    taken = bob.squatted()
    log(
        f"bob took {len(taken)} freed ports in {DRAIN_SECONDS:g} s; alice's tasks: "
        f"{result['done']} done, {result['failed']} batches failed"
    )
    assert result["failed"] == 0, done.stderr[-3000:]
    # a task a new worker process: 27 in the three minutes on a loaded CI machine
    assert result["done"] >= 15 and len(taken) >= 10, (result, len(taken))
    assert not [e for e in job.events() if e["event"] == "ports_taken"]
    assert_no_token_reached(bob, tokens.stop())
    cancel_and_check_cleanup(job)
    record_figure(
        f"another user takes every freed worker port of a node for {DRAIN_SECONDS:g} s",
        bob_ports=len(taken),
        tasks_done=result["done"],
        batches_failed=result["failed"],
    )


@pytest.mark.testbed
@pytest.mark.ray
def test_ray_client_connects_while_the_neighbour_holds_rays_shared_client_port_range(
    jobs: list[JobDir], bobs: list[Bob]
) -> None:
    """bob holds 127.0.0.1:23000-23999 (every port of Ray's own range for per-client
    servers) on the head's node: alice's Ray Client connects at its first attempt."""
    bobs.append(Bob(node=3, mode="hold", ports=tuple(range(23000, 24000))))
    job = JobDir.create(nodes=1, port_strategy="kernel")
    jobs.append(job)
    job.submit(extra_sbatch=["--nodelist=node3"])
    job.wait_ready()
    held = bobs[0].squatted()
    used = run_ray_client(job)
    assert used["hosts"] == ["node3"]
    said = job.head_log("ray_client_server.err")
    servers = [int(port) for port in re.findall(r"SpecificServer started on port: (\d+)", said)]
    log(f"bob held {len(held)} ports of 23000-23999; alice's client server on {servers}")
    assert len(held) >= 900  # the range, but ports another process had when bob began
    assert len(servers) == 1 and not 23000 <= servers[0] <= 23999  # the first attempt
    cancel_and_check_cleanup(job)


CONNECT_ONCE = """
import json, sys, time
import ray
started = time.monotonic()
ray.init(sys.argv[1], logging_level="ERROR")
print(json.dumps({"seconds": round(time.monotonic() - started, 2),
                  "nodes": len(ray.nodes())}))
"""


@pytest.mark.testbed
@pytest.mark.ray
def test_two_clusters_of_one_user_connect_at_once_on_one_node_at_the_first_attempt(
    jobs: list[JobDir],
) -> None:
    """Two of alice's clusters on one node, a Ray Client each, both at the same moment and
    with Ray's own ray.init (no retry): each proxier gives its client a port of its own."""
    pair = [JobDir.create(nodes=1, port_strategy="kernel") for _ in range(2)]
    jobs.extend(pair)
    for job in pair:
        job.submit(extra_sbatch=["--nodelist=node3"])
    connections = [job.wait_ready() for job in pair]
    clients = []
    for job, connection in zip(pair, connections, strict=True):
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        env.update(
            RAY_USAGE_STATS_ENABLED="0",
            RAY_AUTH_MODE="token",
            RAY_AUTH_TOKEN_PATH=str(job.path / "ray_token"),
            **client_tls_environment(job.path),
        )
        address = f"ray://{connection['head_ip']}:{connection['client_port']}"
        argv = [str(VENV_PYTHON), "-c", textwrap.dedent(CONNECT_ONCE), address]
        clients.append(
            subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd="/tmp"
            )
        )
    results = []
    for client in clients:
        out, err = client.communicate(timeout=120)
        assert client.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    log(f"two clusters on one node, connected at once: {results}")
    for job in pair:
        said = job.head_log("ray_client_server.err")
        assert len(re.findall(r"SpecificServer started on port", said)) == 1, said[-2000:]
        assert "Not sending client" not in said and "Server startup failed" not in said
    for job in pair:
        cancel_and_check_cleanup(job)


WORKER_JOB = """#!/bin/bash
#SBATCH --job-name=jsr-worker-job-test --nodes=1 --ntasks-per-node=1 --cpus-per-task=1
#SBATCH --time=10 --nodelist={node}
#SBATCH --chdir={job_dir} --output={job_dir}/slurm-%j.out --error={job_dir}/slurm-%j.err
{setup}
exec {python} {job_dir}/bootstrap workerjob {job_dir}
"""


@pytest.mark.testbed
@pytest.mark.ray
def test_a_worker_job_on_the_heads_node_joins_only_once_its_raylet_has(
    jobs: list[JobDir],
) -> None:
    """A worker job on the head's own node (same address): it says it joined only once the
    head sees its own Ray node id alive, and its loss is seen although the head's node, at
    the same address, stays."""
    job = JobDir.create(nodes=1, port_strategy="kernel")
    jobs.append(job)
    job.submit(extra_sbatch=["--nodelist=node2"])
    connection = job.wait_ready()
    script = WORKER_JOB.format(
        node="node2", job_dir=job.path, setup=DEFAULT_SETUP, python=VENV_PYTHON
    )
    write_as_user(job.path / "worker.sbatch", script, 0o700)
    worker_job = run_as_user("sbatch", "--parsable", str(job.path / "worker.sbatch"))
    worker = worker_job.stdout.strip().split(";")[0]
    try:
        joined = job.wait_for_event(
            lambda e: e["event"] == "worker_joined" and e.get("worker_job") == worker, 120
        )
        node_id = joined["node_id"]
        assert node_id and node_id != connection["head_node_id"]
        seen = [
            e for e in job.events()
            if e["event"] == "nodes" and e["role"] == "head" and node_id in e.get("node_ids", [])
        ]  # fmt: skip
        starting = next(
            e for e in job.events()
            if e["event"] == "worker_starting" and e.get("worker_job") == worker
        )  # fmt: skip
        assert seen and seen[0]["t"] <= joined["t"], (seen, joined)
        assert starting["ip"] == connection["head_ip"]  # the same address as the head's
        log(
            f"worker job on the head's node: joined {joined['t'] - starting['t']:.1f} s after "
            f"it started, {joined['t'] - seen[0]['t']:.2f} s after the head saw its node"
        )
        worker_raylet = process_named(ray_pids(starting["temp_dir"]), "raylet")
        os.kill(worker_raylet, signal.SIGKILL)
        lost = job.wait_for_event(lambda e: e["event"] == "node_lost", 60)
        assert lost["node_ids"] == [node_id] and lost["joined"] == 1, lost
    finally:
        run_as_user("scancel", worker, check=False)
    wait_until_gone(worker, 60)
    cancel_and_check_cleanup(job)
