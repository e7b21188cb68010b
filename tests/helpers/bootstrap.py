"""Job dirs, sbatch scripts and observations for the bootstrap tests on the real testbed.

Everything acts as the test user (alice) through ``runuser``; the tests themselves run as root
in the login namespace, so they can read alice's 0700 job dirs and scan /proc of every "node"
(the testbed is one machine).
"""

from __future__ import annotations

import importlib
import json
import os
import pwd
import secrets
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from jupyter_slurm_ray.job.shipping import bootstrap_files

from .clusters import client_tls_environment
from .jobs import in_queue, queue_state, step_in_job
from .paths import REPO, USER_TEMP_PARENTS, VENV_ACTIVATE, VENV_PYTHON
from .testbed import USER, runuser

BOOTSTRAP_DIR = REPO / "jupyter_slurm_ray" / "bootstrap"  # run as `python BOOTSTRAP_DIR ...`
JOBS_ROOT = Path(f"/home/{USER}/.jupyter-slurm-ray/test-jobs")
NODE_NETNS = "/run/netns/jsr-node{}"
QUEUE_TIMEOUT = 300.0  # other test suites share the testbed's nodes

SBATCH_TEMPLATE = """#!/bin/bash
#SBATCH --job-name=jsr-bootstrap-test
#SBATCH --nodes={nodes} --ntasks-per-node=1 --cpus-per-task={cpus} --time={minutes}
#SBATCH --chdir={job_dir} --output={job_dir}/slurm-%j.out --error={job_dir}/slurm-%j.err
#SBATCH --signal=B:USR1@60
{extra_sbatch}
{setup}
exec {python} {head}
"""
DEFAULT_SETUP = VENV_ACTIVATE


def bootstrap_module(name: str) -> ModuleType:
    """A module of the bootstrap directory, imported top-level as the job's Python imports it."""
    if str(BOOTSTRAP_DIR) not in sys.path:
        sys.path.insert(0, str(BOOTSTRAP_DIR))
    return importlib.import_module(name)


def run_as_user(*argv: str, user: str = USER, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` as ``user`` (checked, output captured as text)."""
    kwargs.setdefault("check", True)
    return subprocess.run([*runuser(user), *argv], capture_output=True, text=True, **kwargs)


def write_as_user(path: Path, content: str, mode: int = 0o600) -> None:
    script = 'umask 077; cat > "$1" && chmod "$2" "$1"'
    run_as_user("sh", "-c", script, "sh", str(path), f"{mode:o}", input=content)


@dataclass
class JobDir:
    """A cluster's job dir, written as the client would before sbatch."""

    path: Path
    settings: dict[str, Any]
    job_id: str = ""
    submitted_at: float = 0.0
    extra_sbatch: list[str] = field(default_factory=list)

    @classmethod
    def create(cls, nodes: int = 1, parent: Path = JOBS_ROOT, **settings: Any) -> JobDir:
        cluster_id = "t" + uuid.uuid4().hex[:10]
        path = parent / cluster_id
        run_as_user("sh", "-c", 'umask 077; mkdir -p "$1"', "sh", str(path))
        config = {
            "cluster_id": cluster_id,
            "nodes": nodes,
            "port_strategy": "random",
            "port_range": [20000, 32000],
            "fixed_port_base": None,
            "worker_ports": 16,
            "network_interface": None,
            "node_ip_address_command": None,
            "ray_start_args": [],
            "env": {},
            "object_store_memory": 150 * 1024 * 1024,
            "owner_timeout": 600.0,
            "start_timeout": 120.0,
            "lock_dir": None,
        }
        config.update(settings)
        job = cls(path, config)
        run_as_user(
            "sh", "-c", 'umask 077; mkdir "$1" "$1/sitepath"', "sh", str(path / "bootstrap")
        )
        for name, text in bootstrap_files().items():  # what the client ships
            write_as_user(path / "bootstrap" / name, text, 0o600)
        write_as_user(path / "ray_token", secrets.token_hex(32) + "\n", 0o600)
        job.lease(lease_json(time.time()))  # the owner is alive
        write_as_user(path / "bootstrap.json", json.dumps(config, indent=1), 0o600)
        return job

    def submit(
        self,
        *,
        cpus: int = 1,  # the testbed (2 CPUs a node) is shared with other suites
        minutes: int = 10,
        extra_sbatch: list[str] | None = None,
        setup: str = DEFAULT_SETUP,
        python: str = str(VENV_PYTHON),
        head: str | None = None,
    ) -> str:
        """sbatch as the user; head: what python runs instead of `JOB_DIR/bootstrap head …`."""
        script = SBATCH_TEMPLATE.format(
            nodes=self.settings["nodes"],
            cpus=cpus,
            minutes=minutes,
            job_dir=self.path,
            extra_sbatch="\n".join(f"#SBATCH {line}" for line in extra_sbatch or []),
            setup=setup,
            python=python,
            head=head or f"{self.path}/bootstrap head {self.path}",
        )
        write_as_user(self.path / "job.sbatch", script, 0o700)
        self.submitted_at = time.monotonic()
        done = run_as_user("sbatch", "--parsable", str(self.path / "job.sbatch"))
        self.job_id = done.stdout.strip().split(";")[0]
        return self.job_id

    # ----- observations

    def events(self) -> list[dict[str, Any]]:
        try:
            lines = (self.path / "events.jsonl").read_text().splitlines()
        except OSError:
            return []
        return [json.loads(line) for line in lines if line.strip()]

    def wait_started(self, timeout: float = QUEUE_TIMEOUT) -> dict[str, Any]:
        """The head's first event: the job left the queue (others share the testbed)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            events = self.events()
            if events:
                return events[0]
            time.sleep(0.2)
        raise AssertionError(f"job did not start within {timeout} s\n{self.diagnostics()}")

    def wait_for_event(
        self, match: Callable[[dict[str, Any]], bool], timeout: float, fail_on_error: bool = True
    ) -> dict[str, Any]:
        """The first matching event, waiting up to timeout s after the job started."""
        self.wait_started()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            events = self.events()
            for event in events:
                if match(event):
                    return event
            errors = [e for e in events if e["event"] == "error"]
            if fail_on_error and errors:
                raise AssertionError(f"bootstrap error: {errors[0]}\n{self.diagnostics()}")
            time.sleep(0.2)
        raise AssertionError(f"no matching event within {timeout} s\n{self.diagnostics()}")

    def wait_ready(self, timeout: float = 150.0) -> dict[str, Any]:
        """The connection once every node joined: within the bootstrap's start_timeout (120 s,
        above) and a margin; on a busy machine a node may need its second `ray start` (Ray's
        own 30 s start-up wait ran out: seen in CI on the enforced flavour)."""
        self.wait_for_event(lambda e: e["event"] == "ready", timeout)
        return self.connection()

    def connection(self) -> dict[str, Any]:
        return json.loads((self.path / "connection.json").read_text())

    def head_log(self, name: str) -> str:
        """A log of the head's Ray session, read by a step of the job on the head's node: Ray's
        temp dir may be in the job's own /tmp (job_container/tmpfs)."""
        connection = self.connection()
        path = f"{connection['temp_dir']}/session_latest/logs/{name}"
        assert self.job_id is not None
        step = step_in_job(self.job_id, connection["head_host"])
        return run_as_user(*step, "cat", "--", path).stdout

    def lease(self, content: str) -> None:
        write_as_user(self.path / "lease", content, 0o600)

    def detach(self) -> None:
        write_as_user(self.path / "detached", "", 0o600)

    def diagnostics(self) -> str:
        parts = [f"job {self.job_id} state {queue_state(self.job_id)!r}"]
        parts += [json.dumps(e)[:600] for e in self.events()]
        for path in sorted(self.path.glob("slurm-*")) + sorted(self.path.glob("logs/*")):
            parts.append(f"--- {path.name}\n" + "\n".join(path.read_text().splitlines()[-15:]))
        return "\n".join(parts)

    def markers(self) -> list[str]:
        """Strings found in the command line of every process this cluster may have left."""
        found = [str(self.path)]
        found += [
            str(e["temp_dir"])
            for e in self.events()
            if e.get("temp_dir") and isinstance(e["temp_dir"], str)
        ]
        found += [f"{parent}/jsr-{user_uid()}/{self.job_id}-" for parent in USER_TEMP_PARENTS]
        return found


def lease_json(t: float, seq: int = 1, renew_every: float = 10.0) -> str:
    """A lease as the owner writes it, renewed at t (the owner's time.time())."""
    lease = {"pid": 4242, "host": "login", "seq": seq, "t": t, "renew_every": renew_every}
    return json.dumps(lease)


def user_uid(user: str = USER) -> int:
    return pwd.getpwnam(user).pw_uid


def wait_until_gone(job_id: str, timeout: float) -> float:
    """Seconds until the job left squeue (raises if it did not within timeout)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if not in_queue(job_id):
            return time.monotonic() - started
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} still {queue_state(job_id)!r} after {timeout} s")


def scancel(*job_ids: str, options: tuple[str, ...] = ()) -> None:
    ids = [j for j in job_ids if j]
    if ids:
        run_as_user("scancel", *options, *ids, check=False)


def processes_matching(markers: list[str]) -> list[tuple[int, str]]:
    """(pid, cmdline) of every live process on the machine whose command line has a marker."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            text = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z" and any(marker in text for marker in markers):
            found.append((int(entry.name), text[:200]))
    return found


def wait_no_processes(markers: list[str], timeout: float) -> float:
    started = time.monotonic()
    while True:
        left = processes_matching(markers)
        if not left:
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise AssertionError(f"processes left after {timeout} s: {left}")
        time.sleep(0.2)


def cancel_leftovers(jobs: list[JobDir]) -> None:
    """Cancel whatever of jobs still runs and wait until Slurm forgot it."""
    running = [job.job_id for job in jobs if job.job_id and queue_state(job.job_id)]
    scancel(*running)
    for job_id in running:
        wait_until_gone(job_id, 30)


def cancel_and_check_cleanup(job: JobDir, lock_dir: str | None = None) -> float:
    """scancel, then: job gone, `stopped` event, no process of the cluster on any node."""
    started = time.monotonic()
    scancel(job.job_id)
    wait_until_gone(job.job_id, 15)
    job.wait_for_event(lambda e: e["event"] == "stopped", 5, fail_on_error=False)
    assert_cleaned_up(job, lock_dir)
    return time.monotonic() - started


def assert_cleaned_up(job: JobDir, lock_dir: str | None = None) -> None:
    """No process, port claim or temp dir of the cluster left, every worker stopped itself."""
    wait_no_processes(job.markers(), 10)
    assert not [c for c in claims(lock_dir) if c.get("job_id") == job.job_id]
    events = job.events()
    workers = {e["host"] for e in events if e["event"] == "worker_starting"}
    assert workers <= {e["host"] for e in events if e["event"] == "worker_stopped"}
    temp_dirs = [e["temp_dir"] for e in events if e.get("temp_dir")]
    assert temp_dirs and not [t for t in temp_dirs if Path(t).exists()]


CLIENT_PROGRAM = """
import json, socket, sys, time
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
address = sys.argv[1]
for attempt in range(3):  # ray#63202: a Ray Client connect fails now and then
    try:
        ray.init(address, logging_level="ERROR")
        break
    except Exception as exc:
        print("connect failed:", exc, file=sys.stderr)
        time.sleep(1)
else:
    sys.exit("could not connect")
@ray.remote(num_cpus=0)
def host():
    return socket.gethostname()
nodes = [n for n in ray.nodes() if n["Alive"]]
pinned = [NodeAffinitySchedulingStrategy(n["NodeID"], soft=False) for n in nodes]
refs = [host.options(scheduling_strategy=strategy).remote() for strategy in pinned]
print(json.dumps({"hosts": sorted(ray.get(refs)), "resources": ray.cluster_resources()}))
ray.shutdown()
"""


def run_ray_client(job: JobDir, timeout: float = 150.0) -> dict[str, Any]:
    """In a subprocess (no Ray Client state in pytest): one task pinned to every node."""
    connection = job.connection()
    env = dict(os.environ)
    env.update(
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN_PATH=str(job.path / "ray_token"),
        RAY_USAGE_STATS_ENABLED="0",
        RAY_CLIENT_INITIAL_CONNECTION_TIMEOUT_S="20",
    )
    env.update(client_tls_environment(job.path))
    address = f"ray://{connection['head_ip']}:{connection['client_port']}"
    done = subprocess.run(
        [str(VENV_PYTHON), "-c", CLIENT_PROGRAM, address],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
        cwd="/tmp",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def claims(lock_dir: str | None = None) -> list[dict[str, Any]]:
    """The port claims in lock_dir (by default the user's private ones: under /tmp, or under
    /var/tmp where jobs have a /tmp of their own) that are JSON objects.

    Plain files only: another user may plant a FIFO (reading it would wait forever).
    """
    found = []
    dirs = (
        [lock_dir]
        if lock_dir
        else [f"{parent}/jsr-{user_uid()}/ports" for parent in USER_TEMP_PARENTS]
    )
    for path in (path for one in dirs for path in Path(one).glob("*.claim")):
        try:
            if not stat.S_ISREG(path.lstat().st_mode):
                continue
            claim = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(claim, dict):
            found.append(claim)
    return found


def in_node(node: int, *argv: str, user: str = USER) -> list[str]:
    """argv to run a command as user inside compute node N's network namespace."""
    return ["nsenter", f"--net={NODE_NETNS.format(node)}", "runuser", "-u", user, "--", *argv]


def python_listener(port: int, host: str = "") -> list[str]:
    code = (
        "import socket, sys, time\n"
        "s = socket.socket(); s.bind((sys.argv[2], int(sys.argv[1]))); s.listen()\n"
        "print('listening', flush=True); time.sleep(600)\n"
    )
    return ["/usr/bin/python3", "-c", code, str(port), host]


def log(message: str) -> None:
    print(f"[bootstrap-test] {message}", file=sys.stderr, flush=True)
