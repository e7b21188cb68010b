"""Interrupting a cell that waits on Ray stops what it waits for.

A notebook's ■ (SIGINT, ``KeyboardInterrupt`` in the kernel's main thread) ends the wait in
``ray.get`` or ``ray.wait``, but Ray keeps running the tasks: the cluster stays busy with work
nobody will read, and the next cell queues behind it. Wrapped here (by ``rayinit``, with
``ray.init``): on that interrupt, the tasks behind the ``ObjectRef`` the call was given are
cancelled with ``ray.cancel`` (Ray raises ``KeyboardInterrupt`` in each task; ``recursive``: the
tasks they started too; ``force`` for those still running after a grace), one line says how
many, and the interrupt goes on as it was. An actor's task that Ray does not cancel, or a ref
that is no task's, is counted as not cancelled.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any

__all__ = ["wrap_waits"]

log = logging.getLogger(__name__)
_WRAPPED = "__jsr_interruptible__"
GRACE_S = 2.0  # how long a cancelled task has to end by itself before it is forced


def wrap_waits(ray: ModuleType) -> None:
    """``ray.get`` and ``ray.wait`` cancel what they wait for when interrupted (once)."""
    originals = {name: getattr(ray, name, None) for name in ("get", "wait")}
    for name, original in originals.items():
        if original is None or getattr(original, _WRAPPED, False):
            continue
        wrapped = _interruptible(original, ray, originals["wait"])
        setattr(wrapped, _WRAPPED, True)
        setattr(ray, name, wrapped)


def _interruptible(
    wait: Callable[..., Any], ray: ModuleType, plain_wait: Callable[..., Any] | None
) -> Callable[..., Any]:
    @functools.wraps(wait)
    def call(refs: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return wait(refs, *args, **kwargs)
        except KeyboardInterrupt:
            cancelled, kept = cancel_all(ray, _refs(refs, ray), plain_wait)
            print(_words(cancelled, kept), file=sys.stderr, flush=True)
            raise

    return call


def _refs(value: Any, ray: ModuleType) -> list[Any]:
    """The ObjectRefs of what ``ray.get``/``ray.wait`` was given (one, or a list of them)."""
    kinds = tuple(
        kind for kind in (getattr(ray, "ObjectRef", None), _client_ref_type()) if kind is not None
    )
    items: Iterable[Any] = value if isinstance(value, (list, tuple)) else [value]
    return [item for item in items if kinds and isinstance(item, kinds)]


def _client_ref_type() -> type | None:
    module = sys.modules.get("ray.util.client.common")
    return getattr(module, "ClientObjectRef", None) if module is not None else None


def cancel_all(
    ray: ModuleType, refs: list[Any], wait: Callable[..., Any] | None = None
) -> tuple[int, int]:
    """``ray.cancel`` each ref's task and the tasks it started; those still running after
    GRACE_S (a task blocked in a call that Ray's interrupt does not end, ``time.sleep`` among
    them) are cancelled with ``force`` (their worker is killed). (cancelled, not cancelled)."""
    cancelled: list[Any] = []
    kept = 0
    for ref in refs:
        try:
            ray.cancel(ref, recursive=True)
            cancelled.append(ref)
        except Exception as exc:  # an actor's task Ray does not cancel, a finished one
            log.debug("ray.cancel(%s): %s", ref, exc)
            kept += 1
    if cancelled and wait is not None:
        _, running = wait(cancelled, num_returns=len(cancelled), timeout=GRACE_S)
        for ref in running:
            try:
                ray.cancel(ref, force=True, recursive=True)
            except Exception as exc:  # an actor's task: no force; it stays cancelled-asked
                log.debug("ray.cancel(%s, force=True): %s", ref, exc)
    return len(cancelled), kept


def _words(cancelled: int, kept: int) -> str:
    line = f"interrupted: cancelled {cancelled} Ray task{'s' if cancelled != 1 else ''}"
    line += " this cell was waiting for"
    if kept:
        line += f" ({kept} could not be cancelled: actor tasks or ended ones)"
    return line
