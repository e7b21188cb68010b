"""client/taskoutput.py: a cell that waited on Ray ends once its tasks' output has arrived."""

from __future__ import annotations

import types

import pytest

from jupyter_slurm_ray.client import taskoutput
from jupyter_slurm_ray.client.taskoutput import LONGEST_S, QUIET_S, SETTLE_S, TaskOutput


class FakeTime:
    """A clock that moves only when slept on; lines arrive at the times given."""

    def __init__(self, output: TaskOutput | None = None, arrivals: tuple[float, ...] = ()):
        self.now = 100.0
        self.output, self.arrivals = output, [100.0 + t for t in arrivals]

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        while self.arrivals and self.arrivals[0] <= self.now:
            self.arrivals.pop(0)
            assert self.output is not None
            self.output.line_arrived()


def output_with(arrivals: tuple[float, ...] = ()) -> TaskOutput:
    fake = FakeTime(arrivals=arrivals)
    output = TaskOutput(clock=fake.clock, sleep=fake.sleep)
    fake.output = output
    return output


def test_a_cell_that_did_not_wait_on_ray_waits_for_nothing():
    assert output_with(arrivals=(0.1,)).settle() == 0.0


def test_a_cell_that_waited_gives_rays_output_the_time_of_its_way():
    output = output_with()
    output.waited_on_ray()
    assert output.settle() == pytest.approx(SETTLE_S, abs=0.06)
    assert output.settle() == 0.0  # once per cell


def test_lines_still_arriving_keep_the_cell_until_they_are_quiet():
    output = output_with(arrivals=(0.1, 0.3, 0.5, 0.7, 0.9))
    output.waited_on_ray()
    assert output.settle() == pytest.approx(0.9 + QUIET_S, abs=0.11)  # two clock steps


def test_a_task_that_prints_on_and_on_holds_the_cell_a_bounded_time():
    output = output_with(arrivals=tuple(0.1 * n for n in range(1, 100)))
    output.waited_on_ray()
    assert output.settle() == pytest.approx(LONGEST_S, abs=0.06)


def test_watch_notes_waits_and_lines_once_and_keeps_other_wrappers_marks(monkeypatch):
    def get(refs):
        return refs

    get.__jsr_interruptible__ = True  # interrupts.py's mark survives the second wrapper
    printed = []

    class Printer:
        def stdstream(self, level, msg):
            printed.append(msg)

    monkeypatch.setattr(taskoutput, "_printers", lambda: [(Printer, "stdstream")])
    ray = types.SimpleNamespace(get=get, wait=None)
    output = output_with()
    output.watch(ray)
    output.watch(ray)  # again: no second wrapper
    assert ray.get.__wrapped__ is get and ray.get.__jsr_interruptible__
    assert ray.get([1]) == [1] and output.waited
    Printer().stdstream(0, "line")
    assert printed == ["line"] and output.last_line == 100.0
