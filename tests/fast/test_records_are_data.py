"""Records are data, never code: hostile or broken records are shown as such, never run."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time

import pytest

from jupyter_slurm_ray.bootstrap.jsr_wire import LEASE_FILE
from jupyter_slurm_ray.errors import RegistryError
from jupyter_slurm_ray.inventory import (
    Entry,
    Inventory,
    find_orphans,
    kept_by_their_owners,
)
from jupyter_slurm_ray.naming import job_comment
from jupyter_slurm_ray.owner import ProcessIdentity, this_process
from jupyter_slurm_ray.registry import ClusterRecord, Registry
from jupyter_slurm_ray.slurm.client import SlurmClient
from jupyter_slurm_ray.states import status_of_record
from jupyter_slurm_ray.targets import Transports
from jupyter_slurm_ray.ui.formatting import format_table

from ..helpers.fakeslurm import FakeJob


def good(**fields) -> ClusterRecord:
    values = dict(id="good-0001", name="good", target="fake", job_dir="/j/good-0001", job_id="5")
    values.update(fields)
    return ClusterRecord(**values)


def dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def plant(registry: Registry, cluster_id: str, text: str) -> None:
    registry.save(good())  # makes the directories
    path = registry.path / "clusters" / f"{cluster_id}.json"
    path.write_text(text)
    path.chmod(0o600)


@pytest.fixture
def inventory(registry, transport) -> Inventory:
    return Inventory(registry, Transports(lambda: transport))


async def test_a_record_naming_a_command_prefix_runs_nothing(registry, inventory, tmp_path, slurm):
    canary = tmp_path / "touched"
    hostile = good(id="evil-0001", name="evil").__dict__ | {
        "target": {"kind": "local", "command_prefix": ["touch", str(canary)]}
    }
    plant(registry, "evil-0001", json.dumps(hostile))
    slurm.jobs["5"] = FakeJob("5", "", comment=job_comment("good-0001"), state="RUNNING")
    entries = {e.id: e for e in await inventory.entries()}
    assert not canary.exists()
    evil = entries["evil-0001"]
    assert "not configured for" in (evil.error or "") and evil.status.state.value == "SUBMITTING"
    assert "touch" in evil.record.target  # shown, as a name only
    assert not any("touch" in " ".join(call) for call in slurm.calls)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"id": "bad-0001", "name": "bad", "tar', "not valid JSON"),
        ('["a list"]', "not a JSON object"),
        ('{"id": "bad-0001", "name": 7, "target": "fake", "job_dir": "/j"}', "'name'"),
        ('{"id": "bad-0001", "name": "b", "target": "fake", "job_dir": "/j", "state": "ZOMBIE"}',
         "unknown state"),
        ('{"id": "bad-0001", "name": "b", "target": "fake", "job_dir": "/j", "job_id": "1;rm"}',
         "is not a job id"),
        ('{"id": "other-0001", "name": "b", "target": "fake", "job_dir": "/j"}', "file name"),
    ],
)  # fmt: skip
async def test_a_broken_record_is_listed_as_unreadable(registry, inventory, text, why):
    plant(registry, "bad-0001", text)
    entries = {e.id: e for e in await inventory.entries()}
    assert entries["bad-0001"].unreadable and why in entries["bad-0001"].error
    assert entries["good-0001"].record is not None
    assert "bad-0001: unreadable record" in format_table(list(entries.values()))


async def test_a_record_file_another_user_could_write_is_refused(registry, inventory):
    plant(registry, "bad-0001", good(id="bad-0001").to_json())
    (registry.path / "clusters" / "bad-0001.json").chmod(0o666)
    entry = {e.id: e for e in await inventory.entries()}["bad-0001"]
    assert entry.unreadable and "writable by other users" in entry.error


async def test_a_symlinked_record_is_refused(registry, inventory, tmp_path):
    registry.save(good())
    target = tmp_path / "elsewhere.json"
    target.write_text(good(id="link-0001").to_json())
    (registry.path / "clusters" / "link-0001.json").symlink_to(target)
    entry = {e.id: e for e in await inventory.entries()}["link-0001"]
    assert entry.unreadable and "cannot open" in entry.error


async def test_a_group_writable_registry_is_refused_and_listing_still_works(registry, inventory):
    registry.save(good())
    (registry.path / "clusters").chmod(0o770)
    entries = await inventory.entries()
    assert [(e.id, e.unreadable) for e in entries] == [("(registry)", True)]
    assert "writable by other users" in entries[0].error
    with pytest.raises(RegistryError):
        registry.save(good(id="more-0001"))


async def test_gc_never_offers_a_job_whose_record_is_merely_unreadable(registry, transport, slurm):
    plant(registry, "bad-0001", "{truncated")
    slurm.jobs["9"] = FakeJob("9", "", comment=job_comment("bad-0001"), state="RUNNING")
    slurm.jobs["10"] = FakeJob("10", "", comment=job_comment("nobody-0001"), state="RUNNING")
    orphans = await find_orphans(SlurmClient(transport), registry)
    assert [(o.job_id, o.why) for o in orphans] == [("10", "no record of it")]


def test_records_of_older_versions_with_a_target_dict_keep_a_name(registry):
    old = good().__dict__ | {"target": {"kind": "ssh", "host": "login1", "username": "me"}}
    plant(registry, "good-0001", json.dumps(old))
    assert registry.load("good-0001").target == "ssh://me@login1"


def test_an_owner_is_judged_by_pid_and_start_time(registry):
    assert good(owner_pid=os.getpid()).owner_alive
    reused = good(owner_pid=os.getpid(), owner_started="another-boot:1")
    assert reused.owner_gone  # same pid, another process
    elsewhere = good(owner_pid=1, owner_host="another-host")
    assert elsewhere.owner_alive and not elsewhere.owner_gone  # cannot be judged from here


def test_a_record_without_its_owners_identity_is_not_the_readers(registry):
    """The defaults of a new record name the process creating it; a record read without an
    owner must not claim the reader as its owner (it would be judged alive, and "this process")."""
    unowned = {k: v for k, v in good().__dict__.items() if not k.startswith("owner")}
    plant(registry, "good-0001", json.dumps(unowned))
    record = registry.load("good-0001")
    assert (record.owner_pid, record.owner_host, record.owner_started) == (0, "", None)
    assert record.owner_process.alive is None and not record.owner_gone
    assert Entry(record.id, record, status_of_record(record)).owner == "unknown"


def lease_text(owner: ProcessIdentity, age: float, renew_every: float = 2.5) -> str:
    content = {**owner.to_dict(), "term": 0, "seq": 9, "t": time.time() - age}
    return json.dumps(content | {"renew_every": renew_every}) + "\n"


async def test_gc_leaves_a_job_whose_lease_a_live_owner_elsewhere_renews(
    registry, transport, slurm, tmp_path
):
    """No record here (the kernel that owns it keeps its registry on a laptop), but its lease,
    in the job dir Slurm runs the job in, is fresh: not an orphan. A stale lease, the lease
    of a process gone from this host, or none at all leaves it offered."""
    laptop = ProcessIdentity("laptop", 4242, "boot:1")
    gone = ProcessIdentity(socket.gethostname(), dead_pid(), None)
    leases = {
        "11": lease_text(laptop, age=2),
        "12": lease_text(laptop, age=60),
        "13": lease_text(gone, age=1),
        "14": None,
        "15": lease_text(this_process(), age=0, renew_every=1),
    }
    for job_id, text in leases.items():
        job_dir = tmp_path / "jobs" / f"c{job_id}"
        job_dir.mkdir(parents=True)
        if text is not None:
            (job_dir / LEASE_FILE).write_text(text)
        comment = job_comment(f"c{job_id}-0001")
        slurm.jobs[job_id] = FakeJob(job_id, str(job_dir / "job.sbatch"), comment, state="RUNNING")
    client = SlurmClient(transport)
    orphans = await find_orphans(client, registry)
    assert [o.why for o in orphans] == ["no record of it"] * 5
    kept = await kept_by_their_owners(client, orphans)
    assert sorted(kept) == ["11", "15"]
    assert kept["11"].owner == laptop and 1 < (kept["11"].age() or 0) < 10
