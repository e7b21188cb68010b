"""``jupyter slurm-ray gc`` on disk, with a scripted Slurm: ended clusters' job dirs, unused
packs and cached packs go after the retention (``--dry-run`` first shows them and the space
they free); what a live cluster uses stays, by its record or by Slurm's word. The listing and
removal programs run for real on the test's directories (on the testbed:
tests/test_filesystem_trust.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from jupyter_slurm_ray.job import retention
from jupyter_slurm_ray.naming import job_comment
from jupyter_slurm_ray.registry import ClusterRecord, Registry
from jupyter_slurm_ray.ui.cli import main

from ..helpers.fakeslurm import FakeJob

pytestmark = pytest.mark.usefixtures("root_logging_kept")

DAY = 86400.0
OLD = time.time() - 10 * DAY  # past the default retention (7 days)
KEY = "0123456789abcdef"


def job_dir(root: Path, name: str, *, age: float = OLD, outputs=(), pack: str = "") -> Path:
    """A job dir as a cluster leaves it (its files and itself last changed at ``age``)."""
    path = root / name
    (path / "logs").mkdir(parents=True, mode=0o700)
    exec_line = f"exec env JSR_ENV_PACK={root}/packs/{pack} python3 b" if pack else "exec b"
    (path / "job.sbatch").write_text(f"#!/bin/bash\n{exec_line}\n")
    (path / "events.jsonl").write_text("x" * 5000)
    for job_id in outputs:
        (path / f"slurm-{job_id}.out").write_text("out\n")
    for entry in [*path.iterdir(), path]:
        os.utime(entry, (age, age))
    return path


def pack_file(directory: Path, name: str, *, age: float = OLD) -> Path:
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = directory / name
    path.write_bytes(b"p" * 3000)
    os.utime(path, (age, age))
    return path


def record(name: str, root: Path, state: str, updated: float) -> None:
    rec = ClusterRecord(id=name, name=name, target="local", job_dir=str(root / name), state=state)
    registry = Registry()
    registry.save(rec)
    path = registry.record_path(name)  # save() stamps updated_at: set it afterwards
    path.write_text(
        path.read_text().replace(f'"updated_at": {rec.updated_at}', f'"updated_at": {updated}')
    )


@pytest.fixture
def disk(site, jobs_root: Path, slurm, tmp_path, monkeypatch) -> dict[str, Path]:
    """Every kind of job dir and pack, ended or live, past the retention or not."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    slurm.jobs["100"] = FakeJob("100", "", state="RUNNING")  # recordless, still running
    slurm.jobs["101"] = FakeJob("101", "", state="COMPLETED")
    slurm.jobs["102"] = FakeJob("102", "", comment=job_comment("tagged-0006"), state="PENDING")
    packs = jobs_root / "packs"
    made = {
        "ended": job_dir(jobs_root, "ended-0001", outputs=["90"]),
        "recent": job_dir(jobs_root, "recent-0002", age=time.time() - DAY),
        "live": job_dir(jobs_root, "live-0003", pack=f"env-venv-{KEY}.tar.gz"),
        "running": job_dir(jobs_root, "running-0004", outputs=["100"]),
        "gone": job_dir(jobs_root, "gone-0005", outputs=["101"]),
        "tagged": job_dir(jobs_root, "tagged-0006"),
        "named_pack": pack_file(packs, f"env-venv-{KEY}.tar.gz"),
        "unused_pack": pack_file(packs, "env-venv-fedcba9876543210.tar.gz"),
        "fresh_pack": pack_file(packs, "env-conda-fedcba9876543210.tar.gz", age=time.time()),
        "cached": pack_file(
            tmp_path / "cache" / "jupyter-slurm-ray" / "packs", "env-venv-1111111111111111.tar.gz"
        ),
    }
    record("ended-0001", jobs_root, "STOPPED", OLD)
    record("recent-0002", jobs_root, "FAILED", time.time() - DAY)
    record("live-0003", jobs_root, "READY", OLD)
    return made


def test_dry_run_shows_what_would_go_and_the_space_it_frees(disk, capsys) -> None:
    assert main(["gc", "--dry-run"]) == 0
    out = capsys.readouterr().out
    would = [line for line in out.splitlines() if line.startswith("would remove")]
    assert sorted(next(w for w in line.split() if w.startswith("/")) for line in would) == sorted(
        str(disk[k]) for k in ("ended", "gone", "unused_pack", "cached")
    )
    assert f"would remove job dir {disk['ended']} (STOPPED 10.0 days ago, by its record): " in out
    assert (
        f"job dir {disk['gone']} (no record; Slurm shows no active job of it; untouched for 10.0"
        in out
    )
    assert f"kept job dir {disk['live']}: its cluster is READY (record)" in out
    assert f"kept job dir {disk['running']}: Slurm shows an active job of it (100)" in out
    assert f"kept job dir {disk['tagged']}: Slurm shows an active job of it (by its tag)" in out
    assert f"kept job dir {disk['recent']}: ended or untouched for 1.0 days only" in out
    sizes = [line.rsplit(": ", 1)[1] for line in would]
    assert all(size.endswith(("KiB", " B")) for size in sizes)  # du's and stat's sizes
    assert out.splitlines()[-1].startswith("would free ")
    assert all(path.exists() for path in disk.values())  # nothing removed


def test_gc_removes_only_what_ended_or_is_unused(disk, capsys) -> None:
    assert main(["gc", "--yes"]) == 0
    out = capsys.readouterr().out
    gone = {k for k, path in disk.items() if not path.exists()}
    assert gone == {"ended", "gone", "unused_pack", "cached"}, out
    assert "cancelled job 102" in out  # tagged-0006's orphan: its dir stays for now
    assert "freed " in out and "removed 4 of 4" in out
    assert "forgot 1 ended record(s)" in out  # ended-0001's, past the retention
    assert Registry().load("live-0003") is not None and Registry().load("recent-0002") is not None


def test_without_slurm_only_what_a_record_proves_ended_goes(disk, slurm, capsys) -> None:
    slurm.down = True
    assert main(["gc", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "orphaned jobs not looked for: Slurm did not answer" in out
    assert f"would remove job dir {disk['ended']}" in out
    assert f"kept job dir {disk['gone']}: no record, and Slurm could not be asked" in out


def test_gc_asks_before_removing_and_a_no_removes_nothing(disk, capsys) -> None:
    questions: list[str] = []

    def answer(question: str) -> str:
        questions.append(question)
        return "n"

    assert main(["gc"], ask=answer) == 0
    assert any(q.startswith("remove 4 job dir(s) and pack(s), ") for q in questions)
    assert "removed nothing; --yes removes without asking" in capsys.readouterr().out
    assert all(path.exists() for path in disk.values())


def test_gc_of_named_clusters_looks_at_their_job_dirs_only(disk, capsys) -> None:
    assert main(["gc", "--yes", "gone-0005", "live-0003"]) == 0
    assert not disk["gone"].exists()
    assert all(disk[k].exists() for k in ("ended", "live", "unused_pack", "cached"))


def test_a_dir_of_another_user_or_not_a_cluster_is_never_judged() -> None:
    listing = retention.parse_listing(
        "/r",
        "uid 1001\n"
        "dir\tmine-0001\t1001\t1.0\t8\t\t\n"
        "dir\ttheirs-0002\t1002\t1.0\t8\t\t\n"
        "dir\tNot A Cluster\t1001\t1.0\t8\t\t\n"
        "pack\tenv-venv-0123456789abcdef.tar.gz\t1002 1 10\n"
        "garbage line\n",
    )
    assert [d.name for d in listing.dirs] == ["mine-0001", "theirs-0002", "Not A Cluster"]
    said = retention.Activity(clusters=frozenset(), answered=frozenset({"slurm", "local"}))
    removals, kept, _ = retention.ended_job_dirs(listing, [], said, now=1e9, retention=DAY)
    assert [r.name for r in removals] == ["mine-0001"] and kept == []
    assert retention.unused_packs(listing, set(), now=1e9, retention=DAY) == []  # bob's


def test_a_dir_whose_record_cannot_be_read_stays(disk, capsys) -> None:
    Registry().record_path("gone-0005").write_text("{torn")
    assert main(["gc", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"kept job dir {disk['gone']}: its record cannot be read (not valid JSON" in out
