"""Environment packs for real (environment = "pack"): from the laptop side over SSH, the
kernel's venv is packed once, shipped, unpacked on both nodes, and the tasks import a module
only that venv has; a second up reuses the archive. A corrupt archive fails the cluster fast."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from jupyter_slurm_ray.aio import run_sync
from jupyter_slurm_ray.cluster import SlurmRayCluster
from jupyter_slurm_ray.errors import RayStartError
from jupyter_slurm_ray.job import packs
from jupyter_slurm_ray.registry import Registry
from jupyter_slurm_ray.states import State
from jupyter_slurm_ray.transport import LocalTransport

from .helpers.clusters import cluster_spec, wait_until_nothing_left
from .helpers.faults import record_figure
from .helpers.jobs import in_queue
from .helpers.paths import USER_TEMP_PARENTS, VENV, child_environment
from .helpers.testbed import runuser

pytestmark = [pytest.mark.testbed, pytest.mark.ray]

PACK_VENV = Path(os.environ.get("JSR_PACK_VENV", VENV.parent / "pack-venv"))


def test_a_pack_from_the_laptop_is_built_once_unpacked_on_each_node_and_reused(tmp_path, testbed):
    python = PACK_VENV / "bin" / "python"
    if not (PACK_VENV / ".jsr-ready").is_file():
        pytest.fail(
            f"{PACK_VENV} is missing: run scripts/pack-venv (scripts/setup --tests runs it)",
            pytrace=False,
        )
    laptop = os.environ["JSR_LAPTOP_NETNS"]
    session = ["nsenter", f"--net={laptop}", str(python), "-m", "tests.helpers.laptop_pack"]
    result = subprocess.run(
        [*session, str(tmp_path / "state")],
        capture_output=True,
        text=True,
        timeout=900,
        env=child_environment(),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    first, second = seen["first"], seen["second"]
    figures = {
        "first_up_s (pack built + sent)": first["up_seconds"],
        "second_up_s (reused)": second["up_seconds"],
        "archive_MB": round(seen["archive_bytes"] / 1e6),
    }
    steps = [line for line in result.stderr.splitlines() if "[environment pack]" in line]
    unpacking = [round(e["seconds"], 1) for e in first["env_pack_events"]]
    figures["first_unpack_s (head, worker)"] = unpacking
    print(f"\nenvironment pack over SSH: {figures}", *steps, sep="\n")
    record_figure("environment pack", **figures, steps=steps)
    for run in (first, second):
        assert run["state"] == "CONNECTED" and run["final_state"] == "STOPPED"
        hosts = [host for host, _, _ in run["tasks"]]
        assert len(hosts) == 2 and len(set(hosts)) == 2  # one task on each node
        # from the node-local unpacked venv (under /var/tmp where jobs have a /tmp of their own)
        unpacked = tuple(f"{parent}/jsr-{alice_uid()}/env-venv-" for parent in USER_TEMP_PARENTS)
        for _, marker, executable in run["tasks"]:
            assert marker.startswith(unpacked) and marker.endswith("/jsr_pack_marker.py")
            assert executable.startswith(unpacked)
        assert not in_queue(run["job_id"])
        wait_until_nothing_left(run["job_id"], run["job_dir"])
    # built once and sent once: the second up neither packed nor sent the archive again (both
    # copies, the laptop's and the cluster side's, are the same files, unchanged), and said so
    assert second["archives"] == first["archives"], (first["archives"], second["archives"])
    said = [line.split("] ", 1)[1].split()[0] for line in steps]
    assert (said.count("packing"), said.count("packed"), said.count("sent")) == (1, 1, 1), steps
    assert said.count("reusing") == 1 and said.index("reusing") > said.index("sent"), steps
    assert [e["reused"] for e in first["env_pack_events"]].count(False) == 1  # one unpack
    assert all(e["reused"] for e in second["env_pack_events"])
    assert len(second["env_pack_events"]) >= 2  # head and worker (and the worker job)
    scaled = second["scaled_tasks"]  # a worker job joined (maybe beside a node of the
    assert len(scaled) == 3  # cluster): it found the pack in the job dir and runs it too
    assert all(marker.startswith(unpacked) for _, marker, _ in scaled)
    assert [e for e in second["env_pack_events"] if e.get("worker_job")]


def alice_uid() -> int:
    return int(subprocess.run(["id", "-u", "alice"], capture_output=True, text=True).stdout)


def test_a_corrupt_archive_fails_the_cluster_fast_with_the_reason(tmp_path, testbed):
    """The archive named by what is installed here is replaced by garbage on the cluster side:
    the bootstrap's unpack fails, the cluster is FAILED with the node and the tar error."""
    transport = LocalTransport(runuser("alice"))
    root = "~/.jupyter-slurm-ray/jobs-corrupt-pack"
    spec = cluster_spec(python=None, setup=(), environment="pack", job_dir_root=root)
    env = packs.describe_environment()
    real_root = run_sync(transport.expand_path(root))
    archive = packs.remote_archive(env, real_root)
    garbage = "this is not a tar archive\n"
    content = hashlib.sha256(garbage.encode()).hexdigest()[:16]  # what it would unpack to
    unpacked = [
        f"{parent}/jsr-{alice_uid()}/env-{env.kind}-{env.key}-{content}"
        for parent in USER_TEMP_PARENTS
    ]
    run_sync(transport.run(["rm", "-rf", "--", *unpacked]))
    run_sync(transport.make_dir(os.path.dirname(archive)))
    run_sync(transport.write_file(archive, garbage))
    cluster = SlurmRayCluster(spec, transport, registry=Registry(tmp_path / "state"))
    try:
        with pytest.raises(RayStartError) as info:
            cluster.up()
        assert cluster.state is State.FAILED
        reason = cluster.status.reason or ""
        assert "cannot unpack the environment pack" in reason and archive in reason
        assert any(node in reason for node in ("node1", "node2", "node3"))
        assert "tar" in str(info.value)
        for path in unpacked:  # nothing half-unpacked left
            assert run_sync(transport.run(["test", "-e", path], check=False)).returncode != 0
    finally:
        cluster.down()
        cluster.close()
        run_sync(transport.run(["rm", "-rf", "--", real_root]))
    wait_until_nothing_left(cluster.job_id, cluster.job_dir)
