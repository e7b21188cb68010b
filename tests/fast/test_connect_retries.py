"""Ray Client connects retry the proxier's known transient failures, a bounded number of
times, and give up at once on anything else (``client/connect.py``); ``ray.init`` scripted."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from jupyter_slurm_ray.client import connect
from jupyter_slurm_ray.errors import ConnectError

BACKEND = (
    "Initialization failure from server:\nRuntimeError: Proxy failed to Connect to backend! "
    "Check `ray_client_server.err` and `ray_client_server_23000.err` on the head node"
)


@pytest.fixture
def ray_init(monkeypatch: pytest.MonkeyPatch, tmp_path) -> Iterator[list[str]]:
    """ray.init fails with each scripted message in turn, then connects; the calls made."""
    import ray

    for name in list(os.environ):
        if name.startswith("RAY_"):
            monkeypatch.delenv(name)
    failures: list[str] = []
    calls: list[str] = []

    def init(address: str, **kwargs: object) -> str:
        calls.append(address)
        if failures:
            raise ConnectionError(failures.pop(0))
        return "context"

    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(connect, "_shutdown_quietly", lambda: None)
    (tmp_path / "token").write_text("t" * 32)
    yield failures
    assert calls, "ray.init was never called"


def test_a_proxier_that_could_not_reach_its_client_server_is_retried(ray_init, tmp_path) -> None:
    ray_init.extend([BACKEND, "Starting Ray client server failed. See the log"])
    assert connect.connect_ray_client("ray://h:1", str(tmp_path / "token")) == "context"
    assert ray_init == []  # both failures were retried


def test_the_retries_are_bounded_and_the_error_says_how_many(ray_init, tmp_path) -> None:
    ray_init.extend([BACKEND] * 3)
    with pytest.raises(ConnectError, match=r"(?s)after 3 attempt\(s\): .*Proxy failed to Connect"):
        connect.connect_ray_client("ray://h:1", str(tmp_path / "token"))


def test_an_unknown_failure_is_not_retried(ray_init, tmp_path) -> None:
    ray_init.extend(["Permission denied: the token was refused", BACKEND])
    with pytest.raises(ConnectError, match=r"after 1 attempt\(s\): Permission denied"):
        connect.connect_ray_client("ray://h:1", str(tmp_path / "token"))
    assert ray_init == [BACKEND]
