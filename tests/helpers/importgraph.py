"""The package's import graph, read from its source: modules, the arrows between them (imports
inside functions and under ``TYPE_CHECKING`` included), the circles, and each module's layer.

Written here rather than taken from grimp/pydeps: the bootstrap runs on the nodes as a program
of its own whose modules import each other by bare name (``from jsr_base import …``), which
those tools do not resolve. ``scripts/import-graph`` draws it (``docs/imports-*.svg``).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

PACKAGE = "jupyter_slurm_ray"
ROOT = Path(__file__).resolve().parents[2] / PACKAGE
PLAIN_PROGRAMS = ("bootstrap",)  # subpackages whose modules import each other by bare name
SKIPPED = ("bootstrap.sitepath",)  # put on Ray's own sys.path, not imported by the package


@dataclass
class ImportGraph:
    arrows: dict[str, set[str]] = field(default_factory=dict)  # module -> modules it imports

    @property
    def modules(self) -> list[str]:
        return sorted(self.arrows)

    def circles(self) -> list[list[str]]:
        """The strongly connected groups of more than one module (Tarjan's algorithm)."""
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        stack: list[str] = []
        found: list[list[str]] = []

        def visit(module: str) -> None:
            index[module] = low[module] = len(index)
            stack.append(module)
            for target in sorted(self.arrows[module]):
                if target not in index:
                    visit(target)
                    low[module] = min(low[module], low[target])
                elif target in stack:
                    low[module] = min(low[module], index[target])
            if low[module] == index[module]:
                group = []
                while True:
                    top = stack.pop()
                    group.append(top)
                    if top == module:
                        break
                if len(group) > 1:
                    found.append(sorted(group))

        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(limit, 10 * len(self.arrows)))
        try:
            for module in self.modules:
                if module not in index:
                    visit(module)
        finally:
            sys.setrecursionlimit(limit)
        return found

    def layers(self) -> dict[str, int]:
        """Each module's layer: 1 for a module that imports none of the package, else one more
        than the highest layer it imports (modules of one circle share a layer)."""
        group_of = {m: tuple(g) for g in self.circles() for m in g}
        layer: dict[str, int] = {}

        def of(module: str) -> int:
            if module not in layer:
                members = group_of.get(module, (module,))
                for member in members:
                    layer[member] = 1  # provisional: a circle does not lift itself
                below = {t for m in members for t in self.arrows[m]} - set(members)
                value = 1 + max((of(t) for t in below), default=0)
                for member in members:
                    layer[member] = value
            return layer[module]

        for module in self.modules:
            of(module)
        return layer

    def rooms(self) -> ImportGraph:
        """The graph of rooms: a folder of the package (``slurm/``) is one room, a module at
        its top level (``cluster.py``) another; one room imports another where any of its
        modules imports any of the other's."""
        arrows: dict[str, set[str]] = {room_of(m): set() for m in self.modules}
        for source, targets in self.arrows.items():
            arrows[room_of(source)] |= {room_of(t) for t in targets} - {room_of(source)}
        return ImportGraph(arrows)

    def between(self, source_room: str, target_room: str) -> list[str]:
        """The module arrows that make the arrow between two rooms."""
        return [
            f"{source} -> {target}"
            for source, targets in sorted(self.arrows.items())
            if room_of(source) == source_room
            for target in sorted(targets)
            if room_of(target) == target_room
        ]

    def top_level(self) -> list[str]:
        """The modules directly in the package (its subpackages not counted)."""
        packages = {m.partition(".")[0] for m in self.modules if "." in m}
        return [m for m in self.modules if "." not in m and m not in packages | {"__init__"}]


def room_of(module: str) -> str:
    """``slurm.watch`` → ``slurm/``; ``spec`` (``spec/__init__.py``) → ``spec/``; ``cluster`` →
    ``cluster.py``; the package's own ``__init__`` → ``__init__.py``."""
    head = module.partition(".")[0]
    return f"{head}/" if (ROOT / head).is_dir() else f"{head}.py"


@cache
def package_graph(root: Path = ROOT) -> ImportGraph:
    paths = [p for p in root.rglob("*.py") if "labextension" not in p.parts]
    names = {_module_name(root, path): path for path in sorted(paths)}
    names = {name: path for name, path in names.items() if not name.startswith(SKIPPED)}
    graph = ImportGraph({name: set() for name in names})
    for name, path in names.items():
        for target in _imported(name, path, names):
            if target != name:
                graph.arrows[name].add(target)
    return graph


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def _imported(name: str, path: Path, known: dict[str, Path]) -> Iterable[str]:
    program = next((p for p in PLAIN_PROGRAMS if name.startswith(p + ".")), None)
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield from _known(_within_package(alias.name), known)
        elif isinstance(node, ast.ImportFrom):
            base = _from_base(name, path, node, program, known)
            for alias in node.names:
                yield from _known(f"{base}.{alias.name}" if base else alias.name, known, base)


def _from_base(
    name: str, path: Path, node: ast.ImportFrom, program: str | None, known: dict[str, Path]
) -> str:
    if node.level:
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        package = package[: len(package) - node.level + 1] if node.level > 1 else package
        package = [p for p in package if p != "__init__"]
        return ".".join([*package, *([node.module] if node.module else [])])
    module = node.module or ""
    if program and f"{program}.{module}".split(".")[0] == program:
        bare = f"{program}.{module}"
        if bare in known:
            return bare
    return _within_package(module)


def _within_package(dotted: str) -> str:
    if dotted == PACKAGE:
        return "__init__"
    return dotted.removeprefix(PACKAGE + ".") if dotted.startswith(PACKAGE + ".") else ""


def _known(candidate: str, known: dict[str, Path], base: str | None = None) -> Iterable[str]:
    for name in (candidate, base):
        while name:
            if name in known:
                yield name
                return
            name = name.rpartition(".")[0]
