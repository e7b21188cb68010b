"""Run by every Python process Ray starts for the cluster (this directory is first on their
PYTHONPATH): imports that cost seconds and are rarely used are deferred to their first use.

``rfc3987_syntax`` builds its Lark grammars when imported (1-2 s of CPU); jsonschema imports it
for one optional format check, Ray imports jsonschema, and a Ray node starts about fifteen
Python processes, all paying it at once. Here the import gives a stand-in whose functions and
attributes load the real module the first time they are used: nothing is lost, only moved to
where it is needed. Then the ``sitecustomize`` this file shadows, if there is one, runs as usual.

It also installs ``jsr_clientguard``: Ray Client's proxier sends a client's requests (with the
cluster token) only to the server it started for that client (see there).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any

import jsr_clientguard  # beside this file, first on sys.path

# module -> functions others import by name (``from m import f``), deferred as well
DEFERRED = {"rfc3987_syntax": ("is_valid_syntax", "parse")}


class _DeferredImports(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self) -> None:
        self.loading: set[str] = set()

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name in DEFERRED and name not in self.loading:
            return importlib.util.spec_from_loader(name, self)
        return None

    def create_module(self, spec: Any) -> None:
        return None  # the default module object

    def exec_module(self, module: ModuleType) -> None:
        name = module.__name__

        def real() -> ModuleType:
            """The real module, imported now (once) and put in the stand-in's place."""
            loaded = sys.modules.get(name)
            if loaded is not None and loaded is not module:
                return loaded
            self.loading.add(name)
            try:
                sys.modules.pop(name, None)
                loaded = importlib.import_module(name)
            finally:
                self.loading.discard(name)
            return loaded

        def forward(function: str) -> Any:
            def call(*args: Any, **kwargs: Any) -> Any:
                return getattr(real(), function)(*args, **kwargs)

            call.__name__ = function
            return call

        def other_attribute(attr: str) -> Any:
            if attr.startswith("__"):  # asked by the import system itself (e.g. __path__)
                raise AttributeError(attr)
            return getattr(real(), attr)

        for function in DEFERRED[name]:
            setattr(module, function, forward(function))
        module.__getattr__ = other_attribute  # type: ignore[method-assign]
        module.__deferred__ = True  # type: ignore[attr-defined]


def _is_a_copy_of_this(path: str) -> bool:
    """The directory holds this file's copy: another cluster's (a cluster started from a
    process of another one has both on PYTHONPATH), or this one. Its guard's module marks it."""
    return os.path.isfile(os.path.join(path or os.curdir, "jsr_clientguard.py"))


def _run_shadowed_sitecustomize() -> None:
    """The first ``sitecustomize`` on sys.path that is not a copy of this one: running
    another copy would run this again, which would look for the next one (endlessly)."""
    others = [p for p in sys.path if not _is_a_copy_of_this(p)]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


sys.meta_path.insert(0, _DeferredImports())
jsr_clientguard.install()
_run_shadowed_sitecustomize()
