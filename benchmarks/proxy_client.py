"""The proxy's client to the heads against aiohttp's pooled ``ClientSession``, in one process.

Why ``server/keepalive.py`` exists rather than aiohttp's client: for each, the CPU time of one
proxied request (a small JSON answer, read whole, on a kept-alive connection) against an aiohttp
server like Ray's dashboard in another process (medians of interleaved rounds); and whether it
hands an answer the head sent while the connection sat idle in the pool to the next request
(a desynchronised head; aio-libs/aiohttp#13656).

No testbed needed:
    python benchmarks/proxy_client.py
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.results import write_result
from jupyter_slurm_ray.server.keepalive import KeepAliveClient

HOST = "127.0.0.1"
HEADERS = {"Accept": "application/json", "X-Ray-Authorization": "Bearer t"}
PATH = "/api/cluster_status"

DASHBOARD_LIKE = r"""
import json, sys
from aiohttp import web
body = json.dumps({"result": True, "msg": "", "data": {"autoscalerReport": "x" * 600}}).encode()
async def answer(request):
    return web.Response(body=body, content_type="application/json")
app = web.Application()
app.router.add_get("/{tail:.*}", answer)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""


def aiohttp_session() -> aiohttp.ClientSession:
    """aiohttp's client as the proxy would use it: pooled, no proxy variables, no cookies,
    bodies as they come."""
    return aiohttp.ClientSession(
        trust_env=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        auto_decompress=False,
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
        connector=aiohttp.TCPConnector(limit_per_host=32, keepalive_timeout=15),
    )


async def ours(client: KeepAliveClient, port: int, path: str = PATH) -> bytes:
    answer = await client.request(HOST, port, "GET", path, list(HEADERS.items()))
    return await answer.read(2**20)


async def theirs(session: aiohttp.ClientSession, port: int, path: str = PATH) -> bytes:
    async with session.get(f"http://{HOST}:{port}{path}", headers=HEADERS) as response:
        return b"".join([chunk async for chunk in response.content.iter_any()])


async def cpu_per_request(fetch: Callable[[], Awaitable[bytes]], requests: int) -> float:
    started = time.process_time()
    for _ in range(requests):
        await fetch()
    return (time.process_time() - started) / requests * 1000


async def desynchronised(fetch: Callable[[int, str], Awaitable[bytes]]) -> bool:
    """True when an answer sent while the connection was idle reached the next request."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nright")
            await writer.drain()
            await asyncio.sleep(0.2)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nWRONG")

    server = await asyncio.start_server(serve, HOST, 0)
    port = server.sockets[0].getsockname()[1]
    try:
        await fetch(port, "/first")
        await asyncio.sleep(0.5)
        return await fetch(port, "/next") == b"WRONG"
    finally:
        server.close()


async def main(requests: int, rounds: int, port: int) -> None:
    head = subprocess.Popen([sys.executable, "-c", DASHBOARD_LIKE, str(port)])
    client, session = KeepAliveClient(), aiohttp_session()
    try:
        await asyncio.sleep(2)
        clients = {
            "server/keepalive.py": lambda: ours(client, port),
            "aiohttp ClientSession": lambda: theirs(session, port),
        }
        samples: dict[str, list[float]] = {name: [] for name in clients}
        for fetch in clients.values():
            await cpu_per_request(fetch, 200)  # warm up: connections, code paths
        for _ in range(rounds):
            for name, fetch in clients.items():
                samples[name].append(await cpu_per_request(fetch, requests))
        figures: dict[str, object] = {"requests": requests, "rounds": rounds}
        for name, values in samples.items():
            ms = statistics.median(values)
            print(f"{name:24} {ms:.3f} ms of CPU per request (medians of {rounds} rounds)")
            figures[f"{name} CPU ms per request"] = ms
        fresh_client = KeepAliveClient()
        ours_desync = await desynchronised(lambda port, path: ours(fresh_client, port, path))
        await fresh_client.close()
        async with aiohttp_session() as fresh:
            theirs_desync = await desynchronised(lambda port, path: theirs(fresh, port, path))
        for name, desync in (("server/keepalive.py", ours_desync), ("aiohttp", theirs_desync)):
            said = "hands it to the next request" if desync else "drops the connection"
            print(f"{name}: an answer sent while the connection was idle: {said}")
        figures["desync"] = {"ours": ours_desync, "aiohttp": theirs_desync}
        write_result("proxy_client", figures)
    finally:
        await session.close()
        await client.close()
        head.terminate()
        head.wait(10)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--port", type=int, default=18765)
    args = parser.parse_args()
    asyncio.run(main(args.requests, args.rounds, args.port))
