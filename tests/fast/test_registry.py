"""Cluster records on disk: atomic, private, findable by id, job id or name."""

from __future__ import annotations

import os
import stat

import pytest

from jupyter_slurm_ray.errors import SlurmRayError
from jupyter_slurm_ray.registry import ClusterRecord, Registry


def record(**kw) -> ClusterRecord:
    defaults = dict(id="ray-0001", name="ray", target={"kind": "local"}, job_dir="/j/ray-0001")
    return ClusterRecord(**{**defaults, **kw})


def test_records_round_trip_and_are_private(tmp_path):
    reg = Registry(tmp_path / "state")
    reg.save(record(job_id="12", state="READY", forwards={"client": 40001}))
    loaded = reg.load("ray-0001")
    assert loaded is not None and loaded.job_id == "12" and loaded.forwards == {"client": 40001}
    assert stat.S_IMODE(os.stat(tmp_path / "state").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tmp_path / "state/clusters/ray-0001.json").st_mode) == 0o600
    assert os.listdir(tmp_path / "state/clusters") == ["ray-0001.json"]  # no temp files left


def test_find_by_id_job_id_or_newest_name(tmp_path):
    reg = Registry(tmp_path)
    reg.save(record(id="ray-0001", job_id="12", created_at=1.0))
    reg.save(record(id="ray-0002", job_id="13", created_at=2.0))
    assert reg.find("ray-0001").id == "ray-0001"
    assert reg.find("13").id == "ray-0002"
    assert reg.find("ray").id == "ray-0002"
    assert reg.find("nope") is None


def test_tokens_are_stored_0600_and_deleted_with_the_record(tmp_path):
    reg = Registry(tmp_path)
    reg.save(record())
    path = reg.store_token("ray-0001", "tok")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and path.read_text() == "tok"
    reg.delete("ray-0001")
    assert reg.load("ray-0001") is None and not path.exists()


def test_unknown_fields_from_newer_versions_are_ignored(tmp_path):
    reg = Registry(tmp_path)
    reg.save(record())
    f = tmp_path / "clusters/ray-0001.json"
    f.write_text(f.read_text().replace('"name"', '"future_field": 1, "name"'))
    assert reg.load("ray-0001").name == "ray"


@pytest.mark.parametrize("bad", ["../etc/passwd", "A", "x/y", ""])
def test_ids_cannot_escape_the_directory(tmp_path, bad):
    with pytest.raises(SlurmRayError):
        Registry(tmp_path).load(bad)


def test_owner_alive_is_false_for_a_dead_pid(tmp_path):
    assert record(owner_pid=os.getpid()).owner_alive
    assert not record(owner_pid=2**22 + 12345).owner_alive
