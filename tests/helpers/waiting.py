"""Waiting for a condition, bounded: one helper for sync and one for async tests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float, what: str, step: float = 0.5) -> T:
    """The predicate's first truthy value, polled every ``step`` s; AssertionError after
    ``timeout`` s, naming ``what`` was awaited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


async def until(predicate: Callable[[], T], timeout: float, what: str, step: float = 0.05) -> T:
    """``wait_for`` for async tests: the event loop keeps running while waiting."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        await asyncio.sleep(step)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
