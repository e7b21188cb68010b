"""Shared fixtures: the real testbed (scripts/testbed), its users, and both transports.

The suite runs as root inside the testbed's login namespace (``scripts/testbed exec``), i.e.
"on the login node". Local-transport tests act as the unprivileged user through
``runuser``; SSH tests log in to the login node's sshd as that user with the testbed's keys.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import pytest

from jupyter_slurm_ray.transport import LocalTransport, SSHTransport


@dataclass(frozen=True)
class Testbed:
    ssh_host: str
    ssh_port: int
    known_hosts: str
    user: str
    user2: str
    keys: dict[str, str]
    nodes: int
    gpus: int

    def key(self, user: str) -> str:
        return self.keys[user]


def _require_testbed() -> Testbed:
    if os.environ.get("JSR_TESTBED") != "1":
        pytest.fail(
            "the Slurm testbed is not up or its environment is missing: run the tests with "
            "scripts/run-tests (or: scripts/testbed up && scripts/testbed exec -- pytest)",
            pytrace=False,
        )
    env = os.environ
    users = (env["JSR_USER"], env["JSR_USER2"])
    return Testbed(
        ssh_host=env["JSR_SSH_HOST"],
        ssh_port=int(env.get("JSR_SSH_PORT", "22")),
        known_hosts=env["JSR_KNOWN_HOSTS"],
        user=users[0],
        user2=users[1],
        keys={u: env[f"JSR_KEY_{u}"] for u in users},
        nodes=int(env["JSR_NODES"]),
        gpus=int(env["JSR_GPUS"]),
    )


@pytest.fixture(scope="session")
def testbed() -> Testbed:
    return _require_testbed()


def as_user(user: str) -> list[str]:
    return ["runuser", "-u", user, "--"]


@pytest.fixture
async def local(testbed: Testbed) -> AsyncIterator[LocalTransport]:
    """The unprivileged user on the login node."""
    async with LocalTransport(as_user(testbed.user)) as transport:
        yield transport


def ssh_transport(testbed: Testbed, user: str | None = None, **overrides) -> SSHTransport:
    user = user or testbed.user
    options = dict(
        port=testbed.ssh_port,
        username=user,
        client_keys=[testbed.key(user)],
        known_hosts=testbed.known_hosts,
        agent_path=None,
        connect_timeout=5,
    )
    options.update(overrides)
    return SSHTransport(testbed.ssh_host, **options)


@pytest.fixture
async def ssh(testbed: Testbed) -> AsyncIterator[SSHTransport]:
    """The unprivileged user on the login node, reached over SSH from the laptop side."""
    async with ssh_transport(testbed) as transport:
        yield transport


@pytest.fixture(params=["local", "ssh"])
async def transport(request, testbed: Testbed) -> AsyncIterator:
    """Each test using this runs once per transport."""
    if request.param == "local":
        t = LocalTransport(as_user(testbed.user))
    else:
        t = ssh_transport(testbed)
    async with t:
        yield t


@pytest.fixture
def unique_name() -> str:
    return "t" + uuid.uuid4().hex[:10]


@pytest.fixture
def cancel_jobs() -> Iterator[list[str]]:
    """Tests append the job ids they submit; whatever is still queued is cancelled at the end."""
    jobs: list[str] = []
    yield jobs
    if jobs:
        subprocess.run(["scancel", *jobs], check=False, capture_output=True)
