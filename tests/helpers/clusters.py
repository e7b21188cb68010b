"""Real Ray clusters on the testbed: the spec every test cluster starts from, the processes a
cluster left, and Ray Client sessions in subprocesses (so the test process stays clean)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

from jupyter_slurm_ray.bootstrap.jsr_wire import TlsFiles
from jupyter_slurm_ray.spec import ClusterSpec

from .jobs import in_queue
from .paths import VENV_ACTIVATE, VENV_PYTHON
from .testbed import ENFORCED_MEMORY
from .waiting import wait_for

#: What a test cluster needs on this testbed: the venv's Ray, a small footprint (one CPU a
#: node, a small object store: other tests share the testbed's CPUs).
TEST_SPEC = dict(
    time="10",
    cpus_per_node=1,
    python=str(VENV_PYTHON),
    setup=[VENV_ACTIVATE],
    object_store_memory="200M",
    start_timeout=180,
    # where the testbed enforces memory as a site does (its `enforced` profile, DefMemPerCPU
    # 1024): what a 1-CPU head and its 200 MB store need (slurm/memorypolicy.py); elsewhere the
    # site's default, as before
    mem_per_node=ENFORCED_MEMORY,
)


def cluster_spec(**overrides) -> ClusterSpec:
    """A test cluster's spec: :data:`TEST_SPEC` with ``overrides``."""
    return ClusterSpec(**{**TEST_SPEC, **overrides})


def processes_of(job_dir: str) -> list[int]:
    """PIDs of processes (any node: it is one machine) started for the cluster in ``job_dir``.

    Every Ray process of a cluster inherits ``RAY_AUTH_TOKEN_PATH=<job_dir>/ray_token``.
    """
    marker = f"RAY_AUTH_TOKEN_PATH={job_dir}/ray_token".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if marker in environ.split(b"\0") and stat.rsplit(")", 1)[1].split()[0] != "Z":
            found.append(int(entry.name))
    return found


@dataclass(frozen=True)
class ProcessEnvironment:
    """What ``/proc/<pid>/environ`` shows of a process's environment (read as root).

    A process that gave itself a title (setproctitle: ``ray::DashboardAgent``, ``ray::IDLE``)
    wrote it over the start of its arguments and environment: its ``variables`` are then only
    those left (``whole`` False), though ``block`` can still be searched for values.
    """

    block: bytes
    variables: dict[str, str]
    whole: bool

    @classmethod
    def of(cls, pid: int) -> ProcessEnvironment | None:
        """The process's environment; None once it ended."""
        try:
            block = Path(f"/proc/{pid}/environ").read_bytes()
            titled = Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::")
        except OSError:
            return None
        items = (item.decode(errors="replace") for item in block.split(b"\0") if item)
        pairs = (item.partition("=") for item in items if "=" in item)
        return cls(block, {name: value for name, _, value in pairs}, not titled)


def wait_until_nothing_left(job_id: str, job_dir: str, timeout: float = 40.0) -> float:
    """Seconds until the job left squeue and no process of the cluster is left on any node
    (AssertionError after ``timeout`` s for the job, and 30 s more for the processes)."""
    started = time.monotonic()
    wait_for(lambda: not in_queue(job_id), timeout, f"job {job_id} to leave squeue")
    wait_for(lambda: not processes_of(job_dir), 30, "the cluster's processes to end")
    return time.monotonic() - started


def down_and_record(cluster, fault: str) -> None:
    """``down()``, then wait until nothing of the cluster is left; how long it took goes to
    the fault's figures (``test-artifacts/fault-figures.jsonl``)."""
    from .faults import record_figure

    started = time.monotonic()
    cluster.down()
    wait_until_nothing_left(cluster.job_id, cluster.job_dir)
    record_figure(fault, nothing_left_after_down_s=round(time.monotonic() - started, 1))


def client_tls_environment(job_dir: str | Path | None) -> dict[str, str]:
    """Ray's TLS variables naming the clients' certificate of the cluster whose job dir this
    is (read here as root), as a kernel's connect sets them; none for a cluster without TLS."""
    tls = Path(job_dir) / "tls" if job_dir else None
    if tls is None or not (tls / "client.crt").exists():
        return {}
    return TlsFiles(tls / "client.crt", tls / "client.key", tls / "ca.crt").environment()


def ray_in_subprocess(
    address: str,
    token_path: str | None,
    code: str,
    timeout: float = 90,
    env: dict | None = None,
    job_dir: str | None = None,
) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh Python connected with Ray Client (so this process stays clean),
    with the TLS of the cluster whose ``job_dir`` it is.

    The code sees ``ray`` and must print one JSON line as its result.
    """
    environment = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    environment.update(RAY_USAGE_STATS_ENABLED="0", **(env or {}))
    environment.update(client_tls_environment(job_dir))
    if token_path is not None:
        # the package's own connect: token settings and retries of Ray Client's known flakes
        connect = (
            "from jupyter_slurm_ray.client.connect import connect_ray_client\n"
            f"connect_ray_client({address!r}, {token_path!r}, timeout=30)\n"
        )
    else:
        connect = f"ray.init({address!r})\n"
    program = "import json, ray, socket\n" + connect + textwrap.dedent(code)
    return subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=environment,
    )


def last_json_line(out: str):
    for line in reversed(out.splitlines()):
        if line.startswith(("{", "[")):
            return json.loads(line)
    raise AssertionError(f"no JSON line in output:\n{out}")


def ray_result(result: subprocess.CompletedProcess):
    """The JSON result of :func:`ray_in_subprocess`, or a failure showing its stderr."""
    try:
        return last_json_line(result.stdout)
    except AssertionError:
        raise AssertionError(
            f"exit {result.returncode}; stderr:\n{result.stderr[-3000:]}"
        ) from None


ONE_TASK_PER_NODE = """
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy as Affinity

@ray.remote(num_cpus=0)
def where():
    return socket.gethostname()

nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
refs = [where.options(scheduling_strategy=Affinity(n, soft=False)).remote() for n in nodes]
print(json.dumps(sorted(ray.get(refs))))
"""
