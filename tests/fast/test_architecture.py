"""The package's floor plan, read from its imports (tests/helpers/importgraph.py): no import circle,
arrows that point down (the core never imports the UI or the server), a short top level, and the
folders docs/architecture.md describes."""

import re
from pathlib import Path

from tests.helpers.importgraph import ROOT, package_graph, room_of

WINGS = (
    *("bootstrap", "client", "doctor", "elastic", "job", "scheduler", "server", "slurm", "spec"),
    "ui",
)
ARCHITECTURE = ROOT.parent / "docs" / "architecture.md"
UI_AND_SERVER = ("ui", "server")
# 14 before 2026-12-03, 11 on 2026-12-03, 10 after (docs/architecture.md: how); 11 since
# 2026-12-07: the scheduler interface (scheduler/interface.py) is a layer of its own under
# every scheduler, which the cluster reaches through slurm/schedulers.py
MOST_LAYERS = 11


def test_no_module_imports_itself_back_even_under_type_checking_or_inside_a_function():
    assert package_graph().circles() == []


def test_the_core_and_the_wings_below_it_never_import_the_ui_or_the_server():
    graph = package_graph()
    upward = [
        f"{source} -> {target}"
        for source, targets in graph.arrows.items()
        for target in targets
        if target.split(".")[0] in UI_AND_SERVER
        and source.split(".")[0] not in UI_AND_SERVER
        and source != "__init__"  # the package sets the display hooks (display.py)
    ]
    assert upward == []


def test_the_server_imports_nothing_of_the_ui_it_sends_figures_not_words():
    server_uses = {
        target
        for source, targets in package_graph().arrows.items()
        if source.startswith("server")
        for target in targets
        if target.startswith("ui")
    }
    assert server_uses == set()


def test_the_bootstrap_imports_nothing_of_the_package_outside_it():
    graph = package_graph()
    leaving = {
        f"{source} -> {target}"
        for source, targets in graph.arrows.items()
        if source.startswith("bootstrap")
        for target in targets
        if not target.startswith("bootstrap")
    }
    assert leaving == set()


def test_the_top_level_is_the_core_and_each_wing_a_folder():
    graph = package_graph()
    assert len(graph.top_level()) <= 20, graph.top_level()
    folders = sorted(p.name for p in ROOT.iterdir() if p.is_dir() and any(p.glob("*.py")))
    assert folders == sorted(WINGS)


def floors_in_docs() -> dict[str, int]:
    """docs/architecture.md's folder order: each room (a folder, ``slurm/``, or a module at the
    top level, ``cluster.py``) and its floor, from its table under "## The folder order"."""
    section = ARCHITECTURE.read_text().partition("\n## The folder order\n")[2].partition("\n## ")[0]
    floors: dict[str, int] = {}
    for floor, rooms in re.findall(r"^\| (\d+) \| (.+) \|$", section, re.M):
        for room in re.findall(r"`([^`]+)`", rooms):
            assert room not in floors, f"{room} is on two floors of docs/architecture.md"
            floors[room] = int(floor)
    return floors


def test_docs_architecture_puts_every_folder_and_top_level_module_on_one_floor():
    floors = floors_in_docs()
    rooms = {room_of(module) for module in package_graph().modules}
    assert sorted(rooms - floors.keys()) == [], "rooms docs/architecture.md does not place"
    assert sorted(floors.keys() - rooms) == [], "rooms docs/architecture.md places but are gone"


def test_every_arrow_between_folders_points_down_the_documented_order():
    """A room imports only rooms on floors below its own: no arrow back up, none sideways."""
    graph, floors = package_graph(), floors_in_docs()
    rooms = graph.rooms()
    wrong = [
        f"{source} (floor {floors[source]}) -> {target} (floor {floors[target]}): "
        + ", ".join(graph.between(source, target))
        for source, targets in sorted(rooms.arrows.items())
        for target in sorted(targets)
        if source in floors and target in floors and floors[target] >= floors[source]
    ]
    assert wrong == []


def test_the_cluster_makes_its_elastic_part_and_knows_it_as_elastic_part_names_it():
    """Its one other import of the wing, inside a function: the package's default maker."""
    elastic = {t for t in package_graph().arrows["cluster"] if t.startswith("elastic.")}
    assert elastic <= {"elastic.part", "elastic.policy", "elastic.scaling"}, elastic
    source = (ROOT / "cluster.py").read_text()
    assert source.count("from .elastic.scaling import") == 1
    lazily = "\n    from .elastic.scaling import Elastic\n"  # in a function: importing is cheap
    assert lazily in source


def test_no_module_global_maker_wires_the_package_together():
    assert not re.search(r"\bset_maker\b|\bpackage_maker\b", (ROOT / "__init__.py").read_text())
    assert not re.search(r"^_maker\b", (ROOT / "elastic" / "part.py").read_text(), re.M)


def test_the_layers_do_not_grow():
    assert max(package_graph().layers().values()) <= MOST_LAYERS


def test_docs_architecture_names_every_module_where_it_is():
    text = ARCHITECTURE.read_text()
    named = set(re.findall(r"`((?:[a-z_]+/)?[a-z_]+\.py)`", text))
    own_tables = set(re.findall(r"^### .*\(`jupyter_slurm_ray/([a-z_]+)/`\)", text, re.M))
    missing = [
        path
        for path in (str(p.relative_to(ROOT)) for p in sorted(ROOT.rglob("*.py")))
        if "sitepath" not in path and not path.endswith("__init__.py")
        if path not in named
        and not (path.partition("/")[0] in own_tables and path.partition("/")[2] in named)
    ]
    assert missing == []


def test_the_pictures_of_the_import_graph_are_in_docs():
    docs = ROOT.parent / "docs"
    assert Path(docs / "imports-before.svg").read_text().lstrip().startswith("<?xml")
    assert Path(docs / "imports-after.svg").read_text().lstrip().startswith("<?xml")


def test_only_the_ui_imports_ipython_and_widgets():
    import ast

    found = []
    for path in sorted(ROOT.rglob("*.py")):
        relative = str(path.relative_to(ROOT))
        if relative.startswith("ui/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            found += [
                f"{relative}: {n}" for n in names if n.split(".")[0] in ("IPython", "ipywidgets")
            ]
    assert found == []
