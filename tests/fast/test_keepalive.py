"""The proxy's kept-alive client to the heads (server/keepalive.py), against real HTTP servers
on loopback: aiohttp's (the dashboard's own server) and raw asyncio ones for the odd cases."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from jupyter_slurm_ray.server.keepalive import HeadGone, KeepAliveClient, request_head

Raw = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@pytest.fixture
async def head() -> AsyncIterator[tuple[int, list[dict]]]:
    """An aiohttp server like a dashboard: its port, and what each request carried."""
    seen: list[dict] = []

    async def answer(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        seen.append(
            {
                "method": request.method,
                "path": request.path_qs,
                "headers": dict(request.headers),
                "body": body,
                "peer": request.transport.get_extra_info("peername"),
            }
        )
        if request.path == "/chunked":
            reply = web.StreamResponse(headers={"Content-Type": "text/plain"})
            reply.enable_chunked_encoding()
            await reply.prepare(request)
            for part in (b"one ", b"two ", b"three"):
                await reply.write(part)
            await reply.write_eof()
            return reply
        if request.path == "/slow":
            await asyncio.sleep(1.5)
        return web.json_response({"path": request.path_qs, "body": body.decode()})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield port, seen
    await runner.cleanup()


async def raw_server(serve: Raw) -> tuple[asyncio.Server, int]:
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def test_answers_come_whole_and_the_connection_is_kept(head):
    port, seen = head
    client = KeepAliveClient()
    first = await client.send("127.0.0.1", port, "GET", "/api/a?x=1", [("Accept", "*/*")])
    second = await client.send("127.0.0.1", port, "POST", "/api/b", [], b"payload")
    assert first.status == 200 and first.body == b'{"path": "/api/a?x=1", "body": ""}'
    assert second.body == b'{"path": "/api/b", "body": "payload"}'
    assert seen[0]["peer"] == seen[1]["peer"]  # one connection for both
    assert seen[0]["headers"]["Host"] == f"127.0.0.1:{port}"
    assert seen[0]["headers"]["Accept-Encoding"] == "identity"
    await client.close()


async def test_a_chunked_answer_is_joined(head):
    port, _ = head
    client = KeepAliveClient()
    reply = await client.send("127.0.0.1", port, "GET", "/chunked", [])
    assert reply.body == b"one two three" and reply.keep_alive
    await client.close()


async def test_a_head_request_has_no_body_and_does_not_hang(head):
    port, _ = head
    client = KeepAliveClient()
    reply = await client.send("127.0.0.1", port, "HEAD", "/x", [], timeout=5)
    assert reply.status == 200 and reply.body == b""
    assert (await client.send("127.0.0.1", port, "GET", "/y", [])).status == 200
    await client.close()


async def test_hop_headers_and_header_injection_do_not_reach_the_head(head):
    port, seen = head
    client = KeepAliveClient()
    headers = [
        ("Connection", "close"),
        ("Host", "evil.example"),
        ("Expect", "100-continue"),
        ("X-Ok", "yes"),
        ("X-Bad", "a\r\nX-Injected: 1"),
    ]
    await client.send("127.0.0.1", port, "GET", "/h", headers)
    got = seen[0]["headers"]
    assert got["Host"] == f"127.0.0.1:{port}" and got["X-Ok"] == "yes"
    assert "X-Injected" not in got and "X-Bad" not in got and "Expect" not in got
    await client.close()


async def test_a_body_delimited_by_the_close_is_complete():
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it")
        await writer.drain()
        writer.close()

    server, port = await raw_server(serve)
    reply = await KeepAliveClient().send("127.0.0.1", port, "GET", "/", [], timeout=5)
    assert (reply.status, reply.body, reply.keep_alive) == (200, b"all of it", False)
    server.close()


async def test_a_connection_the_head_closed_while_idle_is_replaced_once():
    answered = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        answered.append(writer.get_extra_info("peername"))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()  # keep-alive announced, then closed: the next request must not fail

    server, port = await raw_server(serve)
    client = KeepAliveClient()
    assert (await client.send("127.0.0.1", port, "GET", "/1", [])).body == b"ok"
    await asyncio.sleep(0.1)
    assert (await client.send("127.0.0.1", port, "GET", "/2", [])).body == b"ok"
    assert len(answered) == 2 and answered[0] != answered[1]
    server.close()
    await client.close()


async def test_no_answer_refused_or_garbage_is_head_gone(head):
    port, _ = head
    client = KeepAliveClient()
    with pytest.raises(HeadGone, match=r"no answer within 0\.5 s"):
        await client.send("127.0.0.1", port, "GET", "/slow", [], timeout=0.5)
    server, free = await raw_server(lambda r, w: asyncio.sleep(0))
    server.close()
    await server.wait_closed()
    with pytest.raises(HeadGone, match="cannot connect"):
        await client.send("127.0.0.1", free, "GET", "/", [], timeout=5)

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")
        await writer.drain()

    bad, bad_port = await raw_server(garbage)
    with pytest.raises(HeadGone, match="not valid HTTP"):
        await client.send("127.0.0.1", bad_port, "GET", "/", [], timeout=5)
    bad.close()
    await client.close()


def test_the_request_head_is_what_the_head_needs():
    head = request_head("PUT", "/api/x", "10.0.0.1", 8265, [("Accept", "a")], b"12345")
    assert head == (
        b"PUT /api/x HTTP/1.1\r\nHost: 10.0.0.1:8265\r\nAccept: a\r\n"
        b"Accept-Encoding: identity\r\nContent-Length: 5\r\n\r\n"
    )
