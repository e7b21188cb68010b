"""Errors, the settings in bootstrap.json, and small helpers every part of the bootstrap uses."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
from dataclasses import fields
from pathlib import Path
from typing import Any

from jsr_wire import FORMER_NAMES, JOB_ID_VARIABLE, PORT_STRATEGIES, Settings

LOG_LINES = 40


class BootstrapError(Exception):
    """A failure with one clear sentence for the user and the log lines that explain it."""

    def __init__(self, reason: str, log: list[str] | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.log = (log or [])[-LOG_LINES:]


class RayExitedEarly(BootstrapError):
    """A node's `ray start` gave up before it was up (e.g. Ray's own 30 s raylet wait)."""


# What `ray start` says when its raylet did not register within Ray's fixed 30 s (node.py):
# a busy node, not a broken setup
RAY_STARTUP_TIMEOUT = "The current node timed out during startup"
# a node starts `ray start` again if this much of start_timeout is left (s)
RETRY_MIN_TIME = 20.0
# `ray start` again after Ray's 30 s start-up wait ran out, at most (on a busy node the second
# try missed it too, in CI)
BUSY_RETRIES = 2


def ray_startup_timed_out(log: list[str]) -> bool:
    return any(RAY_STARTUP_TIMEOUT in line for line in log)


class PortConflict(BootstrapError):
    """A port of this node's block was taken by someone else after the probe.

    by_uids: the owners of the listeners found there (empty when Ray's logs told)."""

    def __init__(
        self,
        ports: list[int],
        names: list[str],
        what: str,
        log: list[str],
        by_uids: list[int] | None = None,
    ) -> None:
        which = port_list(ports, names)
        super().__init__(f"port {which or '?'} was taken after the probe ({what})", log)
        self.ports = ports
        self.names = names
        self.by_uids = by_uids or []


def port_list(ports: list[int], names: list[str]) -> str:
    """``21003 (dashboard), 21006-21015 (worker)``: runs of one name told as a range."""
    runs: list[list[int | str]] = []
    for port, name in zip(ports, names, strict=True):
        if runs and runs[-1][2] == name and runs[-1][1] == port - 1:
            runs[-1][1] = port
        else:
            runs.append([port, port, name])
    return ", ".join(
        f"{first} ({name})" if first == last else f"{first}-{last} ({name})"
        for first, last, name in runs
    )


class HeadMoved(Exception):
    """The head started again on other ports (some of its first ones were taken)."""

    def __init__(self, head: dict[str, Any]) -> None:
        super().__init__(gcs_address(head))
        self.head = head


class Config(Settings):
    """``bootstrap.json`` as this program reads it (its fields: ``jsr_wire.Settings``)."""

    @classmethod
    def load(cls, path: Path) -> Config:
        try:
            raw = json.loads(path.read_text())
            config = cls(cluster_id=str(raw["cluster_id"]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise BootstrapError(f"cannot read the settings {path}: {exc}") from exc
        for former, name in FORMER_NAMES.items():  # a file an older client wrote
            if raw.get(name) is None and raw.get(former) is not None:
                raw[name] = raw[former]
        for item in fields(cls):
            if raw.get(item.name) is not None:
                setattr(config, item.name, raw[item.name])
        config.port_range = (int(config.port_range[0]), int(config.port_range[1]))
        if config.port_strategy not in PORT_STRATEGIES:
            allowed = ", ".join(PORT_STRATEGIES[:-1]) + f" or {PORT_STRATEGIES[-1]}"
            raise BootstrapError(f"port_strategy must be {allowed}, not {config.port_strategy!r}")
        if config.port_strategy == "fixed" and config.fixed_port_base is None:
            raise BootstrapError("port_strategy fixed needs fixed_port_base")
        return config


def gcs_address(head: dict[str, Any]) -> str:
    """The GCS address (ip:port) a head.json names."""
    return f"{head['head_ip']}:{head['gcs_port']}"


def command_path(name: str, missing: str) -> str:
    """Where the ``name`` command is on PATH; BootstrapError(``missing``) when it is not."""
    path = shutil.which(name)
    if path is None:
        raise BootstrapError(missing)
    return path


def short_hostname() -> str:
    return socket.gethostname().split(".")[0]


def job_id() -> str:
    """The cluster's job: its Slurm job, or in the kernel's own allocation (mode 'here') the
    id of its steps, JSR_JOB_ID (another cluster may run in the same allocation)."""
    return os.environ.get(JOB_ID_VARIABLE) or os.environ.get("SLURM_JOB_ID", f"pid{os.getpid()}")


def tail(path: Path, lines: int = LOG_LINES) -> list[str]:
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, os.fstat(handle.fileno()).st_size - 64 * 1024))
            text = handle.read().decode(errors="replace")
    except OSError:
        return []
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)  # Ray colours its output even into files
    return [f"{path.name}: {line}" for line in text.splitlines()[-lines:] if line.strip()]


def renew_token(path: Path) -> None:
    """A new cluster token in place of the old (0600, written whole, then renamed): the old
    one may have been sent to a listener that was not ours. Ray reads the file when each of
    its processes starts, so everything started afterwards uses the new one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_urlsafe(32) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def write_json_atomic(path: Path, data: dict[str, Any], mode: int = 0o600) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def run_text(argv: list[str], timeout: float = 10.0, env: dict[str, str] | None = None) -> str:
    """stdout of a short command, or "" if it is missing, fails or hangs."""
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, check=False, env=env
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout if done.returncode == 0 else ""
