"""Ray Client's proxier sends a client's requests only to the server it started for it
(bootstrap/sitepath/jsr_clientguard.py): installed in the job's Ray processes, and judging a
client's server by who listens on its port. Pure: this process's sockets and children."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from concurrent import futures
from pathlib import Path
from types import SimpleNamespace

import jupyter_slurm_ray

SITE_PATH = Path(jupyter_slurm_ray.__file__).parent / "bootstrap" / "sitepath"
sys.path.insert(0, str(SITE_PATH))
import jsr_clientguard  # noqa: E402

sys.path.remove(str(SITE_PATH))

LISTENER = "import socket, sys, time\ns = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1])))\ns.listen(); print('up', flush=True); time.sleep(60)\n"  # noqa: E501


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_the_guard_is_installed_in_rays_proxier() -> None:
    probe = "import ray.util.client.server.proxier as p; print(p.ProxyManager.jsr_guarded)"
    env = {**os.environ, "PYTHONPATH": str(SITE_PATH)}
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.stdout.strip().splitlines()[-1] == "True", done.stderr[-2000:]


class FakeServer:
    """Ray's SpecificServer as the proxier keeps it: its port and its process."""

    def __init__(self, port: int, process: subprocess.Popen) -> None:
        self.port = port
        self.process_handle_future: futures.Future = futures.Future()
        self.process_handle_future.set_result(SimpleNamespace(process=process))
        self.killed = False

    def wait_ready(self) -> None:
        self.process_handle_future.result()

    def kill(self) -> None:
        self.killed = True


def guarded_manager(server: FakeServer) -> object:
    class ProxyManager:
        def start_specific_server(self, client_id: str, job_config: object) -> bool:
            return True

        def get_channel(self, client_id: str) -> str:
            return "the channel"

        def _get_server_for_client(self, client_id: str) -> FakeServer:
            return server

    errors: list[str] = []
    proxier = SimpleNamespace(
        ProxyManager=ProxyManager, logger=SimpleNamespace(error=errors.append)
    )
    jsr_clientguard.guard(proxier)  # type: ignore[arg-type]
    return ProxyManager(), errors


def test_a_clients_server_listening_on_its_own_port_is_used() -> None:
    port = free_port()
    child = subprocess.Popen(
        [sys.executable, "-c", LISTENER, str(port)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "up"
        server = FakeServer(port, child)
        manager, errors = guarded_manager(server)
        assert manager.start_specific_server("c1", None) is True
        assert manager.get_channel("c1") == "the channel"  # every later request too
        assert errors == [] and not server.killed
        child.kill()
        child.wait()
        with socket.socket() as squatter:  # the server died; someone else took its port
            squatter.bind(("127.0.0.1", port))
            squatter.listen()
            assert manager.get_channel("c1") is None
        assert "that is not its server's" in errors[0]
    finally:
        child.kill()
        child.wait()


def test_a_port_someone_else_listens_on_fails_the_start() -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with socket.socket() as squatter:  # not the server's: this test's own process
            squatter.bind(("127.0.0.1", 0))
            squatter.listen()
            server = FakeServer(squatter.getsockname()[1], sleeper)
            manager, errors = guarded_manager(server)
            assert manager.start_specific_server("c1", None) is False
            assert manager.get_channel("c1") is None  # a reconnect, the log stream: neither
        assert server.killed
        assert "that is not its server's" in errors[0] and len(errors) == 2
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_server_that_died_before_listening_fails_the_start() -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    manager, errors = guarded_manager(FakeServer(free_port(), dead))
    assert manager.start_specific_server("c1", None) is False
    assert "exited (status 0) before it listened" in errors[0]


def test_no_listener_in_time_fails_the_start() -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        port = free_port()
        reason = jsr_clientguard.foreign_listener(port, sleeper, wait=0.2)
        assert reason == f"its server did not listen on {port} within 0.2 s"
    finally:
        sleeper.kill()
        sleeper.wait()
