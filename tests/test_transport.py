"""Both transports against the real login node: argv safety, files, timeouts, SSH failures."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import asyncssh
import pytest

from jupyter_slurm_ray.errors import CommandError, TransportError

from .helpers.testbed import SSH_HOST, node_ip, ssh_transport

pytestmark = pytest.mark.testbed

HOSTILE = ["$(touch /tmp/jsr-pwned)", "a; touch /tmp/jsr-pwned", "`id`", 'it\'s "quoted"', "x\ny"]


async def test_argv_reaches_the_command_verbatim(transport):
    result = await transport.run(["printf", "%s\\0", *HOSTILE])
    assert result.stdout.split("\0")[:-1] == HOSTILE
    assert not Path("/tmp/jsr-pwned").exists()


async def test_commands_run_as_the_unprivileged_user(transport, testbed):
    assert (await transport.run(["id", "-un"])).stdout.strip() == testbed.user
    assert await transport.home() == f"/home/{testbed.user}"


async def test_nonzero_exit_raises_with_the_commands_words(transport):
    with pytest.raises(CommandError, match="No such file"):
        await transport.run(["ls", "/nonexistent-dir"])
    result = await transport.run(["sh", "-c", "exit 7"], check=False)
    assert result.returncode == 7


async def test_files_are_written_atomically_with_their_mode(transport, unique_name):
    base = f"{await transport.home()}/.jsr-test-{unique_name}"
    await transport.make_dir(f"{base}/deep/dir", 0o700)
    path = f"{base}/deep/dir/file; rm -rf ~"
    await transport.write_file(path, "secret\n", 0o600)
    assert await transport.read_file(path) == "secret\n"
    st = os.stat(path)
    assert (st.st_mode & 0o777, st.st_uid) == (0o600, Path(base).stat().st_uid)
    assert os.stat(base).st_mode & 0o777 == 0o700
    await transport.write_file(path, "replaced", 0o640)
    assert await transport.read_file(path) == "replaced"
    assert os.stat(path).st_mode & 0o777 == 0o640
    assert sorted(os.listdir(f"{base}/deep/dir")) == ["file; rm -rf ~"]  # no temp files left
    await transport.run(["rm", "-rf", "--", base])


async def test_many_files_are_written_in_one_command_with_private_modes(transport, unique_name):
    base = f"{await transport.home()}/.jsr-test-{unique_name}"
    files = {"a.py": "print('é')\n", "sub/b.txt": "two\nlines\n", "empty": ""}
    await transport.write_files(base, files)
    for name, text in files.items():
        assert await transport.read_file(f"{base}/{name}") == text
        assert os.stat(f"{base}/{name}").st_mode & 0o777 == 0o600
    for directory in (base, f"{base}/sub"):
        assert os.stat(directory).st_mode & 0o777 == 0o700
    assert os.stat(f"{base}/a.py").st_uid == os.stat(base).st_uid != 0
    await transport.run(["rm", "-rf", "--", base])


async def test_read_from_returns_only_whole_new_lines(transport, unique_name):
    path = f"{await transport.home()}/.jsr-test-{unique_name}.jsonl"
    await transport.write_file(path, '{"a": 1}\n{"b": 2}\n{"c"', 0o600)
    text, offset = await transport.read_from(path, 0)
    assert text == '{"a": 1}\n{"b": 2}\n'
    await transport.run(["sh", "-c", 'printf ": 3}\\n" >> "$1"', "sh", path])
    text, offset = await transport.read_from(path, offset)
    assert text == '{"c": 3}\n'
    assert await transport.read_from(path, offset) == ("", offset)
    assert await transport.read_from(path + ".missing", 0) == ("", 0)
    await transport.run(["rm", "-f", "--", path])


async def test_a_command_that_hangs_is_stopped_at_its_timeout(transport):
    started = time.monotonic()
    with pytest.raises(TransportError, match="did not finish within 1 s"):
        await transport.run(["sleep", "30"], timeout=1)
    assert time.monotonic() - started < 5


async def test_ssh_reuses_one_connection_for_many_and_concurrent_commands(ssh):
    results = await asyncio.gather(*(ssh.run(["echo", str(i)]) for i in range(8)))
    assert [r.stdout.strip() for r in results] == [str(i) for i in range(8)]
    for _ in range(5):
        await ssh.run(["true"])
    assert ssh.connects == 1


async def test_ssh_unknown_host_key_is_refused_clearly(testbed, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    started = time.monotonic()
    async with ssh_transport(testbed, known_hosts=str(empty)) as t:
        with pytest.raises(TransportError, match="host key is not trusted"):
            await t.run(["true"])
    assert time.monotonic() - started < 10


async def test_ssh_wrong_key_is_refused_clearly(testbed, tmp_path):
    key = asyncssh.generate_private_key("ssh-ed25519")
    key.write_private_key(str(tmp_path / "wrong"))
    started = time.monotonic()
    async with ssh_transport(testbed, client_keys=[str(tmp_path / "wrong")]) as t:
        with pytest.raises(TransportError, match="login refused"):
            await t.run(["true"])
    assert time.monotonic() - started < 10


@pytest.mark.parametrize(
    ("host", "port", "message"),
    [(node_ip(89), 22, "no answer within 3 s"), (SSH_HOST, 2, "cannot connect")],
    ids=["silent-host", "closed-port"],
)
async def test_ssh_unreachable_host_fails_in_bounded_time(testbed, host, port, message):
    started = time.monotonic()
    async with ssh_transport(testbed, connect_timeout=3, port=port) as t:
        t.host = host
        with pytest.raises(TransportError, match=message):
            await t.run(["true"])
    assert time.monotonic() - started < 10


def _sshd_children() -> set[int]:
    master = Path("/run/jsr-testbed/sshd.pid").read_text().strip()
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", master], capture_output=True, text=True)
    return {int(p) for p in out.stdout.split()}


async def test_ssh_reconnects_after_the_server_dropped_the_connection(ssh):
    before = _sshd_children()
    assert (await ssh.run(["echo", "one"])).stdout == "one\n"
    ours = _sshd_children() - before
    assert len(ours) == 1
    os.kill(ours.pop(), signal.SIGTERM)  # the server side of our connection goes away
    for _ in range(50):
        if ssh._conn.is_closed():
            break
        await asyncio.sleep(0.1)
    assert (await ssh.run(["echo", "two"])).stdout == "two\n"
    assert ssh.connects == 2


@pytest.fixture
def echo_server_on_node1(testbed):
    """A TCP echo server as the test user inside node1 (reachable from the login node only)."""
    code = (
        "import socket,sys\n"
        f"s=socket.socket(); s.bind(({node_ip(1)!r},0)); s.listen()\n"
        "print(s.getsockname()[1], flush=True)\n"
        "c,_=s.accept(); c.sendall(c.recv(100).upper()); c.close()\n"
    )
    proc = subprocess.Popen(
        ["nsenter", "--net=/run/netns/jsr-node1", "runuser", "-u", testbed.user, "--",
         sys.executable, "-c", code],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    port = int(proc.stdout.readline())
    yield port
    proc.kill()
    proc.wait()


async def test_ssh_forwards_a_local_port_to_a_compute_node(ssh, echo_server_on_node1):
    fwd = await ssh.forward(node_ip(1), echo_server_on_node1)
    assert fwd.local_host == "127.0.0.1" and fwd.local_port != echo_server_on_node1
    reader, writer = await asyncio.open_connection(fwd.local_host, fwd.local_port)
    writer.write(b"hello")
    await writer.drain()
    assert await asyncio.wait_for(reader.read(100), 10) == b"HELLO"
    writer.close()
    fwd.close()
    assert not ssh.open_forwards
