"""Ray's own Jobs tools find a cluster by its name: ``slurm_ray://NAME`` (client/jobaddress.py).

A cluster is started (not connected: nothing of Ray in this process), then Ray's ``ray job``
command line is run from a terminal of the login node as a user would, with the site's
variables only: no token, no CA, no port given to it.
"""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from jupyter_slurm_ray.bootstrap.jsr_wire import TOKEN_FILE
from jupyter_slurm_ray.cluster import SlurmRayCluster
from jupyter_slurm_ray.registry import Registry
from jupyter_slurm_ray.transport import LocalTransport

from .helpers.clusters import cluster_spec, wait_until_nothing_left
from .helpers.paths import VENV_PYTHON
from .helpers.site import configured_site
from .helpers.testbed import USER, runuser

pytestmark = [pytest.mark.testbed, pytest.mark.ray]

RAY = str(Path(VENV_PYTHON).parent / "ray")


@pytest.fixture(scope="module")
def site(tmp_path_factory, testbed) -> Iterator[dict[str, str]]:
    with configured_site(tmp_path_factory.mktemp("site")) as environment:
        yield environment


@pytest.fixture(scope="module")
def cluster(site) -> Iterator[SlurmRayCluster]:
    registry = Registry(site["JUPYTER_SLURM_RAY_STATE_DIR"])
    name = "jobs" + uuid.uuid4().hex[:6]
    cluster = SlurmRayCluster(
        cluster_spec(name=name), LocalTransport(runuser(USER)), registry=registry
    )
    cluster.up(connect=False)
    yield cluster
    cluster.down()
    wait_until_nothing_left(cluster.job_id, cluster.job_dir)


def ray_job(*argv: str, **environment: str) -> subprocess.CompletedProcess:
    """``ray job ARGV`` in a terminal of the login node, with the site's variables."""
    ours = ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")
    env = {k: v for k, v in os.environ.items() if k not in ours} | environment
    return subprocess.run(
        [RAY, "job", *argv], capture_output=True, text=True, env=env, timeout=300, cwd="/"
    )


def token_of(cluster: SlurmRayCluster) -> str:
    return Path(cluster.job_dir, TOKEN_FILE).read_text().strip()


def test_ray_job_submit_by_name_runs_a_job_and_its_logs_come_back(cluster):
    address = f"slurm_ray://{cluster.spec.name}"
    code = "import socket; print('hello from', socket.gethostname())"
    done = ray_job("submit", "--address", address, "--", "python", "-c", code)
    assert done.returncode == 0, done.stderr
    assert re.search(r"hello from node\d", done.stdout), done.stdout
    assert "succeeded" in done.stdout
    submission = re.search(r"raysubmit_\w+", done.stdout)
    assert submission is not None, done.stdout
    # RAY_ADDRESS names it as well, for every ray job command; a shell where Ray's token auth
    # is on with another cluster's token (Ray's client would send that one) changes nothing
    other = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "a-token-of-another-cluster"}
    listed = ray_job("list", RAY_ADDRESS=address, **other)
    assert listed.returncode == 0 and submission.group(0) in listed.stdout, listed.stderr
    logs = ray_job("logs", submission.group(0), RAY_ADDRESS=address)
    assert re.search(r"hello from node\d", logs.stdout), logs.stderr
    # the token went in a header, to this process's own listener: never printed, never a URL
    token = token_of(cluster)
    for output in (done, listed, logs):
        assert token not in output.stdout + output.stderr


def test_an_unknown_name_is_one_clear_error(cluster):
    done = ray_job("list", "--address", "slurm_ray://no-such-cluster")
    assert done.returncode != 0
    assert "no cluster of that name, id or job id in your registry" in done.stderr
