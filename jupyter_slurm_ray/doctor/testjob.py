"""The doctor's test job: one node for a few minutes, always cancelled, to see the site from a
compute node the way a cluster would.

An allocation (sbatch, output to /dev/null: nothing in it depends on a shared filesystem) then
two steps inside it (``srun --overlap``), each with the cluster's environment: the ``env``
setting, the user's setup lines, the cluster's Python. Slurm returns each step's output to
the login side itself, so every check reports even when another one fails:

1. *report*: the job dir root exchange (the node reads the file the login side wrote and
   writes one back), then the cluster's Python prints its version, Ray's version, how long
   ``import ray`` took, and the address the bootstrap would choose (its own code, shipped in
   the program) with a free port of ``port_range``;
2. *listen*: the node listens on that address and port while the login side connects to it
   (through the transport's forward: directly on the login node, tunnelled over SSH);
3. with ``reach_back`` (driver mode is possible here): the other way, the node connects to a
   listener of this process on a port of ``port_range`` (``client/mode.py``'s
   ``node_reaches_kernel``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shlex
import sys
import time
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from ..client.mode import node_reaches_kernel
from ..errors import SlurmError, SlurmRayError, TransportError
from ..job.script import env_section, setup_section
from ..slurm.client import SlurmClient
from ..spec import ClusterSpec
from ..transport import Transport

__all__ = ["NodeReport", "run_test_job"]

# What Ray Data, Train and Tune import beside Ray (ray[data,train,tune] brings them): the
# node's versions are compared with this kernel's
RAY_LIBRARY_DEPENDENCIES = ("numpy", "pandas", "pyarrow")
TEST_JOB_MINUTES = 5  # the test job's walltime (shorter when the request is shorter)
_TAG = "jupyter-slurm-ray-doctor"  # its comment: not a cluster's tag, so no inventory sees it
_MARK = "JSR-DOCTOR-"

# The steps' shell program (bash -c SCRIPT jsr-doctor PROBE_DIR NONCE PYTHON-ARGV...): the job
# dir exchange first (independent of the setup lines), then the environment, then the Python.
_EXCHANGE = (
    'probe=$1 nonce=$2; shift 2; if [ -n "$probe" ]; then',
    '    seen=$(cat -- "$probe/from-login" 2>/dev/null) || seen=',
    '    if (umask 077; printf "%s\\n" "$nonce" >"$probe/from-node") 2>/dev/null; then',
    "        wrote=yes; else wrote=no; fi",
    f'    printf "{_MARK}JOBDIR %s %s\\n" "$wrote" "$seen"',
    "fi",
)

_REPORT = """
import json, os, platform, random, re, socket, sys, time, types
for name, source in SOURCES.items():
    module = types.ModuleType(name)
    sys.modules[name] = module
    exec(compile(source, name + ".py", "exec"), module.__dict__)
import jsr_base, nodeaddr
asked = json.loads(sys.argv[1])
out = {"python": platform.python_version(), "executable": sys.executable,
       "host": socket.gethostname()}
started = time.perf_counter()
try:
    import ray
    out["ray"] = str(getattr(ray, "__version__", "unknown"))
    out["import_ray_seconds"] = round(time.perf_counter() - started, 3)
except Exception as exc:
    out["ray"], out["ray_error"] = None, f"{type(exc).__name__}: {exc}"
from importlib import metadata
out["libraries"] = {}
for name in asked.get("libraries", []):  # what Ray Data, Train and Tune import: their versions
    try:
        out["libraries"][name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        out["libraries"][name] = None
if asked.get("pack_base_python"):  # a venv's pack links to its base interpreter
    import subprocess
    out["pack_base_python"], out["pack_base_version"] = asked["pack_base_python"], None
    try:
        out["pack_base_version"] = subprocess.run(
            [asked["pack_base_python"], "-c", "import platform; print(platform.python_version())"],
            capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
if asked.get("container"):  # Ray runs in the image: its Ray and Python are what count
    import container
    image = jsr_base.Config(cluster_id="doctor", container=asked["container"],
                            container_runtime=asked["container_runtime"])
    out["host_python"], out["ray"], out["ray_error"] = out["python"], None, None
    out["libraries"] = None  # the image's are not the node's Python's
    try:
        prefix = container.ray_command_prefix(image, asked["bind"], asked["gpus"])
        ray_v, python_v, seconds = container.container_versions(prefix, dict(os.environ))
        out.update(ray=ray_v, python=python_v, import_ray_seconds=seconds)
        out["executable"] = "python in " + asked["container"]
    except jsr_base.BootstrapError as exc:
        out["ray_error"] = " ".join([exc.reason, *exc.log[-3:]])
config = jsr_base.Config(cluster_id="doctor", network_interface=asked["network_interface"],
                         node_ip_address_command=asked["node_ip_address_command"])
try:
    chosen = config.network_interface or config.node_ip_address_command
    out["address"] = nodeaddr.node_address(config, None if chosen else nodeaddr.slurmctld_address())
except jsr_base.BootstrapError as exc:
    out["address"], out["address_error"] = None, exc.reason
out["openssl"] = " ".join(jsr_base.run_text(["openssl", "version"]).split()[:2]) or None  # TLS
listing = jsr_base.run_text(["ip", "-o", "-4", "addr", "show"])
pattern = r"^\\d+:\\s+(\\S+)\\s+inet (\\d+\\.\\d+\\.\\d+\\.\\d+)/"
out["interfaces"] = re.findall(pattern, listing, re.M)
low, high = asked["ports"]
count = min(50, high - low + 1)
candidates = [asked["fixed"]] if asked["fixed"] else random.sample(range(low, high + 1), count)
out["port"] = None
for port in candidates if out["address"] else ():
    with socket.socket() as probe:
        try:
            probe.bind((out["address"], port))
        except OSError:
            continue
    out["port"] = port
    break
print("JSR-DOCTOR-REPORT " + json.dumps(out), flush=True)
"""

_LISTEN = """
import json, socket, sys, time
address, port, token, seconds = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
result = {"connected": False}
with socket.socket() as server:
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((address, port))
    server.listen(8)
    deadline = time.monotonic() + seconds
    while not result["connected"] and time.monotonic() < deadline:
        server.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            conn, peer = server.accept()
        except OSError:
            break
        with conn:
            conn.settimeout(5)
            try:
                if conn.recv(256).decode(errors="replace").strip() == token:
                    conn.sendall(b"ok\\n")
                    result = {"connected": True, "peer": peer[0]}
            except OSError:
                pass
print("JSR-DOCTOR-LISTEN " + json.dumps(result), flush=True)
"""


@dataclass
class NodeReport:
    """What the test job saw; None where a step did not get that far."""

    job_id: str | None = None
    node: str | None = None
    refused: str | None = None  # sbatch's refusal, in Slurm's words
    not_started: str | None = None  # why it never ran (queue timeout, ended while pending)
    queue_wait: float | None = None  # seconds from submit until Slurm said RUNNING
    duration: float | None = None  # seconds from submit until cancelled
    step_error: str | None = None  # the report step did not run the Python (its words)
    setup_failed: str | None = None  # the setup line that failed, in the job's words
    python: dict[str, Any] = field(default_factory=dict)  # the report step's JSON
    node_saw_login_file: bool | None = None
    node_wrote_file: bool | None = None
    login_saw_node_file: bool | None = None
    reached: bool | None = None
    reach_error: str | None = None
    reached_back: bool | None = None  # the node reached this process (driver mode)
    reach_back_where: str | None = None
    reach_back_error: str | None = None


def _bootstrap_sources() -> dict[str, str]:
    package = resources.files("jupyter_slurm_ray").joinpath("bootstrap")
    names = ("jsr_wire", "slurmenv", "jsr_base", "nodeaddr", "container")  # in import order
    return {name: package.joinpath(f"{name}.py").read_text() for name in names}


def _pack_base_python(spec: ClusterSpec) -> str | None:
    """With a venv's pack: the interpreter the venv links to (the nodes need it too)."""
    if spec.environment != "pack" or sys.prefix == sys.base_prefix:
        return None
    if os.path.isdir(os.path.join(sys.prefix, "conda-meta")):
        return None
    return os.path.realpath(sys.executable)


def _step_script(spec: ClusterSpec) -> str:
    lines = [*_EXCHANGE, *env_section(spec.env), *setup_section(spec.setup), 'exec "$@"']
    return "\n".join(lines) + "\n"


def _allocation_script(spec: ClusterSpec, name: str) -> str:
    minutes = TEST_JOB_MINUTES
    if spec.time_seconds is not None:
        minutes = max(1, min(minutes, spec.time_seconds // 60))
    options = [
        ("--job-name", name),
        ("--comment", _TAG),
        ("--nodes", "1"),
        ("--ntasks", "1"),
        ("--time", str(minutes)),
        ("--partition", spec.partition),
        ("--account", spec.account),
        ("--qos", spec.qos),
        ("--reservation", spec.reservation),
        ("--constraint", spec.constraint),
        ("--output", "/dev/null"),
        ("--error", "/dev/null"),
        ("--chdir", "/"),
        ("--no-requeue", None),
    ]
    directives = [
        f"#SBATCH {flag}" + ("" if value is None else f"={shlex.quote(value)}")
        for flag, value in options
        if value is not None or flag == "--no-requeue"
    ]
    body = f"exec sleep {minutes * 60}"
    return "\n".join(["#!/bin/sh", *directives, body]) + "\n"


def _marked(output: str, key: str) -> str | None:
    for line in output.splitlines():
        if line.startswith(_MARK + key + " ") or line == _MARK + key:
            return line[len(_MARK + key) + 1 :]
    return None


async def run_test_job(
    transport: Transport,
    spec: ClusterSpec,
    *,
    python_argv: list[str],
    probe_dir: str | None,
    exported: tuple[str, ...],
    queue_timeout: float = 120.0,
    step_timeout: float = 120.0,
    reach_back: bool = False,
) -> NodeReport:
    """Submit the test job, run its two steps, and cancel it whatever happens.

    ``probe_dir``: a fresh directory under the job dir root holding ``from-login`` (the
    login side wrote it) and the allocation's script; None when the root is not usable (the
    script then goes nowhere and the job is not submitted).
    """
    report = NodeReport()
    if probe_dir is None:
        report.not_started = "the job dir root could not be used to write its script"
        return report
    slurm = SlurmClient(transport)
    name = f"jsr-doctor-{secrets.token_hex(4)}"
    script = f"{probe_dir}/job.sbatch"
    await transport.write_file(script, _allocation_script(spec, name), 0o600)
    submitted = time.monotonic()
    try:
        try:
            report.job_id = await slurm.submit(script)
        except SlurmError as exc:
            report.refused = str(exc)
            return report
        except TransportError:
            report.job_id = await _find_by_name(transport, name)
            if report.job_id is None:
                report.not_started = "sbatch did not answer and no job was queued"
                return report
        if not await _wait_running(slurm, report, submitted, queue_timeout):
            return report
        await _report_step(transport, spec, report, python_argv, probe_dir, exported, step_timeout)
        text = await transport.read_file_if_exists(f"{probe_dir}/from-node")
        report.login_saw_node_file = text is not None and text.strip() == _node_nonce(probe_dir)
        if report.python.get("address") and report.python.get("port"):
            await _listen_step(transport, spec, report, python_argv, exported)
        if reach_back and report.python.get("address"):
            where, error = await node_reaches_kernel(
                slurm, report.job_id, str(report.python["address"]), spec.port_range
            )
            report.reached_back, report.reach_back_where = error is None, where
            report.reach_back_error = error
        return report
    finally:
        if report.job_id is not None:
            with contextlib.suppress(SlurmRayError):
                await slurm.cancel(report.job_id)
        report.duration = round(time.monotonic() - submitted, 1)


def _node_nonce(probe_dir: str) -> str:
    return "node:" + probe_dir.rsplit("/", 1)[-1]


async def _find_by_name(transport: Transport, name: str) -> str | None:
    with contextlib.suppress(SlurmRayError):
        result = await transport.run(["squeue", "-h", "--me", "-n", name, "-o", "%i"], check=False)
        ids = [word for word in result.stdout.split() if word.isdigit()]
        return ids[0] if ids else None
    return None


async def _wait_running(
    slurm: SlurmClient, report: NodeReport, submitted: float, queue_timeout: float
) -> bool:
    assert report.job_id is not None
    reason = "Priority"
    while time.monotonic() - submitted < queue_timeout:
        info = (await slurm.query([report.job_id])).get(report.job_id)
        if info is not None and info.state == "RUNNING":
            report.queue_wait = round(time.monotonic() - submitted, 1)
            report.node = ",".join(info.nodes) or None
            return True
        if info is not None and info.is_final:
            report.not_started = f"the test job ended ({info.state}) before it ran"
            return False
        reason = (info.reason if info is not None else "") or reason
        await asyncio.sleep(0.5)
    report.not_started = (
        f"the test job waited {queue_timeout:g} s in the queue without starting "
        f"(Slurm's reason: {reason}) and was cancelled"
    )
    return False


def _srun(job_id: str, exported: tuple[str, ...]) -> list[str]:
    export = ",".join(exported) or "NONE"
    return [
        "srun",
        f"--jobid={job_id}",
        "--overlap",
        "--nodes=1",
        "--ntasks=1",
        f"--export={export}",
    ]


async def _report_step(
    transport: Transport,
    spec: ClusterSpec,
    report: NodeReport,
    python_argv: list[str],
    probe_dir: str,
    exported: tuple[str, ...],
    timeout: float,
) -> None:
    assert report.job_id is not None
    asked = {
        "network_interface": spec.network_interface,
        "node_ip_address_command": spec.node_ip_address_command,
        "ports": list(spec.port_range),
        "fixed": spec.fixed_port_base if spec.port_strategy == "fixed" else None,
        "container": spec.container,
        "container_runtime": spec.container_runtime,
        "bind": probe_dir or "/tmp",
        "gpus": spec.gpus_per_node > 0,
        "pack_base_python": _pack_base_python(spec),
        "libraries": list(RAY_LIBRARY_DEPENDENCIES),
    }
    program = f"SOURCES = {_bootstrap_sources()!r}\n{_REPORT}"
    argv = [
        *_srun(report.job_id, exported),
        "bash",
        "-c",
        _step_script(spec),
        "jsr-doctor",
        probe_dir,
        _node_nonce(probe_dir),
        *python_argv,
        "-c",
        program,
        json.dumps(asked),
    ]
    try:
        result = await transport.run(argv, timeout=timeout, check=False)
    except TransportError as exc:
        report.step_error = str(exc)
        return
    exchange = _marked(result.stdout, "JOBDIR")
    if exchange is not None:
        wrote, _, seen = exchange.partition(" ")
        report.node_wrote_file = wrote == "yes"
        report.node_saw_login_file = seen.strip() == "login:" + probe_dir.rsplit("/", 1)[-1]
    setup = [line for line in result.stderr.splitlines() if "setup line" in line]
    if setup:
        report.setup_failed = setup[-1].strip()
    answer = _marked(result.stdout, "REPORT")
    if answer is not None:
        with contextlib.suppress(ValueError):
            report.python = dict(json.loads(answer))
    if not report.python and not report.setup_failed:
        lines = (result.stderr or result.stdout).strip().splitlines()
        own = [line for line in lines if not line.startswith("srun:")]  # not srun's summary
        detail = (own or lines or ["no output"])[-1].strip()
        report.step_error = f"exit status {result.returncode}: {detail}"


async def _listen_step(
    transport: Transport,
    spec: ClusterSpec,
    report: NodeReport,
    python_argv: list[str],
    exported: tuple[str, ...],
    seconds: float = 25.0,
) -> None:
    assert report.job_id is not None
    address, port = str(report.python["address"]), int(report.python["port"])
    token = secrets.token_hex(8)
    argv = [
        *_srun(report.job_id, exported),
        "bash",
        "-c",
        _step_script(spec),
        "jsr-doctor",
        "",
        "",
        *python_argv,
        "-c",
        _LISTEN,
        address,
        str(port),
        token,
        str(seconds),
    ]
    listening = asyncio.ensure_future(transport.run(argv, timeout=seconds + 60, check=False))
    report.reach_error = await _reach(transport, address, port, token, seconds, listening)
    report.reached = report.reach_error is None
    with contextlib.suppress(SlurmRayError):
        await listening


async def _reach(
    transport: Transport,
    address: str,
    port: int,
    token: str,
    seconds: float,
    listening: asyncio.Future[Any],
) -> str | None:
    """None once the node's listener answered; else the last error seen."""
    forward = await transport.forward(address, port)
    last = "no answer"
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline and not listening.done():
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(forward.local_host, forward.local_port), 5
                )
                try:
                    writer.write(f"{token}\n".encode())
                    await writer.drain()
                    line = await asyncio.wait_for(reader.readline(), 5)
                finally:
                    writer.close()
                if line.strip() == b"ok":
                    return None
                last = "the connection closed before the node answered"
            except (OSError, asyncio.TimeoutError) as exc:
                last = str(exc) or type(exc).__name__
            await asyncio.sleep(0.3)
        return last
    finally:
        forward.close()
