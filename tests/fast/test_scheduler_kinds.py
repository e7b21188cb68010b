"""Which scheduler a mode or a job id names (``scheduler/kinds.py``): the package's own three,
registered as entry points; a second batch system registered the same way is chosen by its
mode and found by its ids, and nothing else in the package has to know it."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from jupyter_slurm_ray.client.mode import KernelPlace
from jupyter_slurm_ray.errors import SpecError
from jupyter_slurm_ray.scheduler import kinds, modes
from jupyter_slurm_ray.scheduler.kind import EnclosingJob
from jupyter_slurm_ray.slurm.client import SlurmClient
from jupyter_slurm_ray.slurm.heresteps import HereSteps
from jupyter_slurm_ray.slurm.localjobs import LocalJobs
from jupyter_slurm_ray.slurm.schedulers import query_jobs, scheduler_for_mode, scheduler_of
from jupyter_slurm_ray.slurm.usage import fetch_usages
from jupyter_slurm_ray.spec import ClusterSpec
from jupyter_slurm_ray.transport import LocalTransport
from tests.helpers.toyscheduler import ToyScheduler

PACKAGE_KINDS = {"slurm": SlurmClient, "local": LocalJobs, "here": HereSteps}


@pytest.fixture
def toy():
    """The toy scheduler registered as its entry point would register it."""
    kinds.register(ToyScheduler)
    yield ToyScheduler
    kinds.unregister(ToyScheduler.mode)


def test_the_package_registers_its_three_kinds_as_entry_points() -> None:
    installed = modes.installed()
    assert {mode: installed.get(mode) for mode in modes.BUILT_IN} == modes.BUILT_IN
    assert {mode: kinds.kinds()[mode] for mode in PACKAGE_KINDS} == PACKAGE_KINDS


@pytest.mark.parametrize(
    ("job_id", "kind"),
    [
        ("1234", SlurmClient),
        ("1234_7", SlurmClient),
        ("local-4242", LocalJobs),
        ("here-1234-99", HereSteps),
        (None, SlurmClient),
    ],
)
def test_a_job_id_names_its_kind(job_id: str | None, kind: type) -> None:
    assert kinds.kind_of(job_id) is kind
    assert isinstance(scheduler_of(LocalTransport(), job_id), kind)


def test_a_mode_nobody_registered_is_refused_naming_those_there_are() -> None:
    with pytest.raises(SpecError) as refused:
        kinds.kind_for_mode("pbs")
    assert "mode" in str(refused.value) and "'slurm', 'local', 'here'" in str(refused.value)


def test_a_spec_takes_the_mode_of_a_registered_kind_and_only_while_it_is(toy) -> None:
    assert ClusterSpec(mode="toy").mode == "toy"
    kinds.unregister("toy")
    with pytest.raises(SpecError) as refused:
        ClusterSpec(mode="toy")
    assert refused.value.field == "mode" and "'slurm', 'local', 'here'" in str(refused.value)


async def test_a_registered_kind_is_chosen_by_its_mode_and_found_by_its_ids(
    toy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    transport = LocalTransport()
    scheduler = scheduler_for_mode("toy", transport)
    assert isinstance(scheduler, toy)
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    job_id = await scheduler.submit(f"#!/bin/bash\n#TOY chdir={job_dir}\nexit 0\n")
    assert isinstance(scheduler_of(transport, job_id), toy)
    # asked through another kind's scheduler (the watcher's is Slurm's), the toy answers
    local = LocalJobs(transport)
    for _ in range(200):
        answer = await query_jobs(local, [job_id, "local-1"])
        if answer[job_id].is_final:
            break
    assert answer[job_id].state == "COMPLETED" and answer[job_id].source == "toy"
    assert local.commands_run >= 1  # the toy's command is counted as the asking scheduler's


async def test_each_kind_says_why_accounting_has_no_usage_of_its_jobs() -> None:
    usage = await fetch_usages(LocalTransport(), [("local-5",), ("here-77-5", "78")])
    assert usage[("local-5",)].unavailable == "local mode has no Slurm accounting"
    assert "allocation 77's usage" in usage[("here-77-5", "78")].unavailable


def test_the_job_a_kernel_runs_in_is_found_by_the_kind_that_knows_its_environment(toy) -> None:
    """The panel's --here box, the driver check and doctor ask ``enclosing_job``; Slurm's
    variables are read in Slurm's scheduler alone, and a new kind's are found the same way."""
    slurm_job = {"SLURM_JOB_ID": "41", "SLURM_JOB_NUM_NODES": "3"}
    assert kinds.enclosing_job(slurm_job) == EnclosingJob("41", 3)
    assert kinds.enclosing_job({"SLURM_JOBID": "42"}) == EnclosingJob("42", 1)
    assert kinds.enclosing_job({"TOY_JOB_ID": "toy-3"}) == EnclosingJob("toy-3", 1)
    assert kinds.enclosing_job({}) is None
    assert KernelPlace.here(environ={"TOY_JOB_ID": "toy-3"}).slurm_job == "toy-3"


def test_a_broken_registration_is_left_out_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    broken = {"pbs": "no_such_module:PbsJobs", "odd": "pathlib:Path"}
    monkeypatch.setattr(modes, "installed", lambda: broken)
    monkeypatch.setattr(kinds, "_loaded", {})  # loaded anew, and the next test too
    with caplog.at_level(logging.WARNING, logger=kinds.__name__):
        found = kinds.kinds()
    assert set(found) == set(PACKAGE_KINDS)
    assert "'pbs'" in caplog.text and "'odd'" in caplog.text
