"""The testbed's JupyterHub (``scripts/hub``) and Open OnDemand front (``scripts/ood``) as the
tests use them: a hub started for a module (and stopped if the module started it), users who
log in with their PAM password, their servers (Slurm jobs), hub API tokens, and the records
their servers keep in their homes.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import requests

from .paths import REPO
from .waiting import wait_for

HUB_PORT = 8000
OOD_PORT = 8080
SERVER_JOB_NAME = "spawner-jupyterhub"  # batchspawner's SlurmSpawner names its jobs so


def login_node_address() -> str:
    """The login node's address on the laptop side: where the hub and Apache listen."""
    return os.environ["JSR_SSH_HOST"]


def script(name: str, *args: str, timeout: float = 900) -> str:
    """Run ``scripts/<name> args…`` (as root); its stdout, or an AssertionError with its
    output when it fails."""
    done = subprocess.run(
        [str(REPO / "scripts" / name), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"scripts/{name} {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def user_venv() -> str:
    """The users' Jupyter environment (``scripts/user-venv``: made once, then kept)."""
    return script("user-venv").strip()


def _running(name: str) -> bool:
    status = [str(REPO / "scripts" / name), "status"]
    return subprocess.run(status, capture_output=True, check=False).returncode == 0


@contextlib.contextmanager
def service(name: str) -> Iterator[None]:
    """``scripts/<name> up`` for the duration (the hub: installs what is missing, about two
    minutes the first time); ``down`` at the end unless it was already running."""
    was_running = _running(name)
    script(name, "up")
    try:
        yield
    finally:
        if not was_running:
            script(name, "down")


def user_records(user: str) -> Path:
    """Where a user's Jupyter server keeps its cluster records (the registry's default)."""
    home = Path(pwd.getpwnam(user).pw_dir)
    return home / ".local" / "share" / "jupyter" / "slurm_ray" / "clusters"


def record_of(user: str, cluster_id: str) -> dict[str, Any]:
    return json.loads((user_records(user) / f"{cluster_id}.json").read_text())


def forget_record(user: str, cluster_id: str) -> None:
    """Remove an ended cluster's record from the user's registry (what Forget does)."""
    (user_records(user) / f"{cluster_id}.json").unlink(missing_ok=True)
    (user_records(user).parent / "tokens" / cluster_id).unlink(missing_ok=True)


class HubUser:
    """One user of the hub, logged in with the PAM password ``scripts/hub`` gave them."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.hub = f"http://{login_node_address()}:{HUB_PORT}/"
        self.session = requests.Session()
        self._token: str | None = None

    @property
    def server(self) -> str:
        """The user's server through the hub's proxy (ends with "/")."""
        return f"{self.hub}user/{self.name}/"

    def login(self) -> None:
        password = script("hub", "login", self.name).strip()
        self.session.get(self.hub + "hub/login", timeout=30).raise_for_status()
        response = self.session.post(
            self.hub + "hub/login",
            data={"username": self.name, "password": password, "_xsrf": self._xsrf()},
            allow_redirects=False,
            timeout=30,
        )
        assert response.status_code == 302, (response.status_code, response.text[:500])

    def _xsrf(self) -> str:
        return self.session.cookies.get("_xsrf", path="/hub/") or ""

    def hub_api(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        """The hub's REST API (``/hub/api/…``) with the login cookie, as the hub's pages do."""
        kwargs.setdefault("timeout", 60)
        headers = {"X-XSRFToken": self._xsrf(), **kwargs.pop("headers", {})}
        return self.session.request(method, f"{self.hub}hub/api/{path}", headers=headers, **kwargs)

    def _server_model(self) -> dict[str, Any]:
        response = self.hub_api("GET", f"users/{self.name}")
        response.raise_for_status()
        return response.json().get("servers", {}).get("", {})

    def start_server(self, timeout: float = 180) -> float:
        """Start My Server: seconds until the hub says the server is ready."""
        started = time.monotonic()
        response = self.hub_api("POST", f"users/{self.name}/server")
        assert response.status_code in (201, 202), (response.status_code, response.text[:500])

        def ready() -> bool:
            model = self._server_model()
            if not model.get("ready") and not model.get("pending"):
                raise AssertionError(f"{self.name}'s server failed to start: {model}")
            return bool(model.get("ready"))

        wait_for(ready, timeout, f"{self.name}'s server to start", step=1)
        return time.monotonic() - started

    def stop_server(self, timeout: float = 90) -> None:
        """Stop My Server: the hub cancels the server's job."""
        response = self.hub_api("DELETE", f"users/{self.name}/server")
        assert response.status_code in (202, 204, 400), (response.status_code, response.text)
        wait_for(lambda: not self._server_model(), timeout, f"{self.name}'s server to stop")

    def server_jobs(self) -> list[str]:
        """Ids of the user's server jobs that are queued or running."""
        out = subprocess.run(
            ["squeue", "-h", "-u", self.name, "-n", SERVER_JOB_NAME, "-o", "%i"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return out.split()

    def token(self) -> str:
        """A hub API token of this user (what ``/hub/token`` makes): it opens the user's own
        server to scripts, ``Authorization: token …``."""
        if self._token is None:
            response = self.hub_api(
                "POST", f"users/{self.name}/tokens", json={"note": "tests", "expires_in": 3600}
            )
            assert response.status_code in (200, 201), (response.status_code, response.text)
            self._token = response.json()["token"]
        return self._token

    def call(self, method: str, path: str, *, server: str | None = None, **kwargs: Any):
        """A request to a single-user server (this user's by default) with this user's token."""
        kwargs.setdefault("timeout", 120)
        kwargs.setdefault("allow_redirects", False)
        headers = {"Authorization": f"token {self.token()}", **kwargs.pop("headers", {})}
        url = (server or self.server) + path.lstrip("/")
        return requests.request(method, url, headers=headers, **kwargs)

    def remove_server_logs(self) -> None:
        """batchspawner's job output files in the user's home."""
        home = Path(pwd.getpwnam(self.name).pw_dir)
        for log in home.glob("jupyterhub_slurmspawner_*.log"):
            log.unlink(missing_ok=True)


def wait_for_cluster_state(user: HubUser, cluster_id: str, states: set[str], timeout: float):
    """The cluster's REST view once its state is one of ``states`` (AssertionError on a final
    state that is not wanted, or after ``timeout``)."""

    def reached() -> dict[str, Any] | None:
        response = user.call("GET", f"slurm-ray/api/clusters/{cluster_id}")
        response.raise_for_status()
        view = response.json()
        if view["state"] in states:
            return view
        if view.get("final"):
            raise AssertionError(f"cluster {cluster_id} ended {view['state']}: {view}")
        return None

    return wait_for(reached, timeout, f"cluster {cluster_id} to be {'/'.join(sorted(states))}")


def jobs_cli(*args: str) -> subprocess.CompletedProcess:
    """Ray's Jobs CLI (``ray job …``) of this venv, without this process's ``RAY_*`` settings."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    environment["RAY_USAGE_STATS_ENABLED"] = "0"
    ray = Path(sys.executable).with_name("ray")
    return subprocess.run(
        [str(ray), "job", *args], capture_output=True, text=True, timeout=180, env=environment
    )
