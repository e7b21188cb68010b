"""Real parts for the server-extension tests: a Jupyter server subprocess and a Ray cluster.

The Jupyter server runs as ``python -m jupyter_server`` on 127.0.0.1 with a token and its own
config, data and registry directories; clusters are started from Python as the testbed user (a
stand-in for a notebook), one node with one CPU, since other tests share the testbed's CPUs.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import requests

from jupyter_slurm_ray.aio import run_sync
from jupyter_slurm_ray.client.connect import ConnectionInfo
from jupyter_slurm_ray.cluster import SlurmRayCluster
from jupyter_slurm_ray.registry import Registry
from jupyter_slurm_ray.transport import LocalTransport

from .clusters import cluster_spec
from .jobs import step_in_job
from .paths import VENV_PYTHON
from .testbed import runuser


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class JupyterServer:
    """A running ``jupyter_server`` process and how to talk to it."""

    proc: subprocess.Popen
    url: str  # ends with "/"
    token: str
    log_path: Path
    state_dir: Path

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self.token}"}

    def get(self, path: str, **kwargs) -> requests.Response:
        kwargs.setdefault("headers", self.headers())
        kwargs.setdefault("allow_redirects", False)
        kwargs.setdefault("timeout", 60)
        return requests.get(self.url + path.lstrip("/"), **kwargs)

    def request(self, method: str, path: str, **kwargs) -> requests.Response:
        kwargs.setdefault("headers", self.headers())
        kwargs.setdefault("timeout", 120)
        return requests.request(method, self.url + path.lstrip("/"), **kwargs)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def server_environment(root: Path, user: str, **extra: str) -> dict[str, str]:
    env = {
        **os.environ,
        "JUPYTER_CONFIG_DIR": str(root / "config"),
        "JUPYTER_DATA_DIR": str(root / "data"),
        "JUPYTER_RUNTIME_DIR": str(root / "runtime"),
        "JUPYTER_SLURM_RAY_STATE_DIR": str(root / "state"),
        "JUPYTER_SLURM_RAY_COMMAND_PREFIX": " ".join(runuser(user)),
        "JUPYTER_SLURM_RAY_PROFILES_FILE": str(root / "profiles.toml"),
        "JUPYTER_PLATFORM_DIRS": "1",
    }
    env.update(extra)
    return env


@contextlib.contextmanager
def jupyter_server(
    root: Path,
    user: str,
    *,
    app: str = "jupyter_server",
    extra_args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> Iterator[JupyterServer]:
    """``python -m <app>`` with a token on a free loopback port (``env`` added to its
    environment); stopped by its PID at the end."""
    for sub in ("config", "data", "runtime", "state"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(24)
    port = free_port()
    log_path = root / f"{app}.log"
    argv = [
        str(VENV_PYTHON),
        "-m",
        app,
        "--no-browser",
        "--allow-root",
        "--ip=127.0.0.1",
        f"--port={port}",
        "--port-retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        "--ServerApp.jpserver_extensions={'jupyter_slurm_ray.server': True}",
        *extra_args,
    ]
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            argv,
            env=server_environment(root, user, **(env or {})),
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    server = JupyterServer(proc, f"http://127.0.0.1:{port}/", token, log_path, root / "state")
    try:
        _wait_until_up(server)
        yield server
    finally:
        stop_process(proc)


@contextlib.contextmanager
def jupyter_lab(root: Path, user: str) -> Iterator[JupyterServer]:
    """JupyterLab (``jupyter_server`` with ``app="jupyterlab"``) with its settings and
    workspaces under ``root``, and no news or update checks (this machine has no Internet)."""
    quiet = root / "settings" / "@jupyterlab" / "apputils-extension"
    quiet.mkdir(parents=True, exist_ok=True)
    (quiet / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False})
    )
    args = (
        f"--LabApp.user_settings_dir={root / 'settings'}",
        f"--LabApp.workspaces_dir={root / 'workspaces'}",
    )
    with jupyter_server(root, user, app="jupyterlab", extra_args=args) as server:
        yield server


def _wait_until_up(server: JupyterServer, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"the Jupyter server exited:\n{server.log()[-3000:]}")
        with contextlib.suppress(requests.ConnectionError):
            if server.get("api/status", timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"the Jupyter server did not answer in {timeout} s:\n{server.log()[-3000:]}")


def stop_process(proc: subprocess.Popen, timeout: float = 15) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def start_cluster(state_dir: Path, user: str, name: str) -> SlurmRayCluster:
    """A READY cluster (no Ray Client: the proxy needs none), recorded in ``state_dir``."""
    cluster = SlurmRayCluster(
        cluster_spec(name=name, nodes=1),
        LocalTransport(runuser(user)),
        registry=Registry(state_dir),
    )
    try:
        cluster.up(connect=False)
    except BaseException:
        with contextlib.suppress(Exception):
            cluster.down()
        raise
    return cluster


@dataclass(frozen=True)
class Head:
    """The dashboard of a cluster reached directly (the login node reaches the head): Ray's
    own port (``url``), and the head's relay in front of it (``relay_url``, https with the
    cluster's CA ``ca``) when the cluster runs with TLS."""

    url: str  # ends with "/"
    token: str
    info: ConnectionInfo
    relay_url: str | None = None
    ca: str | None = None

    def headers(self) -> dict[str, str]:
        return {"X-Ray-Authorization": f"Bearer {self.token}"}


def head_of(cluster: SlurmRayCluster) -> Head:
    read = cluster.transport.read_file
    info = ConnectionInfo.from_json(run_sync(read(f"{cluster.job_dir}/connection.json")))
    token = run_sync(read(f"{cluster.job_dir}/ray_token")).strip()
    url = f"http://{info.head_ip}:{info.ports['dashboard']}/"
    if not info.tls:
        return Head(url, token, info)
    relay = f"https://{info.head_ip}:{info.dashboard_port}/"
    return Head(url, token, info, relay, f"{cluster.job_dir}/tls/ca.crt")


def ray_log_dir(cluster: SlurmRayCluster) -> str:
    """The head's Ray log directory (the dashboard serves its files through its log API)."""
    text = run_sync(cluster.transport.read_file(f"{cluster.job_dir}/connection.json"))
    return f"{json.loads(text)['temp_dir']}/session_latest/logs"


def on_the_heads_node(cluster: SlurmRayCluster) -> list[str]:
    """argv's start for a step of the cluster's job on the head's node (run as the cluster's
    user): Ray's temp dir may be in the job's own /tmp (job_container/tmpfs)."""
    text = run_sync(cluster.transport.read_file(f"{cluster.job_dir}/connection.json"))
    assert cluster.job_id is not None
    return step_in_job(cluster.job_id, json.loads(text)["head_host"])


def dashboard_log(cluster: SlurmRayCluster) -> str:
    """The head's dashboard logs (all of them), read as the cluster's user on its node."""
    script = 'cat -- "$1"/dashboard*'
    argv = [*on_the_heads_node(cluster), "sh", "-c", script, "sh", ray_log_dir(cluster)]
    return run_sync(cluster.transport.run(argv, check=False)).stdout
