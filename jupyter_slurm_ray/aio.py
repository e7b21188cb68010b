"""One background event loop per process, and the sync facade over the async core.

Notebooks already run an event loop, so the sync methods cannot ``asyncio.run``. Instead every
coroutine runs on one long-lived loop in a daemon thread; that loop also keeps serving SSH port
forwards while ``ray.init`` or a notebook cell blocks the main thread.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

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


def sync_facade(cls: type[T]) -> type[T]:
    """For every ``name_async`` coroutine method add a blocking ``name`` twin (unless defined)."""
    for attr, func in list(vars(cls).items()):
        if attr.endswith("_async") and inspect.iscoroutinefunction(func):
            name = attr[: -len("_async")]
            if name not in vars(cls):
                setattr(cls, name, _make_sync(func))
    return cls


def _make_sync(func: Callable[..., Coroutine[Any, Any, Any]]) -> Callable[..., Any]:
    @functools.wraps(func)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        return run_sync(func(self, *args, **kwargs))

    wrapper.__name__ = func.__name__[: -len("_async")]
    wrapper.__qualname__ = wrapper.__qualname__[: -len("_async")]
    wrapper.__doc__ = f"Blocking form of :meth:`{func.__name__}`.\n\n{func.__doc__ or ''}"
    return wrapper
