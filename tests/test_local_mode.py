"""Local mode for real: Ray as processes of this machine through the same bootstrap.

Without Slurm (its commands taken off PATH: a machine with no Slurm installed, as a laptop or
a CI runner), the quickstart notebook, unchanged, runs with ``mode = "local"`` set only in the
configuration (``JUPYTER_SLURM_RAY_MODE``) and leaves nothing behind; asking for a Slurm
cluster there fails with an error that suggests local mode. Beside the testbed's live Slurm,
``%slurm_ray up --local`` and a Slurm cluster share one registry listing, each with its target.
Ray heads cost ~10 s each here: one local cluster per test, one Slurm cluster.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from jupyter_slurm_ray import session as session_module
from jupyter_slurm_ray.errors import SlurmUnavailable
from jupyter_slurm_ray.registry import Registry
from jupyter_slurm_ray.slurm.localjobs import LocalJobs
from jupyter_slurm_ray.slurm.sitecheck import check_with_slurm
from jupyter_slurm_ray.spec import ClusterSpec
from jupyter_slurm_ray.transport import LocalTransport
from jupyter_slurm_ray.ui.magics import SlurmRayMagics

from .helpers.clusters import processes_of
from .helpers.server import jupyter_server
from .helpers.site import configured_site
from .helpers.testbed import USER
from .helpers.waiting import wait_for

ROOT = Path(__file__).resolve().parents[1]
SLURM_COMMANDS = {
    "sacct", "sacctmgr", "salloc", "sattach", "sbatch", "sbcast", "scancel", "scontrol",
    "scrontab", "sdiag", "seff", "sh5util", "sinfo", "sjobexitmod", "sjstat", "smail", "sprio",
    "squeue", "sreport", "srun", "sshare", "sstat", "strigger", "sview",
}  # fmt: skip


def path_without_slurm(directory: Path) -> str:
    """A PATH with every command of this one but Slurm's (links in ``directory``)."""
    directory.mkdir()
    for entry in os.environ.get("PATH", "").split(os.pathsep)[::-1]:
        for program in Path(entry).glob("*") if Path(entry).is_dir() else ():
            if program.name not in SLURM_COMMANDS and os.access(program, os.X_OK):
                link = directory / program.name
                link.unlink(missing_ok=True)  # the earlier PATH entry wins, as in a lookup
                link.symlink_to(program)
    return f"{Path(sys.executable).parent}{os.pathsep}{directory}"


@pytest.fixture(scope="module")
def no_slurm(tmp_path_factory) -> dict[str, str]:
    """The environment of a machine without Slurm; the precondition checked."""
    path = path_without_slurm(tmp_path_factory.mktemp("no-slurm") / "bin")
    assert shutil.which("sinfo", path=path) is None and shutil.which("sbatch", path=path) is None
    assert shutil.which("ps", path=path) and shutil.which("setsid", path=path)
    environment = {
        k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER_SLURM_RAY_", "SLURM_"))
    }
    return {**environment, "PATH": path}


def test_the_quickstart_notebook_runs_unchanged_in_local_mode_without_slurm(
    no_slurm, tmp_path
) -> None:
    state = tmp_path / "state"
    configuration = {  # configuration only: the notebook is the README's, unchanged
        "JUPYTER_SLURM_RAY_MODE": "local",
        "JUPYTER_SLURM_RAY_STATE_DIR": str(state),
        "JUPYTER_SLURM_RAY_OBJECT_STORE_MEMORY": "200M",
    }
    notebook = ROOT / "notebooks" / "quickstart.ipynb"
    result = subprocess.run(
        [sys.executable, ROOT / "scripts" / "run-notebook", notebook],
        env={**no_slurm, **configuration},
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "note: local mode" in out
    hosts = re.search(r"^hosts: \[(.*)\]$", out, re.M)
    assert hosts is not None and len(hosts.group(1).split(",")) == 1, out  # one node
    assert re.search(r"^ray \(ray-[0-9a-f]+\): CONNECTED · job local-\d+", out, re.M), out
    assert re.search(r"^ray \(ray-[0-9a-f]+\): STOPPED", out, re.M), out
    [record] = Registry(state).all()
    assert record.target == "local mode" and record.state == "STOPPED"
    assert record.job_id is not None and record.job_id.startswith("local-")
    assert processes_of(record.job_dir) == []  # no Ray process left
    events = Path(record.job_dir, "events.jsonl").read_text()
    assert '"event": "ready"' in events and '"event": "stopped"' in events  # the same bootstrap


async def test_without_slurm_asking_for_a_cluster_suggests_local_mode(
    no_slurm, monkeypatch
) -> None:
    monkeypatch.setenv("PATH", no_slurm["PATH"])
    with pytest.raises(SlurmUnavailable) as error:
        await check_with_slurm(ClusterSpec(time="10"), LocalTransport())
    assert "--local" in str(error.value) and 'mode = "local"' in str(error.value)


OWNER = """
import os
from jupyter_slurm_ray import ClusterSpec, SlurmRayCluster
from jupyter_slurm_ray.registry import Registry
spec = ClusterSpec(mode="local", time="10", owner_timeout=5, cpus_per_node=1,
                   object_store_memory="200M")
cluster = SlurmRayCluster(spec, registry=Registry({state!r}))
cluster.up(connect=False)
print(cluster.job_id, cluster.job_dir, flush=True)
os.kill(os.getpid(), 9)  # the owner gone: no down, no atexit
"""


def test_a_local_cluster_whose_owner_is_gone_stops_by_its_lease(no_slurm, tmp_path) -> None:
    code = OWNER.format(state=str(tmp_path / "state"))
    owner = subprocess.run(
        [sys.executable, "-c", code], env=no_slurm, capture_output=True, text=True, timeout=300
    )
    assert owner.returncode == -9, owner.stdout + owner.stderr
    job_id, job_dir = owner.stdout.split()
    jobs = LocalJobs(LocalTransport())

    def final_state() -> str | None:
        info = asyncio.run(jobs.query([job_id])).get(job_id)
        return info.state if info is not None and info.is_final else None

    wait_for(final_state, 90, f"{job_id} to end once its lease is stale")
    assert final_state() == "COMPLETED"  # the bootstrap ended it, no one cancelled it
    events = Path(job_dir, "events.jsonl").read_text()
    assert '"event": "lease_stale"' in events and '"event": "stopped"' in events
    wait_for(lambda: not processes_of(job_dir), 30, "the cluster's Ray processes to end")


# -- beside the testbed's Slurm -------------------------------------------------------------------
class Shell:
    """An IPython shell with the magics loaded (a kernel's view, in this process)."""

    def __init__(self) -> None:
        from IPython.core.interactiveshell import InteractiveShell
        from IPython.testing.globalipapp import start_ipython

        start_ipython()
        self.ip = InteractiveShell.instance()
        session_module._session = None
        self.ip.register_magics(SlurmRayMagics(self.ip))

    def run(self, cell: str, capfd) -> str:
        capfd.readouterr()
        result = self.ip.run_cell(cell)
        out, err = capfd.readouterr()
        assert result.error_in_exec is None, f"{cell}: {result.error_in_exec}\n{out}{err}"
        return out


@pytest.fixture(scope="module")
def site(tmp_path_factory, testbed) -> Iterator[dict[str, str]]:
    with configured_site(tmp_path_factory.mktemp("site")) as environment:
        yield environment


@pytest.mark.testbed
def test_up_local_beside_a_live_slurm_and_both_kinds_in_one_listing(site, capfd) -> None:
    shell = Shell()
    out = shell.run("%slurm_ray up --local -t 10 -c 1 --name loc", capfd)
    assert re.search(r"^loc \(loc-[0-9a-f]+\): CONNECTED · job local-\d+", out, re.M), out
    shell.run("import ray; answer = ray.get(ray.remote(lambda: 6 * 7).remote())", capfd)
    assert shell.ip.user_ns["answer"] == 42
    shell.run("%slurm_ray up -N 1 -t 10 -c 1 --name slu --no-connect", capfd)
    listing = shell.run("%slurm_ray list", capfd)
    local_row = next(line for line in listing.splitlines() if line.startswith("loc "))
    slurm_row = next(line for line in listing.splitlines() if line.startswith("slu "))
    assert "local-" in local_row and "local mode (runuser -u" in local_row, listing
    assert re.search(r" \d+ ", slurm_row) and "local mode" not in slurm_row, listing
    state = Path(site["JUPYTER_SLURM_RAY_STATE_DIR"])
    records = {r.name: r for r in Registry(state).all()}
    assert records["loc"].target.startswith("local mode") and records["slu"].job_id.isdigit()
    with jupyter_server(state.parent, USER) as server:  # the sidebar's API and the proxy
        listed = {c["name"]: c for c in server.get("slurm-ray/api/clusters").json()["clusters"]}
        assert listed["loc"]["state"] == "CONNECTED" and listed["loc"]["job_id"].startswith(
            "local-"
        )
        assert listed["slu"]["job_id"] == records["slu"].job_id
        status = server.get(f"slurm-ray/dashboard/{records['loc'].id}/api/cluster_status")
        assert status.status_code == 200 and status.json()["result"] is True  # token added
    down = shell.run("%slurm_ray down --all", capfd)
    assert down.count("STOPPED · (stopped on request)") == 2, down
    assert "local mode has no Slurm accounting" in down  # what usage can say of it
    wait_for(lambda: not processes_of(records["loc"].job_dir), 30, "the local Ray processes")
    records = {r.name: r for r in Registry(Path(site["JUPYTER_SLURM_RAY_STATE_DIR"])).all()}
    assert records["loc"].state == "STOPPED" and records["slu"].state == "STOPPED"
