"""``jupyter slurm-ray list | down | logs | gc`` against the testbed's real Slurm.

Jobs here are tagged like the package's own (the real job script with ``sleep`` as its command)
and held in the queue with ``--begin`` so they use no CPUs; records are written directly, so
each test sets up exactly the ownership it is about.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import uuid
from collections.abc import Iterator

import pytest

from jupyter_slurm_ray.aio import run_sync
from jupyter_slurm_ray.job.script import render_job_script
from jupyter_slurm_ray.registry import ClusterRecord, Registry
from jupyter_slurm_ray.spec import ClusterSpec
from jupyter_slurm_ray.transport import LocalTransport
from jupyter_slurm_ray.ui.cli import main

from .helpers.jobs import end_state, last_state, submit_script
from .helpers.site import configured_site
from .helpers.testbed import USER, runuser
from .helpers.waiting import wait_for

pytestmark = [pytest.mark.testbed, pytest.mark.usefixtures("root_logging_kept")]

HELD = ["--begin=now+600"]  # queued, never running during the test


@pytest.fixture(scope="module")
def site(tmp_path_factory, testbed) -> Iterator[dict[str, str]]:
    with configured_site(tmp_path_factory.mktemp("site")) as environment:
        yield environment


@pytest.fixture(scope="module")
def transport(site) -> LocalTransport:
    return LocalTransport(runuser(USER))


def submit(transport: LocalTransport, *, held: bool = True, setup: tuple[str, ...] = ()):
    """A job tagged ``jupyter-slurm-ray:<id>`` as the package's job script tags it."""
    cluster_id = "c" + uuid.uuid4().hex[:10]
    spec = ClusterSpec(
        name=cluster_id, time="5", cpus_per_node=1, setup=setup, extra_sbatch=HELD if held else ()
    )
    job_dir = f"{run_sync(transport.home())}/.jsr-test-jobs/{cluster_id}"
    command = ["sleep", "300"] if held else ["true"]
    script = render_job_script(spec, cluster_id=cluster_id, job_dir=job_dir, command=command)
    job_id = run_sync(submit_script(transport, script, job_dir))
    return cluster_id, job_id, job_dir


def record(transport, cluster_id, job_id, job_dir, **fields) -> ClusterRecord:
    rec = ClusterRecord(
        id=cluster_id,
        name=cluster_id,
        target=transport.target,
        job_dir=job_dir,
        job_id=job_id,
        state=fields.pop("state", "PENDING"),
        spec={"name": cluster_id, "time": "5"},
        **fields,
    )
    Registry().save(rec)
    return rec


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.fixture
def jobs() -> Iterator[list[str]]:
    submitted: list[str] = []
    yield submitted
    subprocess.run(["scancel", *submitted], check=False, capture_output=True)


def test_gc_cancels_orphans_whose_record_was_deleted_or_owner_is_gone(transport, jobs, capsys):
    no_record = submit(transport)
    owner_gone = submit(transport)
    owned = submit(transport)
    detached = submit(transport)
    jobs.extend(job for _, job, _ in (no_record, owner_gone, owned, detached))
    Registry().delete(record(transport, *no_record).id)  # its record was deleted
    record(transport, *owner_gone, owner_pid=dead_pid(), owner_host=socket.gethostname())
    record(transport, *owned, owner_pid=os.getpid())
    record(transport, *detached, owner_pid=dead_pid(), detached=True)

    assert main(["gc", "--yes", *jobs]) == 0
    out = capsys.readouterr().out
    assert f"job {no_record[1]} (cluster {no_record[0]}): no record of it" in out
    assert f"job {owner_gone[1]} (cluster {owner_gone[0]}): its owner (pid" in out
    assert f"cancelled job {no_record[1]}" in out and f"cancelled job {owner_gone[1]}" in out
    assert f"job {owned[1]} " not in out and f"job {detached[1]} " not in out
    # gone from slurmctld's memory when gc took longer than MinJobAge (30 s) on a busy testbed
    assert end_state(no_record[1]) == "CANCELLED" and end_state(owner_gone[1]) == "CANCELLED"
    assert last_state(owned[1]) == "PENDING" and last_state(detached[1]) == "PENDING"


def test_gc_asks_before_cancelling_each_job(transport, jobs, capsys):
    orphan = submit(transport)
    jobs.append(orphan[1])
    questions: list[str] = []

    def answer(question: str) -> str:  # yes for our orphan only: other tests' jobs stay
        questions.append(question)
        return "y" if f"job {orphan[1]} " in question else "n"

    assert main(["gc"], ask=answer) == 0
    assert any(f"cancel job {orphan[1]} (cluster {orphan[0]}: no record" in q for q in questions)
    assert f"cancelled job {orphan[1]}" in capsys.readouterr().out
    assert end_state(orphan[1]) == "CANCELLED"


def test_list_reconciles_the_records_with_slurm(transport, jobs, capsys):
    queued = submit(transport)
    gone = submit(transport)
    jobs.extend([queued[1], gone[1]])
    record(transport, *queued)
    record(transport, *gone, state="READY")
    subprocess.run(["scancel", gone[1]], check=True)
    wait_for(lambda: last_state(gone[1]) == "CANCELLED", 15, "the cancel")

    assert main(["list"]) == 0  # live clusters; the ended ones folded into one line
    listed = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in listed.splitlines()[1:] if line.strip()}
    assert rows[queued[0]][2:4] == [queued[1], "PENDING"]
    assert gone[0] not in rows and "ended (list --all shows them)" in listed
    assert main(["list", "--all"]) == 0
    rows = {
        line.split()[0]: line.split()
        for line in capsys.readouterr().out.splitlines()[1:]
        if line.strip()
    }
    assert rows[gone[0]][2:4] == [gone[1], "CANCELLED"]  # the record said READY


def test_logs_print_the_jobs_output(transport, capsys):
    finished = submit(transport, held=False, setup=("echo hello from the job",))
    record(transport, *finished)
    wait_for(lambda: last_state(finished[1]) == "COMPLETED", 60, "the job to finish")
    assert main(["logs", finished[0]]) == 0
    out = capsys.readouterr().out
    assert f"==> slurm-{finished[1]}.out <==" in out and "hello from the job" in out


def test_down_by_name_and_all(transport, jobs, capsys):
    first, second = submit(transport), submit(transport)
    jobs.extend([first[1], second[1]])
    record(transport, *first)
    record(transport, *second)
    assert main(["down", first[0]]) == 0
    assert end_state(first[1]) == "CANCELLED"
    assert main(["down", "--all"]) == 0
    out = capsys.readouterr().out
    assert end_state(second[1]) == "CANCELLED"
    assert f"{second[0]} ({second[0]}): STOPPED" in out


def test_list_runs_nothing_of_hostile_records_and_refuses_a_group_writable_registry(
    site, tmp_path, capsys
):
    """Records are data: a planted ``command_prefix`` is never run, a truncated record is a
    row saying so; a state dir other users may write is refused with a warning, not a crash."""
    canary = tmp_path / "touched"
    clusters = Registry().path / "clusters"
    clusters.mkdir(mode=0o700, parents=True, exist_ok=True)
    hostile = {
        "id": "evil-0001",
        "name": "evil",
        "target": {"kind": "local", "command_prefix": ["touch", str(canary)]},
        "job_dir": "/tmp",
        "job_id": "1",
        "state": "READY",
    }
    planted = {"evil-0001": json.dumps(hostile), "trunc-0001": '{"id": "trunc-0001", "na'}
    try:
        for cluster_id, text in planted.items():
            (clusters / f"{cluster_id}.json").write_text(text)
            (clusters / f"{cluster_id}.json").chmod(0o600)
        assert main(["list"]) == 0
        listed = capsys.readouterr().out
        evil = next(line.split() for line in listed.splitlines() if " evil-0001 " in line)
        assert evil[3:6] == ["READY", "0/1", "unknown"]  # not "this process": it names none
        assert "evil-0001: started through 'local (touch" in listed  # never run
        assert "trunc-0001: unreadable record: not valid JSON" in listed
        clusters.chmod(0o770)
        assert main(["list"]) == 0
        refused = capsys.readouterr().out
        assert f"the registry directory {clusters} is writable by other users" in refused
        assert "chmod go-w" in refused and "evil-0001" not in refused
        assert not canary.exists()
    finally:
        clusters.chmod(0o700)
        for cluster_id in planted:
            (clusters / f"{cluster_id}.json").unlink(missing_ok=True)
