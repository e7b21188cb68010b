"""A stand-in for a notebook kernel: a separate process that owns a cluster, to be killed.

It submits a cluster as the testbed user, prints one JSON line (``id``, ``job_id``,
``job_dir``) as soon as the job is queued, optionally waits for READY (and connects), prints
a second line with the state (and, when asked to scale, its worker jobs once their nodes
joined), then sleeps until killed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from dataclasses import dataclass

from .paths import child_environment

_PROGRAM = """
import json, time
from tests.helpers.clusters import cluster_spec
from jupyter_slurm_ray.cluster import SlurmRayCluster
from jupyter_slurm_ray.registry import Registry
from jupyter_slurm_ray.transport import LocalTransport
cluster = SlurmRayCluster(cluster_spec(**{spec!r}), LocalTransport({prefix!r}),
                          registry=Registry({state!r}), poll_interval=0.5)
cluster.up(wait=False)
print(json.dumps(dict(id=cluster.id, job_id=cluster.job_id, job_dir=cluster.job_dir)), flush=True)
if {wait!r}:
    cluster.wait_ready()
    if {connect!r}:
        cluster.connect()
    if {scale!r}:
        cluster.scale({scale!r})
        deadline = time.monotonic() + 300
        while cluster.refresh().nodes_joined < {scale!r} and time.monotonic() < deadline:
            time.sleep(0.5)
    workers = [job.job_id for job in cluster.workers.active()]
    print(json.dumps(dict(state=cluster.state.value, worker_jobs=workers)), flush=True)
time.sleep(3600)
"""


@dataclass
class Kernel:
    process: subprocess.Popen[str]
    id: str
    job_id: str
    job_dir: str

    def next_line(self) -> dict:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise AssertionError(f"the kernel exited: {self.process.stderr.read()[-3000:]}")
        return json.loads(line)

    def kill(self) -> None:
        """SIGKILL, as the OOM killer or a crashed kernel would: no atexit, no goodbye."""
        self.process.kill()
        self.process.wait()


def start_kernel(
    state_dir: str,
    prefix: list[str],
    *,
    wait: bool = False,
    connect: bool = False,
    scale: int = 0,
    env: dict[str, str] | None = None,
    **spec: object,
) -> Kernel:
    program = _PROGRAM.format(
        spec=spec, prefix=prefix, state=state_dir, wait=wait, connect=connect, scale=scale
    )
    process = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(program)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_environment(env),
    )
    kernel = Kernel(process, "", "", "")
    first = kernel.next_line()
    kernel.id, kernel.job_id, kernel.job_dir = first["id"], first["job_id"], first["job_dir"]
    return kernel
