"""The proxy's kept-alive client to the heads (server/keepalive.py, server/answers.py),
against real HTTP servers on loopback: aiohttp's (the dashboard's own server) and a scripted
head (raw asyncio, tests/helpers/scripted_head.py) for what no server does on purpose."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from jupyter_slurm_ray.server.answers import (
    BadAnswer,
    HeadAnswer,
    HeadGone,
    HeadSilent,
    HeadUnreachable,
    end_to_end,
)
from jupyter_slurm_ray.server.keepalive import KeepAliveClient, Limits, request_head

from ..helpers.scripted_head import ScriptedHead, answer, chunk, sends, unanswered_listener

HOST = "127.0.0.1"


@pytest.fixture
async def head() -> AsyncIterator[tuple[int, list[dict]]]:
    """An aiohttp server like a dashboard: its port, and what each request carried."""
    seen: list[dict] = []

    async def answer_it(request: web.Request) -> web.StreamResponse:
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
        return web.json_response({"path": request.path_qs, "body": body.decode()})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer_it)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, HOST, 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield port, seen
    await runner.cleanup()


@pytest.fixture
async def scripted() -> AsyncIterator[ScriptedHead]:
    head = await ScriptedHead({}).start()
    yield head
    await head.stop()


@pytest.fixture
async def client() -> AsyncIterator[KeepAliveClient]:
    client = KeepAliveClient(Limits(connect_seconds=0.5, answer_seconds=2))
    yield client
    await client.close()


async def whole(answer: HeadAnswer) -> bytes:
    return await answer.read(2**30)


async def get(client: KeepAliveClient, port: int, path: str, **kwargs) -> HeadAnswer:
    return await client.request(HOST, port, "GET", path, kwargs.pop("headers", []), **kwargs)


# -- the everyday exchange --------------------------------------------------------------------
async def test_answers_come_whole_and_the_connection_is_kept(head, client):
    port, seen = head
    first = await client.request(HOST, port, "GET", "/api/a?x=1", [("Accept", "*/*")])
    assert first.status == 200 and await whole(first) == b'{"path": "/api/a?x=1", "body": ""}'
    second = await client.request(HOST, port, "POST", "/api/b", [], b"payload")
    assert await whole(second) == b'{"path": "/api/b", "body": "payload"}'
    assert seen[0]["peer"] == seen[1]["peer"]  # one connection for both
    assert seen[0]["headers"]["Host"] == f"127.0.0.1:{port}"
    assert seen[0]["headers"]["Accept-Encoding"] == "identity"


async def test_a_chunked_answer_is_joined(head, client):
    port, seen = head
    reply = await get(client, port, "/chunked")
    assert await whole(reply) == b"one two three"
    await whole(await get(client, port, "/again"))
    assert seen[0]["peer"] == seen[1]["peer"]  # kept alive after a chunked answer


async def test_a_head_request_has_no_body_and_does_not_hang(head, client):
    port, _ = head
    reply = await client.request(HOST, port, "HEAD", "/x", [])
    assert reply.status == 200 and await whole(reply) == b""
    assert (await get(client, port, "/y")).status == 200


async def test_a_body_delimited_by_the_close_is_complete(scripted, client):
    async def close_delimited(reader, writer) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it")
        await writer.drain()
        writer.close()

    scripted.scripts["/"] = close_delimited
    reply = await get(client, scripted.port, "/")
    assert (reply.status, await whole(reply)) == (200, b"all of it")
    assert client.idle(HOST, scripted.port) == 0


async def test_a_connection_the_head_closed_while_idle_is_replaced_once(scripted, client):
    async def then_close(reader, writer) -> None:
        writer.write(answer("200 OK", body=b"ok"))
        await writer.drain()
        writer.close()  # keep-alive announced, then closed: the next request must not fail

    scripted.scripts["/1"] = scripted.scripts["/2"] = then_close
    assert await whole(await get(client, scripted.port, "/1")) == b"ok"
    await asyncio.sleep(0.1)
    assert client.idle(HOST, scripted.port) == 0  # out of the pool as soon as it closed
    assert await whole(await get(client, scripted.port, "/2")) == b"ok"
    assert [r.connection for r in scripted.requests] == [1, 2]


# -- desynchronisation: anything beyond the answer in flight ----------------------------------
OK = answer("200 OK", [("Content-Type", "text/plain")], b"right")
EVIL = answer("200 OK", [("Content-Type", "text/plain")], b"EVIL!")


@pytest.mark.parametrize(
    "extra",
    [EVIL, EVIL[:20], b"XYZ", b"\r\n" + EVIL],
    ids=["a second answer", "part of one", "junk", "a blank line and an answer"],
)
async def test_extra_bytes_after_an_answer_are_never_read_as_the_next_one(scripted, client, extra):
    scripted.scripts["/first"] = sends(OK, extra)
    scripted.scripts["/next"] = sends(OK)
    first = await get(client, scripted.port, "/first")
    assert await whole(first) == b"right"
    await asyncio.sleep(0.1)
    assert client.idle(HOST, scripted.port) == 0  # dropped, not pooled
    second = await get(client, scripted.port, "/next")
    assert await whole(second) == b"right"
    assert [r.connection for r in scripted.requests] == [1, 2]  # a fresh connection
    assert 1 in scripted.closed


async def test_an_answer_sent_while_the_connection_is_idle_closes_it(scripted, client):
    async def answer_twice(reader, writer) -> None:
        writer.write(OK)
        await writer.drain()
        await asyncio.sleep(0.2)  # the first answer is read and the connection pooled
        writer.write(EVIL)
        await writer.drain()

    scripted.scripts["/first"] = answer_twice
    scripted.scripts["/next"] = sends(OK)
    assert await whole(await get(client, scripted.port, "/first")) == b"right"
    assert client.idle(HOST, scripted.port) == 1
    await asyncio.sleep(0.4)
    assert client.idle(HOST, scripted.port) == 0
    assert await whole(await get(client, scripted.port, "/next")) == b"right"
    assert [r.connection for r in scripted.requests] == [1, 2]


async def test_body_bytes_beyond_the_content_length_close_the_connection(scripted, client):
    scripted.scripts["/first"] = sends(answer("200 OK", [("Content-Length", "2")], b"okMORE"))
    scripted.scripts["/next"] = sends(OK)
    assert await whole(await get(client, scripted.port, "/first")) == b"ok"
    assert await whole(await get(client, scripted.port, "/next")) == b"right"
    assert [r.connection for r in scripted.requests] == [1, 2]


# -- interim answers --------------------------------------------------------------------------
async def test_interim_answers_are_skipped_never_taken_for_the_final_one(scripted, client):
    interim = (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 102 Processing\r\n\r\n"
        b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"
    )
    scripted.scripts["/"] = sends(interim, answer("201 Created", [("X-Final", "yes")], b"done"))
    reply = await client.request(HOST, scripted.port, "POST", "/", [], b"{}")
    assert (reply.status, reply.reason) == (201, "Created")
    assert reply.header("X-Final") == "yes" and reply.header("Link") is None
    assert await whole(reply) == b"done"
    assert await whole(await get(client, scripted.port, "/")) == b"done"  # still in step
    assert [r.connection for r in scripted.requests] == [1, 1]


async def test_interim_answers_arriving_one_by_one_are_skipped(scripted, client):
    async def slowly(reader, writer) -> None:
        for part in (b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 103 Early", b" Hints\r\n\r\n"):
            writer.write(part)
            await writer.drain()
            await asyncio.sleep(0.05)
        writer.write(OK)

    scripted.scripts["/"] = slowly
    assert await whole(await get(client, scripted.port, "/")) == b"right"


async def test_switching_protocols_or_endless_interim_answers_are_refused(scripted, client):
    scripted.scripts["/101"] = sends(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n")
    scripted.scripts["/many"] = sends(b"HTTP/1.1 100 Continue\r\n\r\n" * 50, OK)
    with pytest.raises(BadAnswer, match="switched protocols"):
        await get(client, scripted.port, "/101")
    with pytest.raises(BadAnswer, match="more than 8 1xx answers"):
        await get(client, scripted.port, "/many")


# -- limits -----------------------------------------------------------------------------------
async def test_headers_over_the_limit_are_refused(scripted, client):
    scripted.scripts["/big"] = sends(answer("200 OK", [("X-Big", "a" * 70_000)], b"x"))
    scripted.scripts["/many"] = sends(answer("200 OK", [(f"X-{i}", "1") for i in range(200)]))
    with pytest.raises(BadAnswer, match="headers are larger than 64 KB"):
        await get(client, scripted.port, "/big")
    with pytest.raises(BadAnswer, match="more than 128 headers"):
        await get(client, scripted.port, "/many")
    assert client.idle(HOST, scripted.port) == 0


async def test_a_header_that_never_ends_is_refused_once_over_the_limit(scripted, client):
    async def drip(reader, writer) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nX-Endless: ")
        for _ in range(100):  # 100 × 1 KB: refused after 64 of them
            writer.write(b"a" * 1024)
            await writer.drain()
            await asyncio.sleep(0.005)

    scripted.scripts["/"] = drip
    with pytest.raises(BadAnswer, match="headers are larger than 64 KB"):
        await get(client, scripted.port, "/")


def later(head: bytes, *body: bytes):
    """A script that sends the answer's head, then each part of its body a moment later."""

    async def script(reader, writer) -> None:
        for part in (head, *body):
            writer.write(part)
            await writer.drain()
            await asyncio.sleep(0.1)

    return script


async def test_a_body_held_whole_is_limited(scripted, client):
    big = b"x" * 5000
    declared = answer("200 OK", body=big)
    scripted.scripts["/declared"] = later(declared[: -len(big)], big[:3000], big[3000:])
    chunked = answer("200 OK", [("Transfer-Encoding", "chunked")])
    scripted.scripts["/chunked"] = later(chunked, chunk(big[:3000]), chunk(big[3000:]), chunk(b""))
    for path in ("/declared", "/chunked"):
        reply = await get(client, scripted.port, path)
        with pytest.raises(BadAnswer, match=r"body .*larger than 4 KB"):
            await reply.read(4096)
    await asyncio.sleep(0.3)
    assert client.idle(HOST, scripted.port) == 0  # the unread rest: closed, not reused
    assert sorted(scripted.closed) == [1, 2]


# -- timeouts: connecting, then waiting for the answer ----------------------------------------
async def test_a_connect_that_hangs_is_unreachable_after_the_connect_timeout(client):
    with (
        unanswered_listener() as port,
        pytest.raises(HeadUnreachable, match=r"no connection to 127\.0\.0\.1:\d+ within 0\.5 s"),
    ):
        await get(client, port, "/")


async def test_a_head_that_accepts_but_does_not_answer_is_silent(scripted, client):
    async def never(reader, writer) -> None:
        await asyncio.sleep(30)

    scripted.scripts["/"] = never
    with pytest.raises(HeadSilent, match=r"no answer within 2 s"):
        await get(client, scripted.port, "/")


async def test_refused_connections_and_garbage_are_told_apart(scripted, client):
    server = await asyncio.start_server(lambda r, w: None, HOST, 0)
    free = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    with pytest.raises(HeadUnreachable, match="cannot connect"):
        await get(client, free, "/")
    scripted.scripts["/"] = sends(b"SSH-2.0-OpenSSH\r\n\r\n")
    with pytest.raises(BadAnswer, match="not valid HTTP"):
        await get(client, scripted.port, "/")


async def test_a_quiet_stream_has_no_read_timeout(scripted):
    async def quiet(reader, writer) -> None:
        writer.write(answer("200 OK", [("Transfer-Encoding", "chunked")]))
        for i in range(3):
            await writer.drain()
            await asyncio.sleep(0.5)  # longer than the answer timeout below
            writer.write(chunk(b"line %d\n" % i))
        writer.write(chunk(b""))

    scripted.scripts["/stream"] = quiet
    client = KeepAliveClient(Limits(answer_seconds=0.3))
    reply = await get(client, scripted.port, "/stream")
    assert await whole(reply) == b"line 0\nline 1\nline 2\n"
    await client.close()


# -- streaming --------------------------------------------------------------------------------
async def test_a_body_is_handed_over_as_it_arrives(scripted, client):
    release = asyncio.Event()

    async def stepwise(reader, writer) -> None:
        writer.write(answer("200 OK", [("Transfer-Encoding", "chunked")]) + chunk(b"first"))
        await writer.drain()
        await release.wait()
        writer.write(chunk(b"second") + chunk(b""))

    scripted.scripts["/"] = stepwise
    reply = await get(client, scripted.port, "/")
    assert await reply.next() == b"first"  # before the head has finished
    assert not reply.complete
    release.set()
    assert await reply.next() == b"second" and await reply.next() == b""


async def test_reading_pauses_when_the_reader_falls_behind(scripted):
    total = 32 * 2**20
    written = []

    async def flood(reader, writer) -> None:
        writer.write(answer("200 OK", [("Content-Length", str(total))]))
        piece = b"x" * 2**20
        for _ in range(32):
            writer.write(piece)
            await writer.drain()  # blocks while the client does not read
            written.append(len(piece))

    scripted.scripts["/"] = flood
    client = KeepAliveClient(Limits(read_ahead_bytes=256 * 1024))
    reply = await get(client, scripted.port, "/")
    await asyncio.sleep(0.5)  # nobody reads
    assert reply._buffered < 2 * 2**20, reply._buffered  # read ahead, then paused
    assert sum(written) < total / 2
    size = 0
    while piece := await reply.next():
        size += len(piece)
    assert size == total
    await client.close()


async def test_a_body_cut_short_is_an_error_not_an_end(scripted, client):
    async def cut(reader, writer) -> None:
        writer.write(answer("200 OK", [("Content-Length", "100")]) + b"only part")
        await writer.drain()
        writer.close()

    scripted.scripts["/"] = cut
    reply = await get(client, scripted.port, "/")
    assert await reply.next() == b"only part"
    with pytest.raises(HeadGone, match="in the middle of its answer") as cut_short:
        await reply.next()
    assert cut_short.value.answered


async def test_an_abandoned_answer_closes_its_connection(scripted, client):
    async def endless(reader, writer) -> None:
        writer.write(answer("200 OK", [("Transfer-Encoding", "chunked")]))
        while True:
            writer.write(chunk(b"tick\n"))
            await writer.drain()
            await asyncio.sleep(0.05)

    scripted.scripts["/"] = endless
    reply = await get(client, scripted.port, "/")
    assert await reply.next()
    reply.abandon()
    for _ in range(50):
        if scripted.closed:
            break
        await asyncio.sleep(0.05)
    assert scripted.closed == [1]


# -- headers ----------------------------------------------------------------------------------
async def test_hop_headers_and_header_injection_do_not_reach_the_head(head, client):
    port, seen = head
    headers = [
        ("Connection", "close, X-Per-Hop"),
        ("X-Per-Hop", "named by Connection"),
        ("Keep-Alive", "timeout=5"),
        ("TE", "trailers"),
        ("Proxy-Authorization", "Basic eA=="),
        ("Host", "evil.example"),
        ("Expect", "100-continue"),
        ("X-Ok", "yes"),
        ("X-Bad", "a\r\nX-Injected: 1"),
    ]
    await whole(await client.request(HOST, port, "GET", "/h", headers))
    got = seen[0]["headers"]
    assert got["Host"] == f"127.0.0.1:{port}" and got["X-Ok"] == "yes"
    for name in ("X-Injected", "X-Bad", "Expect", "X-Per-Hop", "Keep-Alive", "TE"):
        assert name not in got, name
    assert "Proxy-Authorization" not in got


async def test_hop_headers_of_the_answer_are_dropped(scripted, client):
    headers = [
        ("Connection", "keep-alive, X-Internal"),
        ("X-Internal", "named by Connection"),
        ("Keep-Alive", "timeout=75"),
        ("Proxy-Authenticate", "Basic"),
        ("Trailer", "X-Checksum"),
        ("Content-Type", "text/plain"),
    ]
    scripted.scripts["/"] = sends(answer("200 OK", headers, b"body"))
    reply = await get(client, scripted.port, "/")
    assert [name for name, _ in reply.headers] == ["Content-Type", "Content-Length"]


def test_end_to_end_headers_are_what_connection_does_not_name():
    headers = [("Connection", "X-A , x-b"), ("X-A", "1"), ("X-B", "2"), ("X-C", "3")]
    assert end_to_end(headers) == [("X-C", "3")]


def test_the_request_head_is_what_the_head_needs():
    head = request_head("PUT", "/api/x", "10.0.0.1", 8265, [("Accept", "a")], b"12345")
    assert head == (
        b"PUT /api/x HTTP/1.1\r\nHost: 10.0.0.1:8265\r\nAccept: a\r\n"
        b"Accept-Encoding: identity\r\nContent-Length: 5\r\n\r\n"
    )


# -- the pool ---------------------------------------------------------------------------------
async def test_dropping_a_head_empties_its_pool_now_and_after_requests_in_flight(scripted, client):
    gate = asyncio.Event()

    async def held(reader, writer) -> None:
        writer.write(answer("200 OK", [("Transfer-Encoding", "chunked")]))
        await writer.drain()
        await gate.wait()
        writer.write(chunk(b"late") + chunk(b""))

    scripted.scripts["/ok"] = sends(OK)
    scripted.scripts["/held"] = held
    await whole(await get(client, scripted.port, "/ok"))
    in_flight = await get(client, scripted.port, "/held")  # a second connection
    await whole(await get(client, scripted.port, "/ok"))  # the first, reused
    assert client.idle(HOST, scripted.port) == 1
    client.drop(HOST, scripted.port)
    assert client.idle(HOST, scripted.port) == 0
    gate.set()
    assert await whole(in_flight) == b"late"
    assert client.idle(HOST, scripted.port) == 0  # finished after the drop: not pooled
    for _ in range(50):
        if len(scripted.closed) == 2:
            break
        await asyncio.sleep(0.05)
    assert sorted(scripted.closed) == [1, 2]


async def test_an_idle_connection_is_closed_after_the_idle_time(scripted):
    scripted.scripts["/"] = sends(OK)
    client = KeepAliveClient(Limits(idle_seconds=0.2))
    await whole(await get(client, scripted.port, "/"))
    assert client.idle(HOST, scripted.port) == 1
    await asyncio.sleep(0.5)
    assert client.idle(HOST, scripted.port) == 0 and scripted.closed == [1]
    await client.close()
