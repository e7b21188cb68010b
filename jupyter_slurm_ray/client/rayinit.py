"""``ray.init()`` in a process the package is loaded into means the connected cluster.

Ray's examples begin with ``ray.init()``, and Ray's libraries call it themselves when nothing is
initialised (``auto_init_ray``: a task's ``.remote()``, Ray Data). After ``%slurm_ray up``,
Ray would answer that call with a second Ray started on this host (Ray Client does not take
``ray.init()`` over), or, as a driver, with "called twice"; with no cluster connected it
quietly starts a Ray on a login node, where sites forbid computing. Ray has no hook before
``init``, so ``ray.init`` is wrapped in this process once ``ray`` is imported (through a
one-shot import hook while it is not: importing Ray costs seconds, and is deferred), and
``ray.get`` and ``ray.wait`` with it (``interrupts.py``, ``taskoutput.py``):

- a cluster connected by the package: ``ray.init()`` and ``ray.init("auto")`` return its
  context (keyword arguments that would change it are named in a warning);
- none: :class:`NoClusterError`, one line that says to ``%slurm_ray up``, unless the user opted
  in (``SlurmRay.allow_local_ray``) or named an address of their own (an argument, or
  ``RAY_ADDRESS`` that the package did not set).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import logging
import os
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ..errors import NoClusterError
from .interrupts import wrap_waits
from .taskoutput import task_output

__all__ = [
    "NoClusterError",
    "client_connection",
    "guard_ray_init",
    "note_connected",
    "note_disconnected",
    "own_init",
]

log = logging.getLogger(__name__)

NO_CLUSTER = (
    "no Ray cluster is connected in this kernel: start one with `%slurm_ray up` (or "
    "`%slurm_ray up --local` for a Ray on this host alone); ray.init() would start a Ray on "
    "this host (to allow that: %config SlurmRay.allow_local_ray = True)"
)
# ray.init's keyword arguments that never change which cluster it means
_HARMLESS = frozenset(
    {"ignore_reinit_error", "logging_level", "log_to_driver", "configure_logging"}
)


class _State:
    context: Any = None  # what the package's own ray.init returned
    name = ""
    client = False
    allow_local: Callable[[], bool] = staticmethod(lambda: False)


_state = _State()
_own = threading.local()  # the package's own ray.init calls pass through
_WRAPPED = "__jsr_guarded__"


def note_connected(context: Any, name: str, *, client: bool) -> None:
    """The package connected this process (``ray.init`` returned ``context``)."""
    _state.context, _state.name, _state.client = context, name, client
    guard_ray_init()


def note_disconnected() -> None:
    _state.context = None


def client_connection() -> str | None:
    """The name of the cluster this process is connected to through Ray Client (None: it is
    not, or through a driver)."""
    return _state.name if _state.client and _live() else None


def own_init() -> Any:
    """``with own_init():`` around the package's own ``ray.init`` calls."""
    return _OwnInit()


class _OwnInit:
    def __enter__(self) -> None:
        _own.active = True

    def __exit__(self, *exc: object) -> None:
        _own.active = False


def guard_ray_init(allow_local: Callable[[], bool] | None = None) -> None:
    """Wrap ``ray.init`` in this process, now or when ``ray`` is imported (once)."""
    if allow_local is not None:
        _state.allow_local = allow_local
    ray = sys.modules.get("ray")
    if ray is not None and hasattr(ray, "init"):
        _wrap(ray)
    elif not any(isinstance(finder, _WrapOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _WrapOnImport())


def _live() -> bool:
    """Whether the connection the package made is still there (``ray.shutdown()`` ends it)."""
    if _state.context is None:
        return False
    import ray

    return bool(ray.is_initialized())


def _wrap(ray: ModuleType) -> None:
    wrap_waits(ray)  # an interrupted ray.get/ray.wait cancels what it waits for
    task_output.watch(ray)  # a cell that waited on Ray ends once its tasks' output arrived
    original = ray.init
    if getattr(original, _WRAPPED, False):
        return

    @functools.wraps(original)
    def init(address: str | None = None, *args: Any, **kwargs: Any) -> Any:
        if getattr(_own, "active", False):
            return original(address, *args, **kwargs)
        mine = address in (None, "auto") and not _user_ray_address()
        if mine and _live():
            _warn_ignored(args, kwargs)
            return _state.context
        if mine and not _state.allow_local():
            raise NoClusterError(NO_CLUSTER)
        return original(address, *args, **kwargs)

    setattr(init, _WRAPPED, True)
    setattr(ray, "init", init)  # noqa: B010  (a module's attribute, replaced)


def _user_ray_address() -> bool:
    """``RAY_ADDRESS`` set by the user (the package never sets it in this process)."""
    return bool(os.environ.get("RAY_ADDRESS"))


def _warn_ignored(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    ignored = [name for name in kwargs if name not in _HARMLESS]
    if args or ignored:
        names = ", ".join(ignored + (["positional arguments"] if args else []))
        log.warning(
            "ray.init(): this kernel is connected to cluster %s already (%%slurm_ray up); "
            "ignored: %s",
            _state.name,
            names,
        )
    else:
        log.info("ray.init(): connected to cluster %s already", _state.name)


class _WrapOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when ``ray`` is imported, lets the real finder find it and wraps
    ``init`` once the module has run; then leaves ``sys.meta_path``."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "ray":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _WrappingLoader(spec.loader)
        return spec


class _WrappingLoader(importlib.abc.Loader):
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def create_module(self, spec: Any) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        _wrap(module)

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, ...
        return getattr(self.inner, name)
