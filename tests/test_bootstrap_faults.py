"""The bootstrap when things go wrong: a gone owner, an unsafe job dir, a hostile second user on
the node (lock dir, lock, claims, ports), a port taken between the probe and `ray start`.

Checks that need root and a second user first (run as root in the login namespace), then real
jobs on the testbed as alice with bob as the other user of the node. The checks that need
neither are in tests/fast/test_bootstrap_*.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .helpers.bootstrap import (
    BOOTSTRAP_DIR,
    DEFAULT_SETUP,
    JOBS_ROOT,
    NODE_NETNS,
    JobDir,
    bootstrap_module,
    cancel_and_check_cleanup,
    cancel_leftovers,
    claims,
    lease_json,
    log,
    run_as_user,
    user_uid,
    wait_until_gone,
    write_as_user,
)
from .helpers.clusters import processes_of
from .helpers.faults import record_figure
from .helpers.jobs import queue_state
from .helpers.paths import NODES_SEE
from .helpers.testbed import USER, node_ip

# One worker runs every test where bob squats ports or holds the nodes' shared port lock: two
# such tests at once would each see the other's bob.
pytestmark = pytest.mark.xdist_group("bob-squats-ports")

trust = bootstrap_module("trust")
portlock = bootstrap_module("portlock")
portblock = bootstrap_module("portblock")

SHARED = Path("/tmp/jupyter-slurm-ray-ports")
BOB = "bob"
NODE3_IP = node_ip(3)


# ------------------------------------------------------- checks as root, with bob


def test_job_dir_must_be_changeable_only_by_its_user_or_root(tmp_path: Path) -> None:
    bob = user_uid(BOB)
    job = tmp_path / "parent" / "job"
    job.mkdir(parents=True)
    assert trust.path_problem(job, 0) is None
    assert trust.path_problem(job, bob) is None  # root's dirs are fine for anyone
    os.chmod(job.parent, 0o775)
    assert trust.path_problem(job, 0) == f"{job.parent} is writable by group (mode 0775)"
    os.chmod(job.parent, 0o1777)  # root's sticky dir, like /tmp
    assert trust.path_problem(job, 0) is None
    os.chown(job.parent, bob, bob)
    assert trust.path_problem(job, 0) == (
        f"{job.parent} belongs to uid {bob}, not to this user (uid 0) or root"
    )
    os.chown(job.parent, 0, 0)
    os.chmod(job, 0o707)
    assert trust.path_problem(job, 0) == f"{job} is writable by others (mode 0707)"


def plant(directory: Path, name: str, content: object, owner: int = 0) -> Path:
    path = directory / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    os.chown(path, owner, owner)
    return path


@pytest.fixture
def bob_sleeper() -> Iterator[int]:
    """A live process of bob's (setpriv execs, so its pid is the sleeper's)."""
    bob = user_uid(BOB)
    sleeper = subprocess.Popen(
        ["setpriv", f"--reuid={bob}", f"--regid={bob}", "--init-groups", "sleep", "60"]
    )
    yield sleeper.pid
    sleeper.kill()
    sleeper.wait(5)


def test_only_believable_claims_count(tmp_path: Path, bob_sleeper: int) -> None:
    bob, me = user_uid(BOB), os.getpid()
    claim = {"start": 21000, "size": 27, "job_id": "j", "pid": me, "uid": 0}
    plant(tmp_path, "mine.claim", claim)
    plant(tmp_path, "stale-mine.claim", {**claim, "pid": 2**22 + 1})
    plant(tmp_path, "stale-bob.claim", {**claim, "pid": 2**22 + 1, "uid": bob}, bob)
    plant(tmp_path, "bob.claim", {**claim, "start": 22000, "pid": bob_sleeper, "uid": bob}, bob)
    plant(tmp_path, "bob-says-root.claim", {**claim, "start": 23000}, bob)  # file owner != uid
    plant(tmp_path, "bob-with-my-pid.claim", {**claim, "start": 24000, "uid": bob}, bob)
    plant(tmp_path, "garbage.claim", "{not json")
    plant(tmp_path, "list.claim", [1, 2])
    plant(tmp_path, "bool.claim", {**claim, "start": True})
    plant(tmp_path, "low.claim", {**claim, "start": 80})
    plant(tmp_path, "huge.claim", {**claim, "size": 60000})
    plant(tmp_path, "big.claim", "x" * 10_000_000)
    os.mkfifo(tmp_path / "fifo.claim")
    (tmp_path / "link.claim").symlink_to(tmp_path / "mine.claim")
    (tmp_path / "dir.claim").mkdir()
    found: list[list[dict]] = []
    reader = threading.Thread(target=lambda: found.append(portlock.live_claims(tmp_path)))
    reader.daemon = True  # should it block on the FIFO, the test fails instead of hanging
    reader.start()
    reader.join(30)
    assert not reader.is_alive(), "reading the claims blocked (on the FIFO, or the huge file)"
    (believed,) = found
    assert sorted(c["start"] for c in believed) == [21000, 22000]
    assert not (tmp_path / "stale-mine.claim").exists()  # only this user's stale claims go
    assert (tmp_path / "stale-bob.claim").exists()


def test_other_users_claims_cannot_block_the_range(tmp_path: Path, bob_sleeper: int) -> None:
    bob = user_uid(BOB)
    everything = {"start": 21000, "size": 200, "job_id": "b", "pid": bob_sleeper, "uid": bob}
    plant(tmp_path, "bob.claim", everything, bob)
    block = portblock.claim_port_block(
        27, strategy="random", port_range=(21000, 21199), fixed_base=None,
        lock_dir=tmp_path, job="mine",
    )  # fmt: skip
    assert 21000 <= block.start <= 21199 - 26  # the bind probe decided
    block.release()
    plant(tmp_path, "mine.claim", {**everything, "pid": os.getpid(), "uid": 0})
    with pytest.raises(portblock.BootstrapError, match="no free block of 27"):
        portblock.claim_port_block(
            27, strategy="random", port_range=(21000, 21199), fixed_base=None,
            lock_dir=tmp_path, job="mine",
        )  # fmt: skip


@pytest.fixture
def private_lock_dir() -> Iterator[Path]:
    """This user's private lock dir, removed afterwards if the test made it."""
    path = Path(f"/tmp/jsr-{os.getuid()}/ports")
    existed = path.exists()
    yield path
    if not existed:
        shutil.rmtree(path, ignore_errors=True)


def test_lock_dir_choice(tmp_path: Path, monkeypatch, private_lock_dir: Path) -> None:
    reasons: list[str] = []
    shared = tmp_path / "shared"
    monkeypatch.setattr(portlock, "SHARED_LOCK_DIR", shared)
    private = private_lock_dir
    assert portlock.lock_dir_for(None, reasons.append) == private  # no site dir
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)
    assert portlock.lock_dir_for(None, reasons.append) == private  # not sticky
    os.chmod(shared, 0o1777)
    assert portlock.lock_dir_for(None, reasons.append) == shared  # root's, sticky
    os.chown(shared, user_uid(BOB), user_uid(BOB))
    assert portlock.lock_dir_for(None, reasons.append) == private  # someone else's
    assert oct(private.stat().st_mode & 0o7777) == oct(0o700)
    assert reasons == []
    (tmp_path / "link").symlink_to(shared)
    assert portlock.lock_dir_for(tmp_path / "link", reasons.append) == private
    assert reasons == [
        f"the configured lock_dir cannot be used: {tmp_path}/link is a symlink; using a private one"
    ]
    assert portlock.lock_dir_for(str(shared), reasons.append) == shared  # configured: as it is


# ------------------------------------------------------------ real jobs on the testbed


@pytest.fixture
def jobs(testbed) -> Iterator[list[JobDir]]:
    """Job dirs a test submits; whatever still runs afterwards is cancelled."""
    created: list[JobDir] = []
    yield created
    cancel_leftovers(created)


def wait_gone_watching(job: JobDir, timeout: float) -> list[int]:
    """Wait until the job left the queue; the cluster's processes seen meanwhile."""
    seen: set[int] = set()
    started = time.monotonic()
    while queue_state(job.job_id):
        seen.update(processes_of(str(job.path)))
        assert time.monotonic() - started < timeout, job.diagnostics()
        time.sleep(0.2)
    return sorted(seen)


def assert_nothing_started(job: JobDir) -> None:
    names = [e.get("phase") or e["event"] for e in job.events()]
    assert not {"ports", "head_starting", "workers_starting"} & set(names), names
    assert not list(job.path.glob("logs/ray-*.log"))
    assert not [c for c in claims() if c.get("job_id") == job.job_id]


def lease_written(job: JobDir, t: float) -> None:
    """The lease file as the filesystem saw it written at t (by its own clock)."""
    run_as_user("touch", "-d", f"@{t:.3f}", str(job.path / "lease"))


def slurm_elapsed(job_id: str) -> int | None:
    """Seconds Slurm counts from the job's start to its end (sacct, whole seconds)."""
    done = run_as_user("sacct", "-j", job_id, "-X", "-n", "-P", "-o", "ElapsedRaw", check=False)
    words = done.stdout.split()
    return int(words[0]) if words and words[0].isdigit() else None


@pytest.mark.testbed
@pytest.mark.ray
def test_a_job_whose_owner_is_gone_never_starts_ray(jobs: list[JobDir]) -> None:
    left_long_ago = JobDir.create(nodes=2, owner_timeout=300.0)
    renewed = time.time() - 3 * 3600 - 725
    left_long_ago.lease(lease_json(renewed, seq=812, renew_every=2.0))
    lease_written(left_long_ago, renewed + 0.01)
    old_format = JobDir.create(nodes=1, owner_timeout=8.0)
    old_format.lease("4242 17\n")  # no time in it: 7 s without a change tell
    jobs += [left_long_ago, old_format]
    started_file = "script-started"  # the job script's first act, before its setup lines
    for job in jobs:
        job.submit(setup=f'date +%s.%N > "$PWD/{started_file}"\n{DEFAULT_SETUP}')
    figures = {}
    for job in jobs:
        job.wait_started()
        assert wait_gone_watching(job, 30) == []
        gone_at = time.time()
        began, stopped = job.events()[0], job.events()[-1]
        assert (stopped["event"], stopped["reason"], stopped["exit_code"]) == (
            "stopped", "owner_gone", 0,
        )  # fmt: skip
        script = float((job.path / started_file).read_text())
        figures[job.job_id] = {
            "script_start_to_job_gone_s": round(gone_at - script, 2),
            "script_start_to_bootstrap_s": round(began["t"] - script, 2),
            "bootstrap_first_to_last_event_s": round(stopped["t"] - began["t"], 2),
            "slurm_elapsed_s": slurm_elapsed(job.job_id),
        }
        log(f"owner gone: job {job.job_id} {figures[job.job_id]}")
        assert_nothing_started(job)
        assert job.path.joinpath(f"slurm-{job.job_id}.err").read_text().count("Traceback") == 0
    gone = next(e for e in left_long_ago.events() if e["event"] == "owner_gone")
    assert 3 * 3600 + 725 <= gone["lease_age"] < 3 * 3600 + 800  # plus the time in the queue
    assert 3 * 3600 + 724 <= gone["lease_file_age"] < 3 * 3600 + 800  # the filesystem agrees
    assert re.fullmatch(
        r"the owner's lease was last renewed 3:1[2-3]:\d\d ago \(owner_timeout 300 s\): "
        r"the owner is gone, Ray was not started",
        gone["reason"],
    ), gone["reason"]
    assert gone["waited"] == 0  # both clocks said so: no waiting for a change
    gone = next(e for e in old_format.events() if e["event"] == "owner_gone")
    assert gone["lease_age"] is None and "has no renewal time" in gone["reason"]
    assert gone["waited"] > 0  # no time in the lease: only the lack of a change tells
    record_figure(
        "kernel gone long before the job started (bootstrap test)",
        lease_with_time=figures[left_long_ago.job_id],
        lease_without_time=figures[old_format.job_id],
    )


@pytest.fixture
def unsafe_parents(testbed) -> Iterator[list[Path]]:
    made: list[Path] = []
    yield made
    for path in made:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.testbed
def test_a_job_dir_others_could_change_is_refused(
    jobs: list[JobDir], unsafe_parents: list[Path]
) -> None:
    group_writable = JOBS_ROOT / f"shared-{os.getpid()}"
    run_as_user("sh", "-c", 'mkdir -p "$1" && chmod 0775 "$1"', "sh", str(group_writable))
    bobs = Path(f"{NODES_SEE}/jsr-test-bob-{os.getpid()}")
    bobs.mkdir(mode=0o777)
    os.chmod(bobs, 0o777)
    os.chown(bobs, user_uid(BOB), user_uid(BOB))
    unsafe_parents += [group_writable, bobs]
    cases = {
        group_writable: "is writable by group (mode 0775)",
        bobs: f"belongs to uid {user_uid(BOB)}",
    }
    for parent in cases:
        jobs.append(JobDir.create(nodes=2, parent=parent))
        jobs[-1].submit()
    for (parent, problem), job in zip(cases.items(), jobs, strict=True):
        error = job.wait_for_event(lambda e: e["event"] == "error", 20, fail_on_error=False)
        assert error["reason"].startswith(f"the job dir {job.path} is not safe to run from: ")
        assert f"{parent} {problem}" in error["reason"]
        wait_until_gone(job.job_id, 10)
        assert job.events()[-1]["event"] == "stopped" and job.events()[-1]["exit_code"] == 1
        assert_nothing_started(job)


SABOTEUR = """
import fcntl, json, os, socket, sys, time
lock_dir, make, port, host, alice, low = sys.argv[1:7]
if make == "make":
    os.mkdir(lock_dir)
    os.chmod(lock_dir, 0o777)
fd = os.open(os.path.join(lock_dir, "lock"), os.O_RDONLY | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)  # and never let go
def plant(name, content):
    with open(os.path.join(lock_dir, name), "w") as handle:
        handle.write(content if isinstance(content, str) else json.dumps(content))
claim = {"start": int(low), "size": 10011, "job_id": "bob", "pid": os.getpid(), "uid": os.getuid()}
plant("bob.claim", claim)  # believable and live: it covers alice's whole range
plant("alice.claim", {**claim, "uid": int(alice), "pid": 1})  # bob's file, alice's uid
plant("garbage.claim", "{not json")
plant("list.claim", [1, 2])
plant("low.claim", {**claim, "start": 80})
plant("huge.claim", {**claim, "size": 65000})
os.mkfifo(os.path.join(lock_dir, "fifo.claim"))
os.symlink("/etc/shadow", os.path.join(lock_dir, "link.claim"))
listener = socket.socket()
listener.bind((host, int(port)))
listener.listen()
print("ready", flush=True)
time.sleep(600)
"""


class Bob:
    """bob, on node3: a lock dir, a lock he holds, bogus claims, a port in alice's range."""

    def __init__(self, make_dir: bool, low: int, port: int, lock_dir: Path = SHARED) -> None:
        bob = user_uid(BOB)
        argv = [
            "nsenter", f"--net={NODE_NETNS.format(3)}",
            "setpriv", f"--reuid={bob}", f"--regid={bob}", "--init-groups",
            "/usr/bin/python3", "-c", SABOTEUR, str(lock_dir), "make" if make_dir else "no",
            str(port), NODE3_IP, str(user_uid()), str(low),
        ]  # fmt: skip
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd="/tmp")
        assert self.process.stdout is not None
        assert self.process.stdout.readline().strip() == "ready"

    def leave(self) -> None:
        self.process.terminate()
        self.process.wait(5)


@pytest.fixture
def hostile_node(testbed) -> Iterator[list[Bob]]:
    """No shared lock dir before (a leftover of older code is removed) and none after."""
    shutil.rmtree(SHARED, ignore_errors=True)
    started: list[Bob] = []
    yield started
    for bob in started:
        if bob.process.poll() is None:
            bob.leave()
    shutil.rmtree(SHARED, ignore_errors=True)


BLOCK = len(portblock.PORT_NAMES) + 16  # the ports of a block of these tests' jobs


def narrow_range() -> tuple[int, int]:
    """Three blocks, below the other tests' 17000-32000."""
    low = 11000 + (os.getpid() % 170) * BLOCK
    return low, low + 3 * BLOCK - 1


def block_ports(connection: dict) -> set[int]:
    """The ports of the head's block (the GCS's port is kernel-assigned, outside it)."""
    return {port for name, port in connection["ports"].items() if name != "gcs"}


@pytest.mark.testbed
@pytest.mark.ray
def test_a_hostile_user_cannot_block_nor_hijack_the_ports(
    jobs: list[JobDir], hostile_node: list[Bob]
) -> None:
    low, high = narrow_range()
    taken = low + BLOCK + 8  # in the middle block
    hostile_node.append(Bob(make_dir=True, low=low, port=taken))
    job = JobDir.create(nodes=1, port_range=[low, high])
    jobs.append(job)
    job.submit(extra_sbatch=["--nodelist=node3"])
    connection = job.wait_ready()

    ports = block_ports(connection)
    assert taken not in ports and low <= min(ports) and max(ports) <= high
    assert connection["head_host"] == "node3"
    assert not [e for e in job.events() if e["event"] in ("port_lock_unavailable", "ports_retry")]
    mine = [c for c in claims() if c.get("job_id") == job.job_id]  # in alice's own lock dir
    assert [c["start"] for c in mine] == [connection["ports"]["node_manager"]]
    assert SHARED.stat().st_uid == user_uid(BOB)
    assert not [p for p in SHARED.iterdir() if p.owner() == "alice"]  # alice wrote nothing there
    cancel_and_check_cleanup(job)


@pytest.fixture
def site_lock_dir() -> Iterator[Path]:
    """A site's shared lock dir (root's, sticky), set as the clusters' ``port_lock_dir``.

    Not the default path (SHARED): every cluster on the testbed would take a root-owned sticky
    dir there as the site's (test_lock_dir_choice) and wait for bob's lock, the other tests'
    too (seen: another module's claims missing from alice's private lock dir)."""
    path = Path(tempfile.mkdtemp(prefix="jsr-site-ports-", dir=NODES_SEE))
    os.chmod(path, 0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.testbed
@pytest.mark.ray
def test_a_held_lock_in_the_sites_shared_dir_costs_a_bounded_wait(
    jobs: list[JobDir], hostile_node: list[Bob], site_lock_dir: Path
) -> None:
    low, high = narrow_range()
    shared = site_lock_dir
    hostile_node.append(Bob(make_dir=False, low=low, port=low + BLOCK + 8, lock_dir=shared))
    job = JobDir.create(nodes=1, port_range=[low, high], lock_dir=str(shared))
    jobs.append(job)
    job.submit(extra_sbatch=["--nodelist=node3"])
    unavailable = job.wait_for_event(lambda e: e["event"] == "port_lock_unavailable", 60)
    assert unavailable["reason"] == (
        f"the port lock {shared}/lock stayed locked for 10 s by pid {hostile_node[0].process.pid} "
        f"(uid {user_uid(BOB)}); going on without it (every port is still probed)"
    )
    waited = unavailable["t"] - job.events()[0]["t"]
    log(f"held shared lock: waited {waited:.1f} s")
    assert 10 <= waited < 30  # bounded: the lock's 10 s, and a busy node's delay
    ports = job.wait_for_event(lambda e: e.get("phase") == "ports", 10)["ports"]
    (window,) = [c for c in claims(str(shared)) if c.get("job_id") == job.job_id]
    start = ports["node_manager"]  # others see a claim around the block, not the block
    assert window["start"] <= start and start + BLOCK <= window["start"] + window["size"]
    assert window["size"] > BLOCK or (window["start"], window["size"]) == (low, high - low + 1)

    connection = job.wait_ready()
    hostile_node[0].leave()  # only now: until the ports are final, bob's port must stay taken
    ports = block_ports(connection)
    assert low + BLOCK + 8 not in ports and low <= min(ports) and max(ports) <= high
    mine = [c for c in claims(str(shared)) if c.get("job_id") == job.job_id]
    assert [(c["start"], c["size"]) for c in mine] == [(start, BLOCK)]  # Ray bound its ports
    claim_file = next(shared.glob(f"{start}-*.claim"))
    assert claim_file.owner() == "alice" and claim_file.stat().st_mode & 0o777 == 0o644
    cancel_and_check_cleanup(job, str(shared))
    assert not claim_file.exists()


HEAD_PORT_THIEF = """
import runpy, socket, sys
job_dir = sys.argv[1]
sys.path.insert(0, job_dir + "/bootstrap")
sys.dont_write_bytecode = True
import portblock
claim = portblock.claim_port_block
taken = []
def claim_then_lose_the_gcs_port(*args, **kwargs):
    block = claim(*args, **kwargs)
    if not taken:  # someone binds the first block's GCS port right after the probe
        thief = socket.socket()
        thief.bind(("", block.start))
        taken.append(thief)
    return block
portblock.claim_port_block = claim_then_lose_the_gcs_port
sys.argv = ["bootstrap", "head", job_dir]
runpy.run_path(job_dir + "/bootstrap", run_name="__main__")
"""

WORKER_PORT_THIEF = """
import json, socket, sys, time
events, deadline = sys.argv[1], time.time() + 240
while time.time() < deadline:
    found = []
    try:
        with open(events) as handle:
            for line in handle:
                try:
                    found.append(json.loads(line))
                except ValueError:
                    pass
    except OSError:
        pass
    heads = [e["t"] for e in found if e.get("phase") == "ports" and e["role"] == "head"]
    for event in found:  # the worker's block, once it joins the head's second block
        if len(heads) > 1 and event["event"] == "worker_starting" and event["t"] > heads[1]:
            thief = socket.socket()
            thief.bind(("", event["ports"]["node_manager"]))
            thief.listen()
            print(event["ports"]["node_manager"], flush=True)
            sys.stdin.read()
            sys.exit()
    time.sleep(0.02)
"""


@pytest.mark.testbed
@pytest.mark.ray
def test_a_port_taken_after_the_probe_moves_the_node_to_another_block(
    jobs: list[JobDir],
) -> None:
    job = JobDir.create(nodes=2)
    jobs.append(job)
    write_as_user(job.path / "thief.py", HEAD_PORT_THIEF, 0o600)
    worker_thief = subprocess.Popen(
        ["nsenter", f"--net={NODE_NETNS.format(2)}", sys.executable, "-c", WORKER_PORT_THIEF,
         str(job.path / "events.jsonl")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        job.submit(extra_sbatch=["--nodelist=node1,node2"], head=f"{job.path}/thief.py {job.path}")
        connection = job.wait_ready()
        assert worker_thief.stdout is not None
        stolen = int(worker_thief.stdout.readline())
        log_retries(job)
        retries = [e for e in job.events() if e["event"] == "ports_retry"]
        heads = [e for e in job.events() if e.get("phase") == "ports" and e["role"] == "head"]
        firsts = [e["ports"]["node_manager"] for e in heads]
        assert [(e["role"], e["ports"], e["port_names"], e["attempt"]) for e in retries] == [
            ("head", [firsts[0]], ["node_manager"], 2),
            ("worker", [stolen], ["node_manager"], 2),
        ]
        log(f"port retry reasons: {[e['reason'] for e in retries]}")
        assert retries[0]["reason"].startswith(
            f"port {firsts[0]} (node_manager) was taken after the probe (raylet.err: "
        )
        assert retries[0]["new_token"] is True and retries[1]["new_token"] is False
        # head.json names a head only once its GCS is verified: the worker may never have
        # seen the first one; if it did, it followed the move
        toward_first = [
            e for e in job.events() if e["event"] == "worker_starting" and e["t"] < heads[1]["t"]
        ]
        moved = [e for e in job.events() if e["event"] == "worker_retry"]
        if toward_first:
            assert moved and moved[0]["reason"].startswith("the head moved to ")
        assert connection["node_count"] == 2
        assert connection["ports"]["node_manager"] == firsts[1] != firsts[0]
    finally:
        worker_thief.communicate("", timeout=10)  # it names the job dir: gone before the check
    cancel_and_check_cleanup(job)


def log_retries(job: JobDir) -> None:
    began = job.events()[0]["t"]
    for event in job.events():
        if event["event"] in ("ports_retry", "worker_retry", "ready"):
            log(f"port retry: +{event['t'] - began:.1f} s {event['role']} {event['event']}")


USER_TEMP_PROBE = """
import sys
sys.path.insert(0, sys.argv[1])
import trust
print(trust.user_temp_dir())
"""


@pytest.mark.testbed
def test_a_squatted_user_temp_dir_is_passed_over() -> None:
    """Anyone can create /tmp/jsr-<uid> before its user does. Here alice squats bob's: the
    bootstrap (run as bob) takes the next of its names that is bob's own, and when alice took
    all of them, a fresh private one; never a directory alice holds."""
    bob = user_uid(BOB)
    names = [Path(f"/tmp/jsr-{bob}")] + [Path(f"/tmp/jsr-{bob}-{n}") for n in range(1, 8)]
    code = Path(tempfile.mkdtemp(prefix="jsr-probe-", dir="/tmp"))  # bob can read it
    code.chmod(0o755)
    for module in ("trust.py", "acls.py", "jsr_base.py", "jsr_wire.py"):
        shutil.copy(BOOTSTRAP_DIR / module, code / module)
        (code / module).chmod(0o644)
    aside = {name: name.with_name(f"{name.name}.aside") for name in names if name.exists()}
    for name, moved in aside.items():  # bob runs no cluster: his own dirs, put back below
        name.rename(moved)
    made: list[Path] = []

    def bobs_temp_dir() -> Path:
        out = run_as_user(sys.executable, "-c", USER_TEMP_PROBE, str(code), user=BOB)
        path = Path(out.stdout.strip().splitlines()[-1])
        made.append(path)
        return path

    try:
        run_as_user("mkdir", "-m", "0777", str(names[0]))  # alice squats
        made.append(names[0])
        taken_over = bobs_temp_dir()
        assert taken_over == names[1]
        assert taken_over.owner() == BOB and taken_over.stat().st_mode & 0o777 == 0o700
        shutil.rmtree(taken_over)
        for name in names[1:]:
            run_as_user("mkdir", "-m", "0777", str(name))
            made.append(name)
        fresh = bobs_temp_dir()
        assert fresh.name.startswith(f"jsr-{bob}-") and fresh not in names
        assert fresh.owner() == BOB and fresh.stat().st_mode & 0o777 == 0o700
        assert all(name.owner() == USER for name in names)  # alice's, untouched
    finally:
        for path in [*made, code]:
            shutil.rmtree(path, ignore_errors=True)
        for name, moved in aside.items():
            moved.rename(name)
