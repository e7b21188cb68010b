"""How a cluster shows is the UI's to say (``ui/reprs.py``, ``ui/formatting.py``): the core holds
only these hooks, which the package sets when it is imported, so no core module imports the UI."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Renderer = Callable[[Any, Any, Any], dict[str, Any]]
Describer = Callable[[Any], str]
Progress = Callable[[int, int], None]  # (done, in all)
ProgressBars = Callable[[str, int], Progress | None]  # (what, in all): a bar, or None

_renderer: Renderer | None = None
_describer: Describer | None = None
_progress_bars: ProgressBars | None = None


def set_renderer(
    renderer: Renderer, describer: Describer, progress_bars: ProgressBars | None = None
) -> None:
    """``renderer(obj, include, exclude)`` answers ``_repr_mimebundle_`` from now on,
    ``describer(status)`` says a status in one line, and ``progress_bars(what, total)`` shows
    a long transfer's progress (None where the UI has no bar to show)."""
    global _renderer, _describer, _progress_bars
    _renderer, _describer, _progress_bars = renderer, describer, progress_bars


def progress(what: str, total: int) -> Progress | None:
    """A progress bar of the UI for ``what`` (``total`` in all), or None."""
    return None if _progress_bars is None else _progress_bars(what, total)


def status_text(status: Any) -> str:
    """A cluster's status in one line (``Status.brief()`` when no describer is set)."""
    return status.brief() if _describer is None else _describer(status)


def mimebundle(obj: Any, include: Any = None, exclude: Any = None) -> dict[str, Any]:
    """``obj``'s rich repr; its plain ``repr`` when no renderer is set."""
    if _renderer is None:
        return {"text/plain": repr(obj)}
    return _renderer(obj, include, exclude)
