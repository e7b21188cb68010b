"""The head's dashboard relay: HTTPS with the head's certificate in front of Ray's dashboard.

Ray's dashboard speaks plain HTTP, and a client on another host cannot see whose listener
answers on the head's dashboard port: after the dashboard died, a neighbour who took the port
would receive the token of the next request. So every caller that is not on the head (the
kernel, the Jupyter server's proxy, Ray's Jobs client, ``ray job`` through ``slurm_ray://``)
talks to this relay instead. It listens on a port the kernel chose, on the head's address,
with TLS and the head's certificate: a client checks that certificate against the cluster's
CA before it sends a byte, so whoever takes the relay's port after the head is gone gets a
ClientHello and nothing else.

Each accepted connection is relayed to the dashboard only once the listener that accepted
the relay's own connection is the one verified as this job's Ray (``verified()``: the
dashboard's port and sockets, checked after the connection is open: a listener that took the
port before cannot be the one that accepted it). Bytes go on as they come, both ways
(websockets, log streams), in a thread of the head's bootstrap.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import sys
import threading
from collections.abc import Callable

from jsr_wire import TlsFiles
from listeners import still_listening

Target = Callable[[], tuple[int, frozenset[int]] | None]  # the dashboard's port and sockets

HANDSHAKE = 10.0  # s for a client's TLS handshake
CONNECT = 5.0  # s to open the connection to the dashboard
CONNECTIONS = 128  # at once; more are closed at once
CHUNK = 64 * 1024


def server_context(tls: TlsFiles) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(tls.cert), str(tls.key))
    return context


class DashboardRelay:
    """HTTPS on ``ip`` (a port the kernel chose) to the dashboard ``target()`` names."""

    def __init__(self, ip: str, tls: TlsFiles, target: Target) -> None:
        self.ip = ip
        self.target = target
        self.context = server_context(tls)
        self.listener = socket.create_server((ip, 0), backlog=CONNECTIONS)
        self.port: int = self.listener.getsockname()[1]
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stopping: asyncio.Event | None = None
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self.run, name="dashboard-relay", daemon=True)
        self.refused = 0  # connections not relayed: no verified dashboard to send them to

    def start(self) -> DashboardRelay:
        self.thread.start()
        self.ready.wait(5)
        return self

    def run(self) -> None:
        self.loop = asyncio.new_event_loop()
        try:
            self.loop.run_until_complete(self.serve())
        except Exception as exc:  # the relay must never take the bootstrap down
            print(f"[bootstrap] the dashboard relay stopped: {exc!r}", file=sys.stderr, flush=True)
        finally:
            self.loop.close()

    async def serve(self) -> None:
        self.stopping = asyncio.Event()
        slots = asyncio.Semaphore(CONNECTIONS)

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            if slots.locked():
                writer.close()
                return
            async with slots:
                await self.relay(reader, writer)

        server = await asyncio.start_server(
            handle, sock=self.listener, ssl=self.context, ssl_handshake_timeout=HANDSHAKE
        )
        self.ready.set()
        await self.stopping.wait()
        server.close()

    async def relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        upstream = await self.open_dashboard()
        if upstream is None:
            self.refused += 1
            close(client_w)
            return
        dash_r, dash_w = upstream
        done = asyncio.Event()
        await asyncio.gather(
            pipe(client_r, dash_w, done), pipe(dash_r, client_w, done), return_exceptions=True
        )

    async def open_dashboard(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """A connection to the verified dashboard, accepted by its verified listener."""
        target = self.target()
        if target is None:
            return None
        port, inodes = target
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(self.ip, port), CONNECT)
        except (OSError, asyncio.TimeoutError):
            return None
        if not await asyncio.to_thread(still_listening, self.ip, port, inodes):
            close(writer)
            return None
        return reader, writer

    def stop(self) -> None:
        if self.loop is not None and self.stopping is not None:
            with contextlib.suppress(RuntimeError):  # its loop already ended
                self.loop.call_soon_threadsafe(self.stopping.set)
        self.thread.join(2)
        with contextlib.suppress(OSError):
            self.listener.close()


async def pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, done: asyncio.Event
) -> None:
    """Bytes from ``reader`` to ``writer`` until either side ends; then both close."""
    try:
        while not done.is_set():
            chunk = await reader.read(CHUNK)
            if not chunk:
                break
            writer.write(chunk)
            await writer.drain()
    except (OSError, ssl.SSLError, asyncio.IncompleteReadError):
        pass
    finally:
        done.set()
        close(writer)


def close(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, RuntimeError):
        writer.close()
