"""How commands reach the cluster side: a local subprocess or one reused asyncssh connection.

Every operation is an argv list. Over SSH the argv is joined with ``shlex.join`` (the remote
side always runs a shell, see :func:`remote_command`), so no user value is ever interpolated
into a shell string unquoted.
File operations are small constant shell programs that take paths and modes as positional
arguments, so both transports share one implementation of them.

Every command runs without the Slurm variables of the environment it is started from (the
kernel's, or the login node's shell over SSH), ``SLURM_CONF`` excepted: a kernel inside a Slurm
job (batchspawner, Open OnDemand) must not pass its own job's memory, CPUs, binding or id on to
the requests it makes (``bootstrap/slurmenv.py`` says which and why).
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
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from .bootstrap.slurmenv import INPUT_NAMES, INPUT_PREFIXES, KEPT, command_environment
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
# Over SSH: the command in "$@", without the login shell's Slurm variables (the same rule as
# slurmenv.command_environment outside a job of ours; its names are constants, not input).
_WITHOUT_SLURM_VARIABLES = (
    "for jsr_v in $(env | sed -n 's/^\\([A-Za-z_][A-Za-z0-9_]*\\)=.*/\\1/p'); do "
    f"case $jsr_v in {'|'.join(sorted(KEPT))}) ;; "
    f"{'|'.join([*(prefix + '*' for prefix in INPUT_PREFIXES), *sorted(INPUT_NAMES)])}) "
    'unset "$jsr_v" ;; esac; done; exec "$@"'
)
_CHUNK = 1 << 20  # bytes per write when sending a file
_SEND_TIMEOUT = 600.0  # s without progress while sending a file


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
    """A local port that reaches ``remote_host:remote_port`` on the cluster network.

    A direct forward (the cluster network is reachable from here) has no listener. A tunnelled
    one owns its listening socket for as long as it is open, across SSH reconnects, so the
    local port can never be taken over by another process while this one relies on it.
    """

    local_host: str
    local_port: int
    remote_host: str
    remote_port: int
    _server: Any = field(default=None, repr=False)
    direct: bool = False

    def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()

    @property
    def is_open(self) -> bool:
        """True while connections to the local port reach the remote one through us."""
        if self.direct:
            return True
        return self._server is not None and self._server.is_serving()


class Transport(ABC):
    """Runs argv lists on the cluster side and moves small files there."""

    #: The name of where commands run ("local", "local (runuser -u alice --)",
    #: "ssh://alice@login1:22"): records keep it to say which configured transport they need.
    target: str = ""

    def __init__(self) -> None:
        self._home: str | None = None
        self._local_mode: Transport | None = None

    def for_local_mode(self) -> Transport:
        """Where this process's local-mode clusters run (one transport, reused): this machine,
        as the user this transport acts as here (a local ``command_prefix`` is kept; from a
        laptop configured for SSH, the laptop's own user). Which scheduler runs their jobs is
        the cluster's mode's (``slurm/schedulers.py``), not the transport's."""
        if self._local_mode is None:
            self._local_mode = LocalTransport(self._local_prefix())
        return self._local_mode

    def _local_prefix(self) -> tuple[str, ...]:
        return ()

    async def run(
        self,
        argv: Sequence[str],
        *,
        input: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        check: bool = True,
    ) -> CommandResult:
        """Run ``argv`` (``input`` on its stdin); CommandError on a non-zero exit when
        ``check``; TransportError when it cannot run or does not finish within ``timeout``."""
        result = await self._execute(list(argv), input, timeout)
        return result.check() if check else result

    @abstractmethod
    async def _execute(self, argv: list[str], input: str | None, timeout: float) -> CommandResult:
        """Run ``argv`` to its end, whatever its exit status (see :meth:`run`)."""

    @abstractmethod
    async def forward(self, remote_host: str, remote_port: int) -> Forward:
        """Make ``remote_host:remote_port`` reachable from this process."""

    async def close(self) -> None:  # noqa: B027 - nothing to release by default
        """Release connections and forwards."""

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
        await self.run(["sh", "-c", _UNPACK, "sh", directory], input=tar_base64(files))

    async def send_file(
        self, local_path: str, path: str, progress: Callable[[int, int], None] | None = None
    ) -> None:
        """Copy the local file ``local_path`` (any size, bytes) to ``path``, atomically, 0600,
        streamed in chunks; ``progress(bytes sent, bytes in all)`` after each chunk."""
        argv = ["sh", "-c", _WRITE_ATOMIC, "sh", path, "600"]
        total = os.path.getsize(local_path)
        sent = 0
        with open(local_path, "rb") as source:

            def chunks() -> Iterator[bytes]:
                nonlocal sent
                while data := source.read(_CHUNK):
                    sent += len(data)
                    yield data
                    if progress:
                        progress(sent, total)

            result = await self._stream(argv, chunks())
        result.check()

    async def _stream(self, argv: list[str], chunks: Iterator[bytes]) -> CommandResult:
        raise TransportError(f"{type(self).__name__} cannot send files")

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

    def for_local_mode(self) -> Transport:
        return self  # already this machine

    def _local_prefix(self) -> tuple[str, ...]:
        return self.command_prefix

    async def _execute(self, argv: list[str], input: str | None, timeout: float) -> CommandResult:
        full = [*self.command_prefix, *argv]
        try:
            proc = await asyncio.create_subprocess_exec(
                *full,
                stdin=asyncio.subprocess.PIPE if input is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd="/",
                env=_without_slurm_variables(),
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
        return CommandResult(tuple(argv), proc.returncode or 0, _text(out), _text(err))

    async def _stream(self, argv: list[str], chunks: Iterator[bytes]) -> CommandResult:
        proc = await asyncio.create_subprocess_exec(
            *self.command_prefix, *argv, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd="/",
            env=_without_slurm_variables(),
        )  # fmt: skip
        assert proc.stdin is not None
        try:
            for data in chunks:
                proc.stdin.write(data)
                await asyncio.wait_for(proc.stdin.drain(), _SEND_TIMEOUT)
            proc.stdin.close()
            out, err = await asyncio.wait_for(proc.communicate(), _SEND_TIMEOUT)
        except (asyncio.TimeoutError, OSError) as exc:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise TransportError(f"sending a file through {argv[0]} failed: {exc!r}") from None
        return CommandResult(tuple(argv), proc.returncode or 0, _text(out), _text(err))

    async def forward(self, remote_host: str, remote_port: int) -> Forward:
        # On the login node the cluster network is reachable directly.
        return Forward(remote_host, remote_port, remote_host, remote_port, direct=True)


def _without_slurm_variables() -> dict[str, str]:
    """This process's environment for a command: no Slurm variable but SLURM_CONF."""
    return command_environment(os.environ, in_own_job=False)


def remote_command(argv: Sequence[str]) -> str:
    """The command line an SSH server runs for ``argv``: quoted, and started without the
    login shell's Slurm variables (a login node's shell may itself be inside a job)."""
    return shlex.join(["sh", "-c", _WITHOUT_SLURM_VARIABLES, "sh", *argv])


def _text(data: bytes) -> str:
    """Command output as text: bytes that are not UTF-8 (a setup line printing Latin-1)
    become U+FFFD instead of failing whatever reads them."""
    return data.decode("utf-8", errors="replace")


def tar_base64(files: Mapping[str, str]) -> str:
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
    arguments override them. A dropped connection is re-opened on the next command. Port
    forwards keep their local listener across reconnects: each new local connection is
    tunnelled through whatever connection is current (see :meth:`forward`).
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
        self._relays: set[asyncio.Task[None]] = set()
        self.connects = 0  # how many connections were opened, for tests and benchmarks

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

    @property
    def connected(self) -> bool:
        return self._conn is not None and not self._conn.is_closed()

    async def _connection(self) -> Any:
        async with self._lock:
            if self.connected:
                return self._conn
            if self._conn is not None:
                log.info("SSH connection to %s was lost; reconnecting", self.target)
            self._conn = await self._open()
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

    async def _execute(self, argv: list[str], input: str | None, timeout: float) -> CommandResult:
        import asyncssh

        command = remote_command(argv)
        for attempt in (1, 2):
            conn = await self._connection()
            try:
                proc = await conn.create_process(
                    command, stderr=asyncssh.PIPE, encoding="utf-8", errors="replace"
                )
            except (asyncssh.ChannelOpenError, asyncssh.ConnectionLost, OSError) as exc:
                # The channel never opened, so the command did not run: safe to retry once.
                conn.close()
                if attempt == 2:
                    raise TransportError(f"{self.target}: {exc}") from None
                continue
            return await self._finish(proc, argv, input, timeout)
        raise AssertionError("unreachable")

    async def _finish(
        self, proc: Any, argv: list[str], input: str | None, timeout: float
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
        return CommandResult(
            tuple(argv), returncode, str(completed.stdout or ""), str(completed.stderr or "")
        )

    async def _stream(self, argv: list[str], chunks: Iterator[bytes]) -> CommandResult:
        import asyncssh

        conn = await self._connection()
        try:
            proc = await conn.create_process(remote_command(argv), encoding=None)
            for data in chunks:
                proc.stdin.write(data)
                await asyncio.wait_for(proc.stdin.drain(), _SEND_TIMEOUT)
            proc.stdin.write_eof()
            completed = await asyncio.wait_for(proc.wait(), _SEND_TIMEOUT)
        except (asyncio.TimeoutError, asyncssh.Error, OSError) as exc:
            raise TransportError(f"{self.target}: sending a file failed: {exc!r}") from None
        code = completed.exit_status if (completed.exit_status or 0) >= 0 else 255
        out, err = (_text(x or b"") for x in (completed.stdout, completed.stderr))
        return CommandResult(tuple(argv), code if code is not None else 255, out, err)

    async def forward(self, remote_host: str, remote_port: int) -> Forward:
        """A local listener whose connections are tunnelled to ``remote_host:remote_port``.

        Written here rather than with asyncssh's ``forward_local_port``, whose listener belongs
        to one connection and closes with it: after a drop its port would be free for any
        local process to take, and a reconnecting Ray Client would hand that process the
        cluster's token. This listener stays open until closed, and tunnels each new
        connection through the current SSH connection (reconnecting when needed).
        """
        await self._connection()  # fail here, not on the first use, when SSH does not work

        async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            self._relays.add(task)
            try:
                await self._relay(reader, writer, remote_host, remote_port)
            finally:
                self._relays.discard(task)

        server = await asyncio.start_server(relay, "127.0.0.1", 0)
        local_port = server.sockets[0].getsockname()[1]
        fwd = Forward("127.0.0.1", local_port, remote_host, remote_port, server)
        self._forwards.append(fwd)
        return fwd

    async def _relay(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        remote_host: str,
        remote_port: int,
    ) -> None:
        import asyncssh

        try:
            conn = await self._connection()
            remote_reader, remote_writer = await conn.open_connection(remote_host, remote_port)
        except (TransportError, asyncssh.Error, OSError) as exc:
            log.info("tunnel to %s:%d not opened: %s", remote_host, remote_port, exc)
            writer.close()
            return
        try:
            await asyncio.gather(_pipe(reader, remote_writer), _pipe(remote_reader, writer))
        finally:
            for end in (writer, remote_writer):
                with contextlib.suppress(Exception):
                    end.close()

    @property
    def open_forwards(self) -> list[Forward]:
        return [f for f in self._forwards if f.is_open]

    async def close(self) -> None:
        for fwd in self._forwards:
            fwd.close()
        self._forwards.clear()
        for task in list(self._relays):
            task.cancel()
        if self._conn is not None:
            self._conn.close()
            with contextlib.suppress(Exception):
                await self._conn.wait_closed()
            self._conn = None


async def _pipe(source: Any, sink: Any) -> None:
    """Copy one direction of a tunnelled connection until end of file, then pass the EOF on."""
    try:
        while True:
            data = await source.read(65536)
            if not data:
                break
            sink.write(data)
            await sink.drain()
        if sink.can_write_eof():
            sink.write_eof()
    except Exception as exc:  # socket errors, or asyncssh's when the connection is lost
        log.debug("tunnel closed: %r", exc)
        with contextlib.suppress(Exception):
            sink.close()
