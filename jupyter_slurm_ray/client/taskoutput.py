"""What a cell's Ray tasks print shows under that cell.

Ray hands what tasks print to the driver in a background thread (Ray Client's log stream, or a
driver's log subscriber), a few hundred milliseconds after the task printed it: on its way
through the node's log monitor and the head. Jupyter's kernel sends a background thread's
output to the cell that runs when it is written. A cell that waited for its tasks
(``ray.get``, ``ray.wait``) ends before their last lines arrive, and the lines showed under
the next cell run, or under none. So when a cell that waited on Ray ends (IPython's
``post_run_cell``), the kernel waits until Ray's output has been quiet for :data:`QUIET_S`,
:data:`SETTLE_S` at least and :data:`LONGEST_S` at most: what the cell's tasks printed
arrives while it is still the running cell. Cells that did not wait on Ray wait for nothing.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

__all__ = ["TaskOutput", "task_output"]

# Ray's way from a task's print to the kernel: through Ray Client at most 0.08 s after ray.get
# returned (8 tasks on the testbed); a driver's goes through the node's log monitor, which
# looks at the files every 0.1 s, and the head: a margin for both
SETTLE_S = 0.4
QUIET_S = 0.25  # no line for this long: the cell's output has arrived
LONGEST_S = 2.0  # a cell never waits longer (a task that prints on and on)
STEP_S = 0.05
_WRAPPED = "__jsr_task_output__"


class TaskOutput:
    """When Ray's output last arrived, and whether the running cell waited on Ray."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.clock, self.sleep = clock, sleep
        self.last_line = float("-inf")
        self.waited = False

    def line_arrived(self) -> None:
        self.last_line = self.clock()

    def waited_on_ray(self) -> None:
        self.waited = True

    def settle(self, *_: Any) -> float:
        """After a cell (``post_run_cell``): the seconds waited for its tasks' last lines."""
        if not self.waited:
            return 0.0
        self.waited = False
        start = self.clock()
        while True:
            now = self.clock()
            if now - start >= LONGEST_S:
                break
            if now - start >= SETTLE_S and now - self.last_line >= QUIET_S:
                break
            self.sleep(STEP_S)
        return self.clock() - start

    def watch(self, ray: ModuleType) -> None:
        """Wrap ``ray.get``/``ray.wait`` (a cell waited) and Ray's two printers of task
        output (a line arrived), once."""
        for name in ("get", "wait"):
            original = getattr(ray, name, None)
            if original is not None and not getattr(original, _WRAPPED, False):
                setattr(ray, name, self._noting(original, self.waited_on_ray))
        for owner in _printers():
            module_or_class, name = owner
            original = getattr(module_or_class, name, None)
            if original is not None and not getattr(original, _WRAPPED, False):
                setattr(module_or_class, name, self._noting(original, self.line_arrived))

    @staticmethod
    def _noting(function: Callable[..., Any], note: Callable[[], None]) -> Callable[..., Any]:
        @functools.wraps(function)
        def noted(*args: Any, **kwargs: Any) -> Any:
            try:
                return function(*args, **kwargs)
            finally:
                note()

        setattr(noted, _WRAPPED, True)
        return noted


def _printers() -> list[tuple[Any, str]]:
    """Where Ray prints task output: Ray Client's log stream and a driver's log printer."""
    found: list[tuple[Any, str]] = []
    try:
        from ray.util.client.logsclient import LogstreamClient

        found.append((LogstreamClient, "stdstream"))
    except ImportError:
        pass
    try:
        from ray._private import worker

        found.append((worker, "print_to_stdstream"))
    except ImportError:
        pass
    return found


task_output = TaskOutput()  # this process's: Ray's printers are process-wide
