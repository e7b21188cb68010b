"""This kernel's own Ray node of one cluster (driver mode): the bootstrap's ``driver`` role
(``bootstrap/driverrun.py``) run on this host as this process's child, in a session of its own.

It joins the cluster as a Ray node that runs no tasks; once it says it is ready (one JSON line
on its stdout) this process connects as an ordinary Ray driver through it. It stops when asked
(``disconnect``, ``down``), by itself when this process is gone (it watches its parent) and
when the head is gone. Its Ray log is ``logs/ray-driver-<host>.log`` in the job dir, its own
output ``logs/driver-<host>.log``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ..bootstrap.jsr_wire import LOGS_DIR, PROGRAM_DIR, DriverLine, Run, TlsFiles
from ..errors import ConnectError

log = logging.getLogger(__name__)

STOP_GRACE = 8.0  # SIGTERM -> SIGKILL of the driver process (it stops its Ray within ~3 s)


@dataclass(frozen=True)
class DriverReady:
    """What the driver node said once it joined: where this process's Ray connects."""

    ip: str
    host: str
    temp_dir: str
    gcs_address: str
    node_manager_port: int
    object_store_memory: int = 0
    through: str = ""  # "head": the head runs on this host, its node is the kernel's too
    tls: TlsFiles | None = None  # that node's certificate, for this process's Ray (tls)

    @property
    def node_words(self) -> str:
        """Which Ray node of this host the kernel connects through."""
        return "the head's Ray node on this host" if self.through == "head" else "its Ray node"

    @classmethod
    def from_line(cls, said: dict[str, Any]) -> DriverReady:
        return cls(
            ip=str(said["ip"]),
            host=str(said.get("host", "")),
            temp_dir=str(said["temp_dir"]),
            gcs_address=str(said["gcs_address"]),
            node_manager_port=int(said["node_manager_port"]),
            object_store_memory=int(said.get("object_store_memory") or 0),
            through=str(said.get("through", "")),
            tls=_tls(said),
        )


def _tls(said: dict[str, Any]) -> TlsFiles | None:
    if not said.get("tls_cert"):
        return None
    return TlsFiles(Path(said["tls_cert"]), Path(said["tls_key"]), Path(said["tls_ca"]))


def kernel_ray_command() -> str | None:
    """This interpreter's own ``ray`` (its environment's bin), else the first on PATH."""
    beside = Path(sys.executable).parent / "ray"
    if os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("ray")


class DriverNode:
    """The driver role's process for one job dir, started once, stopped once."""

    def __init__(self, job_dir: str) -> None:
        self.job_dir = job_dir
        self.process: subprocess.Popen[str] | None = None
        self.ready_info: DriverReady | None = None
        self.failure: str | None = None
        self._news = threading.Event()  # ready, failed or exited
        self._stopping = False
        self._reader: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def start(self) -> None:
        """Start the driver role (it waits for the head's GCS by itself); once only."""
        if self.process is not None:
            return
        ray = kernel_ray_command()
        if ray is None:
            raise ConnectError(
                "driver mode needs the ray command of this kernel's environment "
                "(pip install 'ray[default]'), or connect = 'client'"
            )
        bootstrap = Path(self.job_dir, PROGRAM_DIR)
        if not (bootstrap / "__main__.py").is_file():
            raise ConnectError(
                f"driver mode needs the cluster's job dir on this host's filesystem "
                f"({bootstrap} is not here): connect = 'client' instead"
            )
        argv = [sys.executable, str(bootstrap), Run.DRIVER, self.job_dir]
        argv += ["--owner-pid", str(os.getpid()), "--ray", ray]
        output = self._log_file()
        try:
            self.process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=output,
                env=_driver_environment(),
                text=True,
                start_new_session=True,
                close_fds=True,
            )
        finally:
            if not isinstance(output, int):
                output.close()  # the child has its own
        assert self.process.stdout is not None
        self._reader = threading.Thread(
            target=self._read, args=(self.process.stdout,), name="driver-node", daemon=True
        )
        self._reader.start()
        log.info("driver node of %s started (pid %d)", self.job_dir, self.process.pid)

    def _log_file(self) -> IO[str] | int:
        logs = Path(self.job_dir, LOGS_DIR)
        try:
            logs.mkdir(mode=0o700, exist_ok=True)
            host = socket.gethostname().split(".")[0]
            return open(logs / f"driver-{host}.log", "a")
        except OSError:
            return subprocess.DEVNULL

    def _read(self, stdout: IO[str]) -> None:
        for line in stdout:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                said = json.loads(line)
                if said.get(DriverLine.KEY) == DriverLine.READY:
                    self.ready_info = DriverReady.from_line(said)
                    self._news.set()
                elif said.get(DriverLine.KEY) == DriverLine.FAILED:
                    log_lines = "\n".join(str(x) for x in said.get("log") or [])
                    self.failure = str(said.get("reason")) + (f"\n{log_lines}" if log_lines else "")
                    self._news.set()
                elif said.get(DriverLine.KEY) == DriverLine.STOPPED and not self._stopping:
                    log.warning("this kernel's Ray node stopped: %s", said.get("reason"))
        self._news.set()  # it exited

    async def ready(self, timeout: float) -> DriverReady:
        """What the node said once it joined; ConnectError if it failed, exited or is late."""
        self.start()
        deadline = time.monotonic() + timeout
        while self.ready_info is None:
            left = deadline - time.monotonic()
            if self.failure or not self.running or left <= 0:
                break
            await asyncio.to_thread(self._news.wait, min(left, 1.0))
        if self.ready_info is not None and self.running:
            return self.ready_info
        if self.failure:
            raise ConnectError(f"this kernel's Ray node did not start: {self.failure}")
        if not self.running:
            raise ConnectError(
                f"this kernel's Ray node exited (status {self.process and self.process.poll()}); "
                f"see logs/driver-*.log in {self.job_dir}"
            )
        raise ConnectError(f"this kernel's Ray node did not join the cluster within {timeout:g} s")

    def stop(self, grace: float = STOP_GRACE) -> None:
        """SIGTERM (it stops its Ray session), then SIGKILL of its session after ``grace``."""
        process = self.process
        if process is None:
            return
        self._stopping = True
        if process.poll() is None:
            with contextlib.suppress(OSError):
                process.send_signal(signal.SIGTERM)
            try:
                process.wait(grace)
            except subprocess.TimeoutExpired:
                log.warning("driver node %d did not stop in %g s: killed", process.pid, grace)
                with contextlib.suppress(OSError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(5)
        if process.stdout is not None:
            with contextlib.suppress(OSError):
                process.stdout.close()


def _driver_environment() -> dict[str, str]:
    """This process's environment without another cluster's address or inline token (the
    bootstrap sets the token settings of this one)."""
    env = dict(os.environ)
    for name in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE"):
        env.pop(name, None)
    return env
