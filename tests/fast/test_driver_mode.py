"""Driver mode without a cluster: the ``connect`` setting, what ``auto`` chooses and why, the
nodes' reach check, the status it shows, and the bootstrap's ``driver`` role run for real
with a stand-in ``ray`` (it joins with nothing to run tasks with, tells the kernel, and stops
with it)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from jupyter_slurm_ray.client import drivernode
from jupyter_slurm_ray.client.mode import (
    CLIENT,
    DRIVER,
    KernelPlace,
    allowed_driver_hosts,
    driver_obstacle,
    driver_reach_plan,
    driver_reach_verdict,
    nodes_reach,
)
from jupyter_slurm_ray.client.side import ClientSide
from jupyter_slurm_ray.config import resolve_spec
from jupyter_slurm_ray.errors import ConnectError, SpecError
from jupyter_slurm_ray.job.directory import JobDir
from jupyter_slurm_ray.job.shipping import bootstrap_files
from jupyter_slurm_ray.registry import ClusterRecord, Registry
from jupyter_slurm_ray.slurm.client import SlurmClient
from jupyter_slurm_ray.spec import ClusterSpec
from jupyter_slurm_ray.states import State, Status, record_fields, status_of_record
from jupyter_slurm_ray.transport import CommandResult, LocalTransport
from jupyter_slurm_ray.ui.formatting import status_line
from jupyter_slurm_ray.ui.magic_args import parse, spec_arguments

from ..helpers.bootstrap import BOOTSTRAP_DIR

# A stand-in for `ray start --address=… --block …`: the node's listeners (port 0: where the
# kernel puts them, told in the raylet's log as Ray 2.60 tells it), its node id (a port file of
# its session dir), then Ray's word that it registered (ray_current_cluster in its temp dir);
# its argv is kept for the test.
FAKE_RAY = """#!{python}
import json, os, signal, socket, sys, time
args = dict(a[2:].split("=", 1) for a in sys.argv[2:] if a.startswith("--") and "=" in a)
with open(os.environ["FAKE_RAY_ARGV"], "a") as out:
    out.write(json.dumps(sys.argv[1:]) + "\\n")
if os.environ.get("FAKE_RAY_FAIL"):
    sys.exit(3)
held = [socket.create_server(("", int(args[name])))
        for name in ("node-manager-port", "object-manager-port")]
logs = os.path.join(args["temp-dir"], "session_latest", "logs")
os.makedirs(logs)
with open(os.path.join(logs, "raylet.out"), "w") as out:
    for name, sock in zip(("NodeManager", "ObjectManager"), held):
        port = sock.getsockname()[1]
        out.write(f"grpc_server.cc:144: {{name}} server started, listening on port {{port}}.\\n")
open(os.path.join(logs, "..", "metrics_agent_port_" + "ab" * 28), "w").write("1")
with open(os.path.join(args["temp-dir"], "ray_current_cluster"), "w") as out:
    out.write(args["address"])
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
while True:
    time.sleep(0.1)
"""


@pytest.fixture
def gcs() -> Iterator[int]:
    """A listener standing for the head's GCS (the driver waits for its port to open)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]


@pytest.fixture
def job_dir(tmp_path: Path, gcs: int, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A job dir with the shipped bootstrap, its settings, a token and the head's head.json;
    the stand-in ``ray`` beside it."""
    path = tmp_path / "job"
    path.mkdir(mode=0o700)
    for name, text in bootstrap_files().items():
        (path / "bootstrap" / name).parent.mkdir(parents=True, exist_ok=True)
        (path / "bootstrap" / name).write_text(text)
    settings = {"cluster_id": "drv-0001", "nodes": 2, "port_range": [30000, 39999]}
    (path / "bootstrap.json").write_text(json.dumps(settings))
    (path / "ray_token").write_text("token\n")
    (path / "ray_token").chmod(0o600)
    head = {"head_ip": "127.0.0.1", "gcs_port": gcs, "verified": ["gcs"]}
    (path / "head.json").write_text(json.dumps(head))
    ray = tmp_path / "ray"
    ray.write_text(FAKE_RAY.format(python=sys.executable))
    ray.chmod(0o755)
    monkeypatch.setenv("FAKE_RAY_ARGV", str(tmp_path / "ray-argv.jsonl"))
    return path


def events(job: Path) -> list[dict]:
    path = job / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def ray_argv(job: Path) -> list[str]:
    lines = (job.parent / "ray-argv.jsonl").read_text().splitlines()
    return json.loads(lines[-1])


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def wait_for(check, timeout: float = 15.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout} s")


# ----------------------------------------------------------------------------- the setting


def test_connect_is_one_setting_for_the_api_the_magic_profiles_and_the_environment() -> None:
    assert ClusterSpec().connect == "auto"
    assert ClusterSpec(connect="driver").connect == "driver"
    with pytest.raises(SpecError, match="connect"):
        ClusterSpec(connect="ssh")
    arguments = spec_arguments(parse("up -N 2 -t 5 --connect client"))
    assert resolve_spec(arguments, environ={})[0].connect == "client"
    spec, sources = resolve_spec(environ={"JUPYTER_SLURM_RAY_CONNECT": "driver"})
    assert (spec.connect, sources["connect"]) == ("driver", "env JUPYTER_SLURM_RAY_CONNECT")


# ----------------------------------------------------------------------------- auto's choice


def test_auto_considers_driver_mode_only_for_a_kernel_on_the_clusters_network(
    tmp_path: Path,
) -> None:
    job = tmp_path / "job"
    job.mkdir()
    (job / "bootstrap.json").write_text("{}")
    spec = ClusterSpec()
    kept_off = KernelPlace("login1", None, ())  # a site's driver_hosts = []
    assert driver_obstacle(spec, str(job), kept_off) == (
        "this kernel runs outside Slurm jobs on login1, which driver_hosts does not allow"
    )
    in_a_job = KernelPlace("node1", "77")
    assert driver_obstacle(spec, str(job), in_a_job) is None
    assert in_a_job.on_cluster_network() == "this kernel runs in Slurm job 77 on node1"
    login = KernelPlace("login2", None, ("login*",))
    assert driver_obstacle(spec, str(job), login) is None
    assert login.on_cluster_network() == "this kernel runs on login2, outside Slurm jobs"
    # by default any host outside jobs may try (the nodes' reach decides), unless it reaches
    # Slurm over SSH: a laptop, even with the job dir on a shared filesystem
    anywhere = KernelPlace("login3", None, allowed_driver_hosts(None))
    assert driver_obstacle(spec, str(job), anywhere) is None
    laptop = KernelPlace("laptop", None, allowed_driver_hosts(None))
    assert driver_obstacle(spec, str(job), laptop, remote="alice@login1") == (
        "Slurm is reached through alice@login1: this kernel is off the cluster"
    )
    assert driver_obstacle(spec, str(job), in_a_job, remote="alice@login1") is None
    assert allowed_driver_hosts([]) == ()
    elsewhere = str(tmp_path / "not-here")
    assert driver_obstacle(spec, elsewhere, in_a_job) == (
        "the cluster's job dir is not on this host's filesystem"
    )
    local = ClusterSpec(mode="local")
    assert driver_obstacle(local, str(job), in_a_job) == "local mode: the head runs on this machine"


def test_a_kernel_place_comes_from_slurms_variables() -> None:
    assert KernelPlace.here(environ={"SLURM_JOB_ID": "12"}).slurm_job == "12"
    assert KernelPlace.here(environ={}).slurm_job is None


class ScriptedSrun(LocalTransport):
    """``srun`` answered from a script; the rest runs for real."""

    def __init__(self, stdout: str, stderr: str = "", code: int = 0) -> None:
        super().__init__()
        self.answer = (stdout, stderr, code)
        self.argvs: list[list[str]] = []

    async def run(self, argv: Sequence[str], **kwargs):  # type: ignore[no-untyped-def]
        if argv[0] != "srun":
            return await super().run(argv, **kwargs)
        self.argvs.append(list(argv))
        stdout, stderr, code = self.answer
        return CommandResult(list(argv), code, stdout, stderr)


async def test_the_reach_check_names_the_nodes_that_could_not_connect() -> None:
    every = ScriptedSrun("JSR-REACH ok node1\nJSR-REACH ok node2\n")
    assert await nodes_reach(SlurmClient(every), "12", 2, "10.0.0.5", 30001) is None
    argv = every.argvs[0]
    assert argv[:3] == ["srun", "--jobid=12", "--overlap"] and argv[-2:] == ["10.0.0.5", "30001"]
    one = ScriptedSrun("JSR-REACH ok node1\nJSR-REACH failed node2\n")
    assert await nodes_reach(SlurmClient(one), "12", 2, "10.0.0.5", 30001) == (
        "node2 cannot reach this kernel's Ray node at 10.0.0.5:30001"
    )
    refused = ScriptedSrun("", "srun: error: Unable to create step for job 12: Access denied", 1)
    said = await nodes_reach(SlurmClient(refused), "12", 2, "10.0.0.5", 30001)
    assert said is not None and said.startswith("the reach check (srun) answered for 0 of 2")
    assert said.endswith("Access denied")


def test_doctor_checks_driver_mode_where_auto_would_choose_it() -> None:
    in_a_job, laptop = KernelPlace("node1", "77"), KernelPlace("laptop", None)
    assert driver_reach_plan(ClusterSpec(), in_a_job) is None
    assert driver_reach_plan(ClusterSpec(connect="driver"), laptop) is None
    assert "Ray Client from here" in str(driver_reach_plan(ClusterSpec(), laptop))
    login = KernelPlace("login1", None, allowed_driver_hosts(None))
    assert driver_reach_plan(ClusterSpec(), login) is None  # auto tries: doctor checks it
    assert driver_reach_plan(ClusterSpec(), login, remote="alice@login1") == (
        "auto connects with Ray Client from here: Slurm is reached through alice@login1"
    )
    assert driver_reach_plan(ClusterSpec(connect="client"), in_a_job) == (
        "connect = client: clusters connect with Ray Client"
    )
    ok = driver_reach_verdict(None, "node2", True, "10.0.0.5:30001", None)
    assert ok[0] == "ok" and "node2 reached this kernel at 10.0.0.5:30001" in ok[1]
    failed = driver_reach_verdict(None, "node2", False, "10.0.0.5:30001", "node2 cannot reach")
    assert failed[0] == "fail" and failed[2]
    assert driver_reach_verdict("connect = client", None, None, None, None)[0] == "skip"


# ----------------------------------------------------------------------------- what views show


def test_views_say_how_the_kernel_is_connected_and_why(tmp_path: Path) -> None:
    reason = "auto: this kernel runs in Slurm job 77 on node1; the nodes reach its Ray node"
    status = Status(State.CONNECTED, job_id="78", connect_mode="driver", connect_reason=reason)
    assert status_line(status).endswith(f"Ray driver ({reason})")
    client = Status(State.CONNECTED, connect_mode="client", connect_reason="connect = client")
    assert "Ray Client (connect = client)" in status_line(client)
    assert "Ray" not in status_line(Status(State.READY, connect_mode="driver"))
    registry = Registry(tmp_path / "state")
    record = ClusterRecord(id="ray-abcd1234", name="ray", target="local", job_dir="/j")
    record = ClusterRecord(**{**record.__dict__, **record_fields(status)})
    registry.save(record)
    kept = registry.find("ray-abcd1234")
    assert kept is not None and (kept.connect_mode, kept.connect_reason) == ("driver", reason)
    assert status_of_record(kept).connect_reason == reason


# ----------------------------------------------------------------------------- the driver role


def start_driver(job: Path, owner: str = "$$", ray: str | None = None) -> subprocess.Popen[str]:
    """``bootstrap driver`` as the child of a shell (its owner), its stdout piped here."""
    ray = ray or str(job.parent / "ray")
    program = f'"$0" "$1" driver "$2" --owner-pid {owner} --ray "$3" & wait'
    return subprocess.Popen(
        ["sh", "-c", program, sys.executable, str(job / "bootstrap"), str(job), ray],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )


def said(process: subprocess.Popen[str]) -> dict:
    assert process.stdout is not None
    return json.loads(process.stdout.readline())


def test_the_driver_role_joins_with_nothing_to_run_tasks_and_stops_with_its_kernel(
    job_dir: Path, gcs: int
) -> None:
    shell = start_driver(job_dir)
    try:
        ready = said(shell)
        assert ready["driver"] == "ready" and ready["gcs_address"] == f"127.0.0.1:{gcs}"
        temp_dir = Path(ready["temp_dir"])
        assert temp_dir.name.startswith(f"d{ready['pid']}-")  # its own, not the job's
        argv = ray_argv(job_dir)
        assert argv[:2] == ["start", f"--address=127.0.0.1:{gcs}"] and "--block" in argv
        assert {"--num-cpus=0", "--num-gpus=0", "--resources={}"} <= set(argv)
        assert not any("slurm_ray_node" in word for word in argv)
        fake_ray = wait_for(lambda: [p for p in _children(ready["pid"]) if alive(p)])
        os.kill(shell.pid, signal.SIGKILL)  # the kernel is gone
        wait_for(lambda: not alive(ready["pid"]) and not any(alive(p) for p in fake_ray))
        assert not temp_dir.exists()
    finally:
        with contextlib.suppress(OSError):
            os.killpg(shell.pid, signal.SIGKILL)
    names = [event["event"] for event in events(job_dir)]
    assert names[:2] == ["driver_starting", "driver_joined"] and names[-1] == "driver_stopped"
    assert {event["role"] for event in events(job_dir)} == {"driver"}
    stopped = events(job_dir)[-1]
    assert stopped["reason"].startswith("the kernel (pid ") and stopped["reason"].endswith("gone")


def test_a_driver_that_cannot_start_ray_tells_the_kernel_and_no_cluster_event_says_error(
    job_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_RAY_FAIL", "1")
    (job_dir / "bootstrap.json").write_text(
        json.dumps({"cluster_id": "drv-0001", "start_timeout": 10, "port_range": [30000, 39999]})
    )
    shell = start_driver(job_dir)
    try:
        failed = said(shell)
        assert failed["driver"] == "failed" and "exited with status 3" in failed["reason"]
        assert said(shell)["driver"] == "stopped"
    finally:
        with contextlib.suppress(OSError):
            os.killpg(shell.pid, signal.SIGKILL)
    names = {event["event"] for event in events(job_dir)}
    assert "driver_failed" in names and "error" not in names


@pytest.fixture
def host_gcs() -> Iterator[tuple[str, int]]:
    """A listener standing for the GCS of a head on this host: this host's own address
    (traffic to it stays on this host), as a node's would be."""
    shown = subprocess.run(
        ["ip", "-o", "-4", "addr", "show", "scope", "global"], capture_output=True, text=True
    ).stdout
    addresses = re.findall(r"\binet (\d+\.\d+\.\d+\.\d+)/", shown)
    assert addresses, f"this host has no global IPv4 address: {shown!r}"
    with socket.create_server((addresses[0], 0)) as server:
        yield addresses[0], server.getsockname()[1]


def head_on_this_host(job_dir: Path, gcs: tuple[str, int], start_timeout: float = 60) -> None:
    """The head's address is this host's (a site's node_ip_address_command says so)."""
    settings = json.loads((job_dir / "bootstrap.json").read_text())
    settings.update(node_ip_address_command=f"echo {gcs[0]}", start_timeout=start_timeout)
    (job_dir / "bootstrap.json").write_text(json.dumps(settings))
    head = {"head_ip": gcs[0], "gcs_port": gcs[1], "verified": ["gcs"]}
    (job_dir / "head.json").write_text(json.dumps(head))


def head_answers(job_dir: Path, gcs: tuple[str, int], temp_dir: Path) -> None:
    connection = {
        "gcs_address": f"{gcs[0]}:{gcs[1]}",
        "head_host": "node1",
        "temp_dir": str(temp_dir),
        "ports": {"node_manager": 30001},
    }
    (job_dir / "connection.json").write_text(json.dumps(connection))


def test_a_head_on_this_host_is_the_kernels_node_and_no_second_node_starts(
    job_dir: Path, tmp_path: Path, host_gcs: tuple[str, int]
) -> None:
    head_on_this_host(job_dir, host_gcs)
    head_temp = tmp_path / "head-temp"
    head_temp.mkdir()
    head_temp.chmod(0o777)  # as Ray leaves it: its private parent keeps others out
    shell = start_driver(job_dir)
    try:
        head_answers(job_dir, host_gcs, head_temp)
        ready = said(shell)
        assert {k: v for k, v in ready.items() if k != "pid"} == {
            "driver": "ready",
            "ip": host_gcs[0],
            "host": "node1",
            "temp_dir": str(head_temp),
            "gcs_address": f"{host_gcs[0]}:{host_gcs[1]}",
            "node_manager_port": 30001,
            "object_store_memory": 0,
            "through": "head",
        }
        words = drivernode.DriverReady.from_line(ready).node_words
        assert words == "the head's Ray node on this host"
        assert not (job_dir.parent / "ray-argv.jsonl").exists()  # no `ray start` here
        os.kill(shell.pid, signal.SIGKILL)  # the kernel is gone
        wait_for(lambda: not alive(ready["pid"]))
        assert head_temp.is_dir()  # the head's, untouched
    finally:
        with contextlib.suppress(OSError):
            os.killpg(shell.pid, signal.SIGKILL)
    joined, stopped = events(job_dir)
    assert (joined["event"], joined["through"], stopped["event"]) == (
        "driver_joined",
        "head",
        "driver_stopped",
    )
    assert stopped["reason"].startswith("the kernel (pid ") and stopped["reason"].endswith("gone")


def test_a_head_temp_dir_others_may_write_is_never_connected_through(
    job_dir: Path, tmp_path: Path, host_gcs: tuple[str, int]
) -> None:
    """The head's temp dir in a parent others may write (or one this host does not see, a
    job's private /tmp): a node of its own instead."""
    head_on_this_host(job_dir, host_gcs)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    open_temp = shared / "head-temp"
    open_temp.mkdir(mode=0o777)
    shell = start_driver(job_dir)
    try:
        head_answers(job_dir, host_gcs, open_temp)
        ready = said(shell)
        assert ready["driver"] == "ready" and "through" not in ready
        assert Path(ready["temp_dir"]).name.startswith(f"d{ready['pid']}-")  # its own node's
        assert ray_argv(job_dir)[:2] == ["start", f"--address={host_gcs[0]}:{host_gcs[1]}"]
    finally:
        with contextlib.suppress(OSError):
            os.killpg(shell.pid, signal.SIGKILL)


# ----------------------------------------------------------------------------- the kernel's side


def test_auto_chooses_the_driver_in_a_job_when_the_nodes_reach_it_and_disconnect_stops_it(
    job_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setattr(drivernode, "kernel_ray_command", lambda: str(job_dir.parent / "ray"))
    transport = ScriptedSrun("JSR-REACH ok node1\nJSR-REACH ok node2\n")
    client = ClientSide(transport, Registry(tmp_path / "state"), "drv-0001", lambda: None, ())

    async def choose_then_disconnect() -> tuple[str, str, int]:
        mode = await client.choose(JobDir(transport, str(job_dir)), ClusterSpec(nodes=2), "78")
        assert client.driver is not None and client.driver.pid is not None
        pid = client.driver.pid
        await client.disconnect()
        return mode.mode, mode.reason, pid

    mode, reason, pid = asyncio.run(choose_then_disconnect())
    assert mode == DRIVER
    assert (
        reason
        == "auto: this kernel runs in Slurm job 77 on "
        + socket.gethostname().split(".")[0]
        + "; the nodes reach its Ray node"
    )
    assert transport.argvs[0][1] == "--jobid=78" and "--nodes=2" in transport.argvs[0]
    assert not alive(pid) and client.driver is None


def test_auto_falls_back_to_ray_client_when_a_node_cannot_reach_the_kernel(
    job_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setattr(drivernode, "kernel_ray_command", lambda: str(job_dir.parent / "ray"))
    transport = ScriptedSrun("JSR-REACH ok node1\nJSR-REACH failed node2\n")
    client = ClientSide(transport, Registry(tmp_path / "state"), "drv-0001", lambda: None, ())
    spec = ClusterSpec(nodes=2)
    mode = asyncio.run(client.choose(JobDir(transport, str(job_dir)), spec, "78"))
    assert mode.mode == CLIENT and mode.reason.startswith("auto: node2 cannot reach this kernel")
    assert client.driver is None  # stopped again


def test_driver_mode_asked_where_the_job_dir_is_not_refuses_clearly(tmp_path: Path) -> None:
    transport = ScriptedSrun("")
    client = ClientSide(transport, Registry(tmp_path / "state"), "drv-0001", lambda: None, ())
    job = JobDir(transport, str(tmp_path / "elsewhere"))
    with pytest.raises(ConnectError, match="job dir is not on this host's filesystem"):
        asyncio.run(client.choose(job, ClusterSpec(connect="driver"), "78"))


def test_the_bootstrap_directory_has_the_driver_role() -> None:
    shown = subprocess.run(
        [sys.executable, str(BOOTSTRAP_DIR), "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "driver" in shown and "--owner-pid" in shown


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == pid:
                found.append(int(entry.name))
    return found
