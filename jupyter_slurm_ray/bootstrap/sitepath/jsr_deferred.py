"""Imports that cost seconds and are rarely used, deferred to their first use.

``rfc3987_syntax`` builds its Lark grammars when imported (about 0.9 s of CPU, measured on the
testbed: ``import ray`` 1.5 s with it, 0.45 s without); jsonschema imports it for one optional
format check, Ray imports jsonschema, and so does Jupyter Server (through jupyter_events). Here
the import gives a stand-in whose functions and attributes load the real module the first
time they are used: nothing is lost, only moved to where it is needed.

Installed by ``sitecustomize`` in every Python process of a cluster's Ray, by the kernel before
it imports ray, and in every Python process of the project's venv by the ``.pth`` file
scripts/setup writes there (both ``client/deferral.py``). Standalone: it runs where the
package cannot be imported.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from types import ModuleType
from typing import Any

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


def install() -> bool:
    """The stand-ins from now on in this process (once); False when there is nothing left to
    defer (each module already imported, or the finder already there)."""
    if any(type(finder).__name__ == _DeferredImports.__name__ for finder in sys.meta_path):
        return False  # this one's or another copy's (two copies must not both defer)
    if all(name in sys.modules for name in DEFERRED):
        return False
    sys.meta_path.insert(0, _DeferredImports())
    return True
