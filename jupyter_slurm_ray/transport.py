"""How commands reach the cluster side: a local subprocess or one reused asyncssh connection.

Every operation is an argv list. Over SSH the argv is joined with ``shlex.join`` (the remote
side always runs a shell), so no user value is ever interpolated into a shell string unquoted.
File operations are small constant shell programs that take paths and modes as positional
arguments, so both transports share one implementation of them.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import logging
import os
import shlex
import signal
import tarfile
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from .errors import CommandError, TransportError

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 60.0

# Constant programs run as `sh -c PROGRAM sh ARG...`: arguments never become shell code.
_WRITE_ATOMIC = (
    'umask 077; t=$(mktemp -- "$1.tmp.XXXXXX") || exit 1; '
    'cat >"$t" && chmod "$2" -- "$t" && mv -f -- "$t" "$1" || { rm -f -- "$t"; exit 1; }'
)
_MAKE_DIR = 'umask 077; mkdir -p -- "$1" && chmod "$2" -- "$1"'
_UNPACK = (
    'umask 077; mkdir -p -- "$1" && chmod 700 -- "$1" && '
    'base64 -d | tar -x -f - -C "$1" --no-same-owner --no-same-permissions'
)
_PRINT_HOME = 'printf %s "$HOME"'


@dataclass(frozen=True)
class CommandResult:
    """What a finished command produced."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    def check(self) -> CommandResult:
        if self.returncode != 0:
            raise CommandError(list(self.argv), self.returncode, self.stdout, self.stderr)
        return self


@dataclass
class Forward:
    """A local port that reaches ``remote_host:remote_port`` on the cluster network."""

    local_host: str
    local_port: int
    remote_host: str
    remote_port: int
    _listener: Any = field(default=None, repr=False)

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    @property
    def is_open(self) -> bool:
        return self._listener is not None


class Transport(ABC):
    """Runs argv lists on the cluster side and moves small files there."""

    #: A short description of where commands run, kept in registry records.
    target: str = ""

    def __init__(self) -> None:
        self._home: str | None = None

    @abstractmethod
    async def run(
        self,
        argv: Sequence[str],
        *,
        input: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        check: bool = True,
    ) -> CommandResult:
        """Run ``argv``; raise CommandError on non-zero exit when ``check``."""

    @abstractmethod
    async def forward(self, remote_host: str, remote_port: int) -> Forward:
        """Make ``remote_host:remote_port`` reachable from this process."""

    async def close(self) -> None:  # noqa: B027 - nothing to release by default
        """Release connections and forwards."""

    def describe(self) -> dict[str, Any]:
        """What :func:`transport_for_target` needs to make an equivalent transport."""
        return {"kind": type(self).__name__}

    # -- files, built on run() -------------------------------------------------------------
    async def home(self) -> str:
        if self._home is None:
            result = await self.run(["sh", "-c", _PRINT_HOME])
            if not result.stdout.startswith("/"):
                raise TransportError(f"cannot determine the home directory on {self.target}")
            self._home = result.stdout
        return self._home

    async def expand_path(self, path: str) -> str:
        """Resolve a leading ``~/`` against the cluster-side home directory."""
        if path == "~" or path.startswith("~/"):
            return (await self.home()).rstrip("/") + path[1:]
        return path

    async def make_dir(self, path: str, mode: int = 0o700) -> None:
        await self.run(["sh", "-c", _MAKE_DIR, "sh", path, f"{mode:o}"])

    async def write_file(self, path: str, data: str, mode: int = 0o600) -> None:
        """Write ``data`` to ``path`` atomically (temporary file + rename) with ``mode``."""
        await self.run(["sh", "-c", _WRITE_ATOMIC, "sh", path, f"{mode:o}"], input=data)

    async def write_files(self, directory: str, files: Mapping[str, str]) -> None:
        """Create ``directory`` (0700) holding ``files`` (relative name -> text, each 0600),
        in ONE command: a base64 tar archive on stdin (one round trip over SSH, not one per
        file). Sub-directories in the names are created 0700."""
        await self.run(["sh", "-c", _UNPACK, "sh", directory], input=_tar_base64(files))

    async def read_file(self, path: str) -> str:
        return (await self.run(["cat", "--", path])).stdout

    async def read_file_if_exists(self, path: str) -> str | None:
        result = await self.run(["cat", "--", path], check=False)
        return result.stdout if result.returncode == 0 else None

    async def read_from(self, path: str, offset: int) -> tuple[str, int]:
        """Bytes of ``path`` after ``offset`` (for following a growing file) and the new offset.

        Only whole lines are returned, so a line being appended is read on the next call.
        """
        result = await self.run(["tail", "-c", f"+{offset + 1}", "--", path], check=False)
        if result.returncode != 0:
            return "", offset
        complete = result.stdout[: result.stdout.rfind("\n") + 1]
        return complete, offset + len(complete.encode())

    async def tail(self, path: str, lines: int = 50) -> str:
        result = await self.run(["tail", "-n", str(int(lines)), "--", path], check=False)
        return result.stdout if result.returncode == 0 else ""

    async def __aenter__(self) -> Transport:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class LocalTransport(Transport):
    """Commands run as subprocesses of this process (Jupyter on the login node).

    ``command_prefix`` is put before every argv: e.g. ``["runuser", "-u", "alice", "--"]``
    to act as another user, or a site wrapper. It is a list, never a shell string.
    """

    def __init__(self, command_prefix: Sequence[str] = ()) -> None:
        super().__init__()
        self.command_prefix = tuple(command_prefix)
        self.target = "local" + (f" ({shlex.join(self.command_prefix)})" if command_prefix else "")

    async def run(
        self,
        argv: Sequence[str],
        *,
        input: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        check: bool = True,
    ) -> CommandResult:
        full = [*self.command_prefix, *argv]
        try:
            proc = await asyncio.create_subprocess_exec(
                *full,
                stdin=asyncio.subprocess.PIPE if input is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd="/",
                start_new_session=True,
            )
        except OSError as exc:
            raise TransportError(f"cannot run {argv[0]!r}: {exc.strerror or exc}") from exc
        data = input.encode() if input is not None else None
        try:
            out, err = await asyncio.wait_for(proc.communicate(data), timeout)
        except asyncio.TimeoutError:
            _kill_group(proc.pid)
            await proc.wait()
            raise TransportError(f"{argv[0]} did not finish within {timeout:g} s") from None
        except asyncio.CancelledError:
            _kill_group(proc.pid)
            raise
        result = CommandResult(tuple(argv), proc.returncode or 0, out.decode(), err.decode())
        return result.check() if check else result

    def describe(self) -> dict[str, Any]:
        return {"kind": "local", "command_prefix": list(self.command_prefix)}

    async def forward(self, remote_host: str, remote_port: int) -> Forward:
        # On the login node the cluster network is reachable directly.
        return Forward(remote_host, remote_port, remote_host, remote_port)


def _tar_base64(files: Mapping[str, str]) -> str:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted({str(PurePosixPath(n).parent) for n in files} - {"."}):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o700
            tar.addfile(info)
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o600
            tar.addfile(info, io.BytesIO(data))
    return base64.b64encode(buffer.getvalue()).decode()


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


class SSHTransport(Transport):
    """Commands run on a login node over ONE reused asyncssh connection.

    Honours ``~/.ssh/config``, keys, the agent and known_hosts like OpenSSH does; explicit
    arguments override them. A dropped connection is re-opened once, transparently, and the
    open port forwards are re-established on the same local ports.
    """

    def __init__(
        self,
        host: str,
        *,
        port: int | None = None,
        username: str | None = None,
        client_keys: Sequence[str] | None = None,
        known_hosts: str | tuple[()] | None = (),
        agent_path: str | tuple[()] | None = (),
        connect_timeout: float = 15.0,
        keepalive_interval: float = 15.0,
    ) -> None:
        super().__init__()
        self.host = host
        self.port = port
        self.username = username
        self.client_keys = list(client_keys) if client_keys is not None else None
        self.known_hosts = known_hosts
        self.agent_path = agent_path
        self.connect_timeout = connect_timeout
        self.keepalive_interval = keepalive_interval
        self.target = (
            f"ssh://{username + '@' if username else ''}{host}{f':{port}' if port else ''}"
        )
        self._conn: Any = None
        self._lock = asyncio.Lock()
        self._forwards: list[Forward] = []
        self.connects = 0  # how many connections were opened, for tests and benchmarks

    def describe(self) -> dict[str, Any]:
        target: dict[str, Any] = {"kind": "ssh", "host": self.host}
        for key in ("port", "username", "client_keys", "known_hosts"):
            value = getattr(self, key)
            if value not in (None, ()):
                target[key] = value
        return target

    def _options(self) -> dict[str, Any]:
        options: dict[str, Any] = {
            "connect_timeout": self.connect_timeout,
            "login_timeout": self.connect_timeout,
            "keepalive_interval": self.keepalive_interval,
        }
        if self.port:
            options["port"] = self.port
        if self.username:
            options["username"] = self.username
        if self.client_keys is not None:
            options["client_keys"] = self.client_keys
        if self.known_hosts != ():
            options["known_hosts"] = self.known_hosts
        if self.agent_path != ():
            options["agent_path"] = self.agent_path
        return options

    async def _connection(self) -> Any:
        async with self._lock:
            if self._conn is not None and not self._conn.is_closed():
                return self._conn
            if self._conn is not None:
                log.info("SSH connection to %s was lost; reconnecting", self.target)
            self._conn = await self._open()
            await self._restore_forwards()
            return self._conn

    async def _open(self) -> Any:
        import asyncssh

        where = self.target
        try:
            conn = await asyncio.wait_for(
                asyncssh.connect(self.host, **self._options()), self.connect_timeout + 5
            )
        except asyncssh.HostKeyNotVerifiable as exc:
            raise TransportError(
                f"{where}: the server's host key is not trusted ({exc.reason}). Check the host "
                "and add its key to known_hosts (e.g. connect once with ssh and confirm it)."
            ) from None
        except asyncssh.PermissionDenied as exc:
            raise TransportError(
                f"{where}: login refused ({exc.reason}). Check the user name and that your "
                "key is in the server's authorized_keys (or loaded in ssh-agent)."
            ) from None
        except (asyncio.TimeoutError, TimeoutError):
            raise TransportError(
                f"{where}: no answer within {self.connect_timeout:g} s; is the host reachable "
                "from here?"
            ) from None
        except (OSError, asyncssh.Error) as exc:
            reason = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or str(exc)
            raise TransportError(f"{where}: cannot connect: {reason}") from None
        self.connects += 1
        return conn

    async def _restore_forwards(self) -> None:
        for fwd in self._forwards:
            if fwd.is_open:
                fwd._listener = await self._conn.forward_local_port(
                    fwd.local_host, fwd.local_port, fwd.remote_host, fwd.remote_port
                )

    async def run(
        self,
        argv: Sequence[str],
        *,
        input: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        check: bool = True,
    ) -> CommandResult:
        import asyncssh

        command = shlex.join(argv)
        for attempt in (1, 2):
            conn = await self._connection()
            try:
                proc = await conn.create_process(command, stderr=asyncssh.PIPE)
            except (asyncssh.ChannelOpenError, asyncssh.ConnectionLost, OSError) as exc:
                # The channel never opened, so the command did not run: safe to retry once.
                conn.close()
                if attempt == 2:
                    raise TransportError(f"{self.target}: {exc}") from None
                continue
            return await self._finish(proc, argv, input, timeout, check)
        raise AssertionError("unreachable")

    async def _finish(
        self, proc: Any, argv: Sequence[str], input: str | None, timeout: float, check: bool
    ) -> CommandResult:
        import asyncssh

        try:
            if input is not None:
                proc.stdin.write(input)
            proc.stdin.write_eof()
            completed = await asyncio.wait_for(proc.wait(), timeout)
        except asyncio.TimeoutError:
            proc.close()
            raise TransportError(
                f"{argv[0]} on {self.target} did not finish within {timeout:g} s"
            ) from None
        except (asyncssh.ConnectionLost, asyncssh.DisconnectError, BrokenPipeError) as exc:
            raise TransportError(
                f"{self.target}: connection lost while running {argv[0]}: {exc}"
            ) from None
        returncode = completed.exit_status
        if returncode is None or returncode < 0:  # killed by a signal on the remote side
            returncode = 255
        result = CommandResult(
            tuple(argv), returncode, str(completed.stdout or ""), str(completed.stderr or "")
        )
        return result.check() if check else result

    async def forward(self, remote_host: str, remote_port: int) -> Forward:
        conn = await self._connection()
        listener = await conn.forward_local_port("127.0.0.1", 0, remote_host, remote_port)
        fwd = Forward("127.0.0.1", listener.get_port(), remote_host, remote_port, listener)
        self._forwards.append(fwd)
        return fwd

    @property
    def open_forwards(self) -> list[Forward]:
        return [f for f in self._forwards if f.is_open]

    async def close(self) -> None:
        for fwd in self._forwards:
            fwd.close()
        self._forwards.clear()
        if self._conn is not None:
            self._conn.close()
            with contextlib.suppress(Exception):
                await self._conn.wait_closed()
            self._conn = None


def transport_for_target(target: dict[str, Any]) -> Transport:
    """The transport a registry record's ``target`` describes (see ``Transport.describe``)."""
    kind = target.get("kind")
    if kind == "local":
        return LocalTransport(target.get("command_prefix", ()))
    if kind == "ssh":
        return SSHTransport(
            target["host"],
            port=target.get("port"),
            username=target.get("username"),
            client_keys=target.get("client_keys"),
            known_hosts=target.get("known_hosts", ()),
        )
    raise TransportError(f"unknown transport kind in record: {kind!r}")
