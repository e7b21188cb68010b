"""The filesystem, tightened, on the real testbed, with bob as the other user of the site:

- an ACL that lets bob write alice's job dir root (or a parent, or its packs dir) refuses
  ``up`` before anything is submitted, naming the path, the grant and the fix (over SSH too:
  the login node's python3 reads the ACL);
- an ACL that appears after submission (a default ACL on the job dir: what the bootstrap
  creates there would be bob's to change) makes the bootstrap on the node refuse;
- a pack replaced in the packs dir after ``up`` took its hash: the node refuses to unpack it,
  the cluster is FAILED with the reason, nothing is left;
- ``gc --dry-run`` then ``gc``: ended clusters' job dirs and unused packs go, with their sizes;
  what a live cluster uses stays.

The ACLs are set as root, as a careless site would (``setfacl -m u:bob:rwx``): alice's own
tools never grant them. /home here is ext4 with ACLs (the fixture checks).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from jupyter_slurm_ray.aio import run_sync
from jupyter_slurm_ray.cluster import SlurmRayCluster
from jupyter_slurm_ray.errors import RayStartError, SpecError
from jupyter_slurm_ray.job import packs
from jupyter_slurm_ray.job.directory import probe_site
from jupyter_slurm_ray.job.script import render_job_script
from jupyter_slurm_ray.naming import job_comment
from jupyter_slurm_ray.registry import ClusterRecord, Registry
from jupyter_slurm_ray.spec import ClusterSpec
from jupyter_slurm_ray.states import State
from jupyter_slurm_ray.transport import LocalTransport
from jupyter_slurm_ray.ui.cli import main

from .helpers.clusters import cluster_spec, wait_until_nothing_left
from .helpers.jobs import jobs_with_comment, last_state, pending_or_running, submit_script
from .helpers.site import configured_site
from .helpers.testbed import USER, runuser
from .helpers.waiting import wait_for

pytestmark = [pytest.mark.testbed]

BOB = "bob"
LATER = "--begin=now+8"  # the job waits in the queue: the test acts between submit and start
DAY = 86400.0


def uid_of(user: str) -> int:
    return int(subprocess.run(["id", "-u", user], capture_output=True, text=True).stdout)


def as_user(user: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*runuser(user), *argv], capture_output=True, text=True, check=False)


def write_as(user: str, path: Path, data: bytes, umask: str = "077") -> None:
    """``path`` written by ``user`` (over the same file, when it exists: same inode, mode)."""
    script = f'umask {umask}; mkdir -p "$(dirname "$1")" && cat > "$1"'
    subprocess.run([*runuser(user), "sh", "-c", script, "sh", str(path)], input=data, check=True)


@pytest.fixture
def alices_tree(testbed) -> Iterator[Path]:
    """A fresh 0700 directory in alice's home (ACLs removed and deleted afterwards)."""
    if shutil.which("setfacl") is None:
        pytest.fail(
            "setfacl is missing: scripts/setup --tests installs the acl package", pytrace=False
        )
    tree = Path(f"/home/{USER}/.jsr-fsys-{uuid.uuid4().hex[:8]}")
    as_user(USER, "mkdir", "-m", "700", str(tree))
    probe = subprocess.run(["setfacl", "-m", f"u:{BOB}:r", str(tree)], capture_output=True)
    if probe.returncode != 0:
        pytest.fail(f"/home keeps no ACLs here: {probe.stderr.decode()}", pytrace=False)
    subprocess.run(["setfacl", "-b", str(tree)], check=True)
    yield tree
    subprocess.run(["setfacl", "-R", "-b", str(tree)], check=False, capture_output=True)
    shutil.rmtree(tree, ignore_errors=True)


@pytest.fixture
def registry(tmp_path) -> Registry:
    return Registry(tmp_path / "state")


def new_cluster(registry: Registry, **spec) -> SlurmRayCluster:
    return SlurmRayCluster(
        cluster_spec(**spec), LocalTransport(runuser(USER)), registry=registry, poll_interval=0.5
    )


# ----------------------------------------------------------------------- ACLs


def test_up_is_refused_before_submitting_when_an_acl_lets_bob_write_a_parent(
    alices_tree, registry
) -> None:
    root = alices_tree / "jobs"
    subprocess.run(["setfacl", "-m", f"u:{BOB}:rwx", str(alices_tree)], check=True)
    planted = as_user(BOB, "touch", str(alices_tree / "bob-was-here"))
    assert planted.returncode == 0, planted.stderr  # the grant is real: bob writes there
    cluster = new_cluster(registry, job_dir_root=str(root))
    with pytest.raises(SpecError) as refused:
        cluster.up(wait=False)
    message = str(refused.value)
    assert refused.value.field == "job_dir_root"
    assert (
        f"{alices_tree} grants write through an ACL to user {BOB} (uid {uid_of(BOB)}) "
        f"(user:{BOB}:rwx, mask rwx); remove it with `setfacl -b {alices_tree}`"
    ) in message
    assert cluster.job_id is None and jobs_with_comment(job_comment(cluster.id)) == []
    assert registry.load(cluster.id) is None and not root.exists()  # nothing written


async def test_the_probe_over_ssh_reads_the_acl_on_the_login_node(alices_tree, ssh) -> None:
    """From the laptop side, the login node's python3 judges the ACL (not only ls's +)."""
    subprocess.run(["setfacl", "-m", f"u:{BOB}:rwx", str(alices_tree)], check=True)
    with pytest.raises(SpecError) as refused:
        await probe_site(ssh, str(alices_tree / "jobs"))
    assert f"{alices_tree} grants write through an ACL to user {BOB} (uid {uid_of(BOB)})" in str(
        refused.value
    )
    subprocess.run(["setfacl", "-m", f"u:{BOB}:rx", str(alices_tree)], check=True)
    site = await probe_site(ssh, str(alices_tree / "jobs"))  # reading only: harmless
    assert site.job_dir_root == str(alices_tree / "jobs")


def test_up_is_refused_when_an_acl_lets_bob_write_the_packs_dir(alices_tree, registry) -> None:
    root = alices_tree / "jobs"
    as_user(USER, "mkdir", "-p", "-m", "700", str(root / "packs"))
    subprocess.run(["setfacl", "-m", f"g:{BOB}:rwx", str(root / "packs")], check=True)
    cluster = new_cluster(registry, job_dir_root=str(root), environment="pack", python=None)
    with pytest.raises(SpecError, match=f"{root}/packs grants write through an ACL to group"):
        cluster.up(wait=False)  # refused before packing anything
    assert cluster.job_id is None and list((root / "packs").iterdir()) == []


def test_the_bootstrap_refuses_an_acl_that_appears_after_submission(alices_tree, registry) -> None:
    """A default ACL on the job dir leaves its mode alone (the job script's own check passes)
    but would make every file the bootstrap writes there (connection.json, events, logs)
    bob's to change: the bootstrap refuses before it reads its settings."""
    cluster = new_cluster(registry, job_dir_root=str(alices_tree / "jobs"), extra_sbatch=(LATER,))
    try:
        cluster.up(wait=False)
        subprocess.run(["setfacl", "-d", "-m", f"u:{BOB}:rwx", cluster.job_dir], check=True)
        events = Path(cluster.job_dir, "events.jsonl")
        assert not events.exists()  # the ACL came before the bootstrap ran
        with pytest.raises(RayStartError):
            cluster.wait_up(connect=False)
        assert cluster.state is State.FAILED
        reason = cluster.status.reason or ""
        assert reason.startswith(f"the job dir {cluster.job_dir} is not safe to run from: ")
        assert (
            f"{cluster.job_dir} has a default ACL that grants write in whatever is created there "
            f"to user {BOB} (uid {uid_of(BOB)}) (user:{BOB}:rwx, mask rwx); remove it with "
            f"`setfacl -b {cluster.job_dir}`"
        ) in reason
        phases = [json.loads(line).get("phase") for line in events.read_text().splitlines()]
        assert not {"head_starting", "workers_starting"} & set(phases)  # nothing was started
    finally:
        cluster.down()
        cluster.close()
    wait_until_nothing_left(cluster.job_id, cluster.job_dir)


# ----------------------------------------------------------------------- packs


def tar_gz(files: dict[str, str]) -> bytes:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tar:
        for name, text in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(text), 0o755
            tar.addfile(info, io.BytesIO(text.encode()))
    return data.getvalue()


def test_a_pack_replaced_after_up_is_refused_on_the_node(alices_tree, registry) -> None:
    root = alices_tree / "jobs"
    env = packs.describe_environment()
    archive = Path(packs.remote_archive(env, str(root)))
    shipped = tar_gz({"bin/python": "", "pyvenv.cfg": "home = /usr/bin\n"})
    evil = tar_gz({"bin/python": "", "pyvenv.cfg": "home = /usr/bin\n", "bin/ray": "rm -rf ~"})
    sha_shipped, sha_evil = (hashlib.sha256(b).hexdigest() for b in (shipped, evil))
    write_as(USER, archive, shipped)
    assert hashlib.sha256(archive.read_bytes()).hexdigest() == sha_shipped
    bob_tries = as_user(BOB, "cp", "/dev/null", str(archive))
    assert bob_tries.returncode != 0  # bob cannot: the packs dir passed the trust check
    cluster = new_cluster(
        registry,
        job_dir_root=str(root),
        environment="pack",
        python=None,
        setup=(),
        extra_sbatch=(LATER,),
    )
    try:
        cluster.up(wait=False)  # the job names the archive and the hash of what is there now
        script = Path(cluster.job_dir, "job.sbatch").read_text()
        assert f"JSR_ENV_PACK_SHA256={sha_shipped}" in script
        write_as(USER, archive, evil)  # a careless process of alice's, after up
        assert archive.read_bytes() == evil
        with pytest.raises(RayStartError):
            cluster.wait_up(connect=False)
        assert cluster.state is State.FAILED
        reason = cluster.status.reason or ""
        assert f"the environment pack {archive} on node" in reason
        assert f"its content has sha256 {sha_evil}, not {sha_shipped}" in reason
        assert "was replaced after up" in reason and f"rm {archive}" in reason
        events = Path(cluster.job_dir, "events.jsonl").read_text().splitlines()
        refused = [e for e in map(json.loads, events) if e["event"] == "env_pack_replaced"]
        assert refused and refused[0]["expected"] == sha_shipped
        assert refused[0]["found"] == sha_evil
        unpacked = Path(f"/tmp/jsr-{uid_of(USER)}")
        left = unpacked.glob(f"*env-{env.kind}-{env.key}-*")  # (its node lock file stays)
        assert not [path for path in left if path.is_dir()]  # nothing unpacked, not even half
    finally:
        cluster.down()
        cluster.close()
    wait_until_nothing_left(cluster.job_id, cluster.job_dir)


# ----------------------------------------------------------------------- gc


def aged(path: Path, days: float = 10) -> None:
    """The dir, its entries and itself last changed ``days`` ago."""
    when = time.time() - days * DAY
    for entry in [*path.iterdir(), path] if path.is_dir() else [path]:
        os.utime(entry, (when, when), follow_symlinks=False)


def submitted(
    transport, root: Path, name: str, *, held: bool, command: list[str]
) -> tuple[str, str]:
    cluster_id = f"{name}-{uuid.uuid4().hex[:6]}"
    spec = ClusterSpec(
        name=cluster_id,
        time="5",
        cpus_per_node=1,
        extra_sbatch=("--begin=now+600",) if held else (),
    )
    job_dir = f"{root}/{cluster_id}"
    script = render_job_script(spec, cluster_id=cluster_id, job_dir=job_dir, command=command)
    return cluster_id, run_sync(submit_script(transport, script, job_dir))


def write_record(
    registry: Registry, root: Path, cluster_id: str, job_id: str, state: str, days: float
) -> None:
    target = LocalTransport(runuser(USER)).target
    registry.save(
        ClusterRecord(cluster_id, cluster_id, target, f"{root}/{cluster_id}", job_id, state=state)
    )
    path = registry.record_path(cluster_id)
    data = json.loads(path.read_text())
    data["updated_at"] = time.time() - days * DAY
    path.write_text(json.dumps(data))


@pytest.fixture
def gc_site(alices_tree, tmp_path, monkeypatch) -> Iterator[Path]:
    root = alices_tree / "jobs"
    with configured_site(tmp_path):
        monkeypatch.setenv("JUPYTER_SLURM_RAY_JOB_DIR_ROOT", str(root))
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # this side's cache
        yield root


@pytest.mark.usefixtures("root_logging_kept")
def test_gc_dry_run_then_gc_prune_only_what_ended(gc_site, cancel_jobs, capsys) -> None:
    root, transport, registry = gc_site, LocalTransport(runuser(USER)), Registry()
    pack = lambda name: f"env-venv-{name * 16}.tar.gz"  # noqa: E731
    named = ["env", f"JSR_ENV_PACK={root}/packs/{pack('a')}", "sleep", "300"]
    ended, ended_job = submitted(transport, root, "ended", held=False, command=["true"])
    gone, gone_job = submitted(transport, root, "gone", held=False, command=["true"])
    recent, recent_job = submitted(transport, root, "recent", held=False, command=["true"])
    live, live_job = submitted(transport, root, "live", held=True, command=named)
    orphan, orphan_job = submitted(transport, root, "orphan", held=True, command=["sleep", "300"])
    cancel_jobs += [live_job, orphan_job]
    for job in (ended_job, gone_job, recent_job):
        wait_for(lambda job=job: last_state(job) in ("COMPLETED", ""), 60, f"job {job} to end")
    write_record(registry, root, ended, ended_job, "STOPPED", days=10)
    write_record(registry, root, recent, recent_job, "STOPPED", days=1)
    write_record(registry, root, live, live_job, "PENDING", days=10)
    for name in (pack("a"), pack("b")):
        write_as(USER, root / "packs" / name, os.urandom(300000))
    cached = Path(os.environ["XDG_CACHE_HOME"], "jupyter-slurm-ray", "packs", pack("c"))
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"c" * 200000)
    for path in [*(root / n for n in (ended, gone, live, orphan)), *root.glob("packs/*"), cached]:
        aged(path)
    aged(root / recent, days=1)
    answers: list[str] = []

    def answer(question: str) -> str:  # no orphan is cancelled; the removal is confirmed
        answers.append(question)
        return "y" if question.startswith("remove ") else "n"

    assert main(["gc", "--dry-run"]) == 0
    dry = capsys.readouterr().out
    print(dry)
    would = {
        line.split(" (")[0].split()[-1]: line
        for line in dry.splitlines()
        if line.startswith("would remove")
    }
    assert set(would) == {
        f"{root}/{ended}",
        f"{root}/{gone}",
        f"{root}/packs/{pack('b')}",
        str(cached),
    }
    assert "(STOPPED 10.0 days ago, by its record): " in would[f"{root}/{ended}"]
    assert (
        "(no record; Slurm shows no active job of it; untouched for 10.0 days): "
        in would[f"{root}/{gone}"]
    )
    assert would[f"{root}/packs/{pack('b')}"].endswith("): 293.0 KiB")
    assert f"kept job dir {root}/{live}: its cluster is PENDING (record)" in dry
    assert f"kept job dir {root}/{orphan}: Slurm shows an active job of it (by its tag)" in dry
    assert f"kept job dir {root}/{recent}: ended or untouched for 1.0 days only" in dry
    assert dry.splitlines()[-1].startswith("would free ")
    assert all(Path(p).exists() for p in would)  # a dry run removes nothing

    assert main(["gc"], ask=answer) == 0
    out = capsys.readouterr().out
    print(out)
    assert [q for q in answers if q.startswith("remove ")] == [answers[-1]]
    assert not any(Path(p).exists() for p in would)
    for kept in (root / live, root / orphan, root / recent, root / "packs" / pack("a")):
        assert kept.exists(), kept
    assert pending_or_running(live_job) and pending_or_running(orphan_job)  # untouched
    assert "removed 4 of 4" in out and Registry().load(ended) is None
