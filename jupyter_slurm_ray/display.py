"""How a cluster shows is the UI's to say (``ui/reprs.py``, ``ui/formatting.py``): the core holds
only these hooks, which the package sets when it is imported, so no core module imports the UI."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Renderer = Callable[[Any, Any, Any], dict[str, Any]]
Describer = Callable[[Any], str]

_renderer: Renderer | None = None
_describer: Describer | None = None


def set_renderer(renderer: Renderer, describer: Describer) -> None:
    """``renderer(obj, include, exclude)`` answers ``_repr_mimebundle_`` from now on, and
    ``describer(status)`` says a status in one line."""
    global _renderer, _describer
    _renderer, _describer = renderer, describer


def status_text(status: Any) -> str:
    """A cluster's status in one line (``Status.brief()`` when no describer is set)."""
    return status.brief() if _describer is None else _describer(status)


def mimebundle(obj: Any, include: Any = None, exclude: Any = None) -> dict[str, Any]:
    """``obj``'s rich repr; its plain ``repr`` when no renderer is set."""
    if _renderer is None:
        return {"text/plain": repr(obj)}
    return _renderer(obj, include, exclude)
