"""The bootstrap judges its owner by the lease: stale only after the idle timeout without a
change, and a job whose owner is already gone starts nothing. Pure: a tmp job dir."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from ..helpers.bootstrap import bootstrap_module, lease_json
from ..helpers.clock import VirtualClock

jsr_events = bootstrap_module("jsr_events")


def test_lease_watch_judges_content_changes(tmp_path: Path, monkeypatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(jsr_events.time, "monotonic", lambda: clock[0])
    (tmp_path / "lease").write_text("1")
    watch = jsr_events.LeaseWatch(tmp_path, owner_timeout=10)
    clock[0] += 9
    assert not watch.stale()
    (tmp_path / "lease").write_text("2")  # a change restarts the clock
    clock[0] += 9
    assert not watch.stale()  # seen at 1018
    clock[0] += 9
    assert not watch.stale()
    clock[0] += 2
    assert watch.stale()  # unchanged since 1018 for 11 s
    (tmp_path / "detached").touch()
    clock[0] += 20
    assert not watch.stale()


def write_lease(path: Path, text: str) -> None:
    (path / "lease").write_text(text)


def test_owner_gone_judges_the_lease_before_anything_starts(tmp_path: Path, monkeypatch) -> None:
    never = lambda: False  # noqa: E731
    clock = VirtualClock()
    monkeypatch.setattr(jsr_events, "time", clock.as_time_module())
    write_lease(tmp_path, lease_json(time.time() - 5))
    assert jsr_events.owner_gone(tmp_path, 60, never) is None
    assert clock.slept == 0  # fresh: no waiting

    write_lease(tmp_path, lease_json(time.time() - 3 * 3600 - 5, renew_every=0.2))
    gone = jsr_events.owner_gone(tmp_path, 60, never)
    assert clock.slept == pytest.approx(3.4, abs=0.25)  # waited 2 * renew_every + 3 for a change
    monkeypatch.undo()
    assert gone["reason"] == (
        "the owner's lease was last renewed 3:00:05 ago (owner_timeout 60 s): "
        "the owner is gone, Ray was not started"
    )
    assert 3 * 3600 < gone["lease_age"] < 3 * 3600 + 7

    write_lease(tmp_path, "4242 17\n")  # the old format has no time: only a change tells
    gone = jsr_events.owner_gone(tmp_path, 1.0, never)
    assert gone["lease_age"] is None and "has no renewal time" in gone["reason"]
    (tmp_path / "lease").unlink()
    assert "is missing" in jsr_events.owner_gone(tmp_path, 1.0, never)["reason"]

    write_lease(tmp_path, "4242 17\n")
    renewer = threading.Timer(0.5, write_lease, (tmp_path, "4242 18\n"))
    renewer.start()
    assert jsr_events.owner_gone(tmp_path, 2.0, never) is None  # it changed: alive
    renewer.join()
    assert jsr_events.owner_gone(tmp_path, 1.0, lambda: True) is None  # scancel meanwhile
    assert jsr_events.owner_gone(tmp_path, 0, never) is None  # no owner_timeout
    (tmp_path / "detached").touch()
    assert jsr_events.owner_gone(tmp_path, 1.0, never) is None


def age_file(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_a_lease_both_clocks_call_old_means_gone_at_once(tmp_path: Path, monkeypatch) -> None:
    never = lambda: False  # noqa: E731
    clock = VirtualClock()
    monkeypatch.setattr(jsr_events, "time", clock.as_time_module())
    write_lease(tmp_path, lease_json(time.time() - 3 * 3600 - 5, renew_every=10))
    age_file(tmp_path / "lease", 3 * 3600)  # the filesystem stamped it three hours ago
    gone = jsr_events.owner_gone(tmp_path, 60, never)
    assert clock.slept == 0  # no waiting for a change that cannot come
    assert gone["reason"].startswith("the owner's lease was last renewed 3:00:0")
    assert 3 * 3600 - 5 < gone["lease_file_age"] < 3 * 3600 + 60 and gone["waited"] == 0
    assert [p.name for p in tmp_path.iterdir()] == ["lease"]  # the clock probe is gone

    write_lease(tmp_path, lease_json(time.time() - 5))
    age_file(tmp_path / "lease", 3 * 3600)  # its time is fresh: alive, whatever the file says
    assert jsr_events.owner_gone(tmp_path, 60, never) is None
    assert clock.slept == 0


def test_clocks_that_disagree_wait_for_a_change(tmp_path: Path) -> None:
    """The owner's clock behind by hours: its ``t`` looks old, the file was written just now
    (by the filesystem's clock): a change is waited for, as without the file's time."""
    write_lease(tmp_path, lease_json(time.time() - 2 * 3600, renew_every=1.0))
    renewer = threading.Timer(0.3, write_lease, (tmp_path, lease_json(time.time() - 2 * 3600 + 1)))
    renewer.start()
    try:
        assert jsr_events.owner_gone(tmp_path, 60, lambda: False) is None  # it changed: alive
    finally:
        renewer.join()
