"""One background event loop per process, and the blocking twins of the async core.

Notebooks already run an event loop, so the sync methods cannot ``asyncio.run``. Instead every
coroutine runs on one long-lived loop in a daemon thread; that loop also keeps serving SSH port
forwards while ``ray.init`` or a notebook cell blocks the main thread.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, TypeVar

T = TypeVar("T")
S = TypeVar("S")
P = ParamSpec("P")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def background_loop() -> asyncio.AbstractEventLoop:
    """The process-wide loop thread, started on first use."""
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(
                target=loop.run_forever, name="jupyter-slurm-ray-loop", daemon=True
            )
            thread.start()
            _loop = loop
        return _loop


def run_sync(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """Run ``coro`` on the background loop and wait for its result from any other thread."""
    loop = background_loop()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        coro.close()
        raise RuntimeError("use the *_async method from code already running on the loop")
    future = asyncio.run_coroutine_threadsafe(coro, loop)
    try:
        return future.result(timeout)
    except KeyboardInterrupt:
        future.cancel()
        raise


def blocking(
    method: Callable[Concatenate[S, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[S, P], T]:
    """The blocking twin of an ``*_async`` method, for notebooks: ``up = blocking(up_async)``.

    Declared in the class body, so the twin is visible (and typed) like any method.
    """

    @functools.wraps(method)
    def twin(self: S, *args: P.args, **kwargs: P.kwargs) -> T:
        return run_sync(method(self, *args, **kwargs))

    name = method.__name__.removesuffix("_async")
    twin.__name__ = name
    twin.__qualname__ = method.__qualname__.removesuffix("_async")
    twin.__doc__ = f"Blocking form of :meth:`{method.__name__}`.\n\n{method.__doc__ or ''}"
    return twin
