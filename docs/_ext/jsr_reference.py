"""The reference pages' generated parts, from the declarations in the code: every setting
(``ClusterSpec``'s fields in ``spec/__init__.py``, the ``SlurmRay`` traits of ``config.py``, adapt's
options of ``elastic/adaptoptions.py``), the magics' and the CLI's ``--help``, the REST API's
routes and view, the errors and their HTTP statuses, and the bootstrap's events.

A setting or an option without a description fails the build (``missing_descriptions``, at
``builder-inited``); ``tests/fast/test_reference.py`` checks the same in the fast tier. The
collecting half imports no Sphinx, so that test needs none.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "jupyter_slurm_ray"

# ----------------------------------------------------------------------------- collecting


@dataclass(frozen=True)
class Setting:
    """One setting as the reference shows it."""

    name: str
    kind: str  # what a value is: text, integer, number, flag, list, mapping, …
    default: str  # shown as Python writes it; "unset" for None
    help: str
    env: str | None  # its JUPYTER_SLURM_RAY_* variable
    ways: tuple[str, ...]  # how it is set: ClusterSpec(…), %config SlurmRay.…, a profile, …


_KIND_WORDS = {
    "text": "text",
    "int": "integer",
    "float": "number",
    "flag": "true or false",
    "text_or_int": "text or integer",
    "lines": "list of text",
    "ints": "list of integers",
    "mapping": "mapping of text to text",
    "groups": "mapping of group names to settings",
}


def shown(value: Any) -> str:
    """A default as Python writes it (a tuple as a list, a pair list as a mapping)."""
    if value is None:
        return "unset"
    if isinstance(value, tuple):
        if value and all(isinstance(item, tuple) and len(item) == 2 for item in value):
            return repr(dict(value))
        return repr(list(value))
    return repr(value)


def magic_options() -> dict[str, tuple[str, ...]]:
    """Each cluster setting's options in ``%slurm_ray up`` (field name -> option strings)."""
    from jupyter_slurm_ray.ui.magic_args import parsers

    _, subcommands = parsers()
    return {
        action.dest: tuple(action.option_strings)
        for action in subcommands["up"]._actions
        if action.option_strings
    }


def cluster_settings() -> list[Setting]:
    """``ClusterSpec``'s fields: each declared once with its default, check, kind and help."""
    from jupyter_slurm_ray.config import SPEC_SETTINGS, env_name
    from jupyter_slurm_ray.spec import ClusterSpec

    options = magic_options()
    settings = []
    for spec_field in dataclasses.fields(ClusterSpec):
        name = spec_field.name
        ways = [f"ClusterSpec({name}=…)"]
        configurable = name in SPEC_SETTINGS
        if configurable:
            ways += [f"%config SlurmRay.{name}", f"c.SlurmRay.{name}", f"[profiles.P] {name} = …"]
        if name in options:
            ways.append(f"%slurm_ray up {'/'.join(options[name])}")
        settings.append(
            Setting(
                name=name,
                kind=_KIND_WORDS[spec_field.metadata["kind"]],
                default=shown(spec_field.default),
                help=spec_field.metadata["help"],
                env=env_name(name) if configurable else None,
                ways=tuple(ways),
            )
        )
    return settings


def own_settings() -> list[Setting]:
    """``SlurmRay``'s settings of the package itself (not ClusterSpec's, not adapt's)."""
    from jupyter_slurm_ray.config import SPEC_SETTINGS, SlurmRay, env_name
    from jupyter_slurm_ray.elastic.adaptoptions import ADAPT_OPTIONS
    from jupyter_slurm_ray.spec import FORMER_NAMES

    skipped = {*SPEC_SETTINGS, *FORMER_NAMES, *(option.setting for option in ADAPT_OPTIONS)}
    traits = SlurmRay.class_traits(config=True)
    return [
        Setting(
            name=name,
            kind=_trait_kind(trait),
            default="unset",
            help=trait.help or "",
            env=env_name(name),
            ways=(f"%config SlurmRay.{name}", f"c.SlurmRay.{name}"),
        )
        for name, trait in sorted(traits.items())
        if name not in skipped
    ]


def adapt_settings() -> list[Setting]:
    """adapt's options beside its bounds, from their one declaration (``ADAPT_OPTIONS``)."""
    from jupyter_slurm_ray.config import env_name
    from jupyter_slurm_ray.elastic.adaptoptions import ADAPT_OPTIONS

    return [
        Setting(
            name=option.setting,
            kind=_KIND_WORDS[option.kind],
            default=shown(option.default),
            help=option.help,
            env=env_name(option.setting),
            ways=(
                f"cluster.adapt({option.name}=…)",
                f"%config SlurmRay.{option.setting}",
                f"c.SlurmRay.{option.setting}",
                f"POST …/adapt {{{json.dumps(option.name)}: …}}",
            ),
        )
        for option in ADAPT_OPTIONS
    ]


def former_names() -> dict[str, str]:
    """A setting's former name -> its name now (each still works, with a warning)."""
    from jupyter_slurm_ray.spec import FORMER_NAMES

    return dict(FORMER_NAMES)


def _trait_kind(trait: Any) -> str:
    words = {"Unicode": "text", "Int": "integer", "Float": "number", "Bool": "true or false"}
    kind = type(trait).__name__
    return words.get(kind, "list of text" if kind == "List" else kind.lower())


def command_parsers() -> dict[str, tuple[argparse.ArgumentParser, dict[str, Any]]]:
    """The magic's and the CLI's parsers: program -> (root parser, subcommand parsers)."""
    from jupyter_slurm_ray.ui.cli import parser as cli_parser
    from jupyter_slurm_ray.ui.magic_args import parsers

    cli = cli_parser()
    (sub,) = [a for a in cli._actions if isinstance(a, argparse._SubParsersAction)]
    return {"magic": parsers(), "cli": (cli, dict(sub.choices))}


def missing_descriptions() -> list[str]:
    """Every setting and command option that has no description: the reference needs one."""
    missing = [
        f"{where} {setting.name}"
        for where, settings in (
            ("ClusterSpec", cluster_settings()),
            ("SlurmRay", own_settings()),
            ("adapt option", adapt_settings()),
        )
        for setting in settings
        if not setting.help.strip()
    ]
    for program, (root, subcommands) in command_parsers().items():
        for command, parser in {"": root, **subcommands}.items():
            for action in parser._actions:
                if isinstance(action, argparse._SubParsersAction) or action.dest == "help":
                    continue
                if not (action.help or "").strip():
                    name = "/".join(action.option_strings) or action.dest
                    missing.append(f"{program} {command} {name}".replace("  ", " "))
    return missing


def help_text(parser: argparse.ArgumentParser) -> str:
    """``parser``'s --help as a terminal 100 columns wide shows it."""
    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"
    try:
        return parser.format_help()
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns


@dataclass(frozen=True)
class Route:
    methods: tuple[str, ...]
    path: str
    handler: str
    doc: str


_METHODS = ("get", "post", "put", "patch", "delete")
_GROUPS = {
    "([^/]+)": "<id>",
    "(/.*)?$": "[/<path>]",
    "(/.*)": "/<path>",
    "~([^/]*)": "~<capability>",
}


def routes() -> list[Route]:
    """The server extension's routes under the base URL, each with its handler's methods."""
    from tornado.web import RequestHandler
    from tornado.websocket import WebSocketHandler

    from jupyter_slurm_ray.server import _dashboard_routes, handlers

    found = []
    for rule in [*handlers.route_specs("/", None, None), *_dashboard_routes("/", None)]:
        if isinstance(rule, tuple):
            pattern, handler = rule[0], rule[1]
        else:
            pattern, handler = rule.matcher.regex.pattern, rule.target
        path = pattern.removeprefix("/")
        for group, word in _GROUPS.items():
            path = path.replace(group, word)
        methods = tuple(
            m.upper() for m in _METHODS if getattr(handler, m) is not getattr(RequestHandler, m)
        )
        if issubclass(handler, WebSocketHandler):  # a websocket is a GET that upgrades
            websocket = "GET (websocket)" if methods in ((), ("GET",)) else "websockets"
            methods = (*(m for m in methods if m != "GET" or websocket == "websockets"), websocket)
        doc = inspect.getdoc(handler) or ""
        if not doc:
            raise ValueError(f"route {path}: its handler {handler.__name__} has no docstring")
        found.append(Route(methods, path, handler.__name__, doc))
    return found


@dataclass(frozen=True)
class ViewField:
    name: str
    type: str
    required: bool
    note: str


def view_fields(view: type) -> list[ViewField]:
    """A TypedDict's keys (its bases' too), typed, with the comment beside each in the source
    (its module's: a TypedDict's bases are not in its ``__mro__``)."""
    notes = _field_notes(inspect.getsource(inspect.getmodule(view)))  # type: ignore[arg-type]
    hints = view.__annotations__
    required = view.__required_keys__  # type: ignore[attr-defined]
    return [
        ViewField(name, _type_name(hint), name in required, notes.get(name, ""))
        for name, hint in hints.items()
    ]


def _field_notes(source: str) -> dict[str, str]:
    notes, pending = {}, ""
    for line in source.splitlines():
        doc = re.match(r"\s+#: (.*)", line)
        if doc:
            pending = f"{pending} {doc.group(1)}".strip()
            continue
        field = re.match(r"\s+(\w+): [^#]+?(?:\s+# (.*))?$", line)
        if field:
            notes[field.group(1)] = " ".join(filter(None, (pending, field.group(2) or "")))
        pending = ""
    return notes


def _type_name(hint: Any) -> str:
    text = hint if isinstance(hint, str) else getattr(hint, "__name__", None) or repr(hint)
    if not isinstance(hint, str) and getattr(hint, "__args__", None):
        text = repr(hint)
    text = re.sub(r"\b(typing|jupyter_slurm_ray\.server\.views)\.", "", str(text))
    return re.sub(r"^Optional\[(.*)\]$", r"\1 | None", text).replace("NoneType", "None")


@dataclass(frozen=True)
class ErrorType:
    name: str
    bases: tuple[str, ...]
    doc: str
    status: int | None  # what the REST API answers for it


def error_types() -> list[ErrorType]:
    """``errors.py``'s exceptions, and the HTTP status ``server/handlers.py`` maps each to."""
    from jupyter_slurm_ray import errors

    statuses = _http_statuses()
    found = []
    for name, cls in vars(errors).items():
        if not (isinstance(cls, type) and issubclass(cls, BaseException)):
            continue
        if cls.__module__ != errors.__name__:
            continue
        status = next((statuses[c.__name__] for c in cls.__mro__ if c.__name__ in statuses), None)
        bases = tuple(base.__name__ for base in cls.__bases__)
        found.append(ErrorType(name, bases, inspect.getdoc(cls) or "", status))
    return found


def _http_statuses() -> dict[str, int]:
    """The ``except X: raise ApiError(status, …)`` clauses of ``_as_http_errors``."""
    tree = ast.parse((PACKAGE / "server" / "handlers.py").read_text())
    function = next(
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name == "_as_http_errors"
    )
    statuses = {}
    for handler in ast.walk(function):
        if not isinstance(handler, ast.ExceptHandler) or handler.type is None:
            continue
        raised = next(n for n in ast.walk(handler) if isinstance(n, ast.Raise))
        call = raised.exc
        assert isinstance(call, ast.Call) and isinstance(call.args[0], ast.Constant)
        types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        for node in types:
            assert isinstance(node, ast.Name)
            statuses.setdefault(node.id, int(call.args[0].value))
    return statuses


@dataclass(frozen=True)
class EventName:
    name: str
    constant: str
    writer: str  # the comment above its group in jsr_wire.Event
    note: str  # the comment beside it


def events() -> list[EventName]:
    """``jsr_wire.Event``'s names, with the comments its declaration has."""
    from jupyter_slurm_ray.bootstrap import jsr_wire

    found, writer = [], ""
    for line in inspect.getsource(jsr_wire.Event).splitlines():
        group = re.match(r"\s+# (.*)", line)
        if group:
            writer = group.group(1)
            continue
        constant = re.match(r'\s+([A-Z_]+) = "(\w+)"(?:\s+# (.*))?', line)
        if constant:
            found.append(
                EventName(constant.group(2), constant.group(1), writer, constant.group(3) or "")
            )
    return found


#: Examples of the names Slurm composes for the families of QOS and association limits.
LIMIT_FAMILY_EXAMPLES = ("QOSGrpNodeLimit", "AssocMaxCpuPerJobLimit", "QOSMaxJobsPerUserLimit")


def queue_reasons() -> list[tuple[str, str, str, bool]]:
    """Slurm's pending reasons as ``slurm/queueinfo.py`` explains them: (reason, meaning, what
    to do, never starts), from ``queue_reasons.toml``, then an example of each family."""
    from jupyter_slurm_ray.slurm.queueinfo import explain_reason, reasons

    explained = [(code, *entry) for code, entry in reasons().items()]
    for code in LIMIT_FAMILY_EXAMPLES:
        if code not in reasons():
            meaning, action, never = explain_reason(code)
            explained.append((code, meaning, action or "", never))
    return explained


def _in_help(name: str, text: str) -> str:
    """Where an event with no comment of its own is described: the bootstrap's HELP."""
    return "described in bootstrap --help, below" if re.search(rf"\b{name}\b", text) else ""


def bootstrap_help() -> str:
    """``bootstrap/__main__.py``'s HELP (read, not imported: it runs from the job dir)."""
    tree = ast.parse((PACKAGE / "bootstrap" / "__main__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "HELP":
            assert isinstance(node.value, ast.Constant)
            return str(node.value.value)
    raise ValueError("bootstrap/__main__.py has no HELP")


def constants(cls: type) -> list[tuple[str, str]]:
    """A class of string constants (``Phase``, ``Role``), in declaration order."""
    return [(k, v) for k, v in vars(cls).items() if k.isupper() and isinstance(v, str)]


# ----------------------------------------------------------------------------- rendering


def setup(app: Any) -> dict[str, Any]:
    """The directives, and the check that fails the build when a description is missing."""
    from docutils import nodes
    from docutils.parsers.rst import Directive
    from sphinx import addnodes
    from sphinx.errors import ExtensionError
    from sphinx.util import logging

    logger = logging.getLogger(__name__)

    def inline(text: str) -> list[nodes.Node]:
        """Text with ``literal`` and `literal` parts as literals, nothing else interpreted."""
        parts: list[nodes.Node] = []
        for index, piece in enumerate(re.split(r"``(.+?)``|`([^`]+)`", text)):
            if index % 3 == 0 and piece:
                parts.append(nodes.Text(piece))
            elif index % 3 and piece:
                parts.append(nodes.literal(piece, piece))
        return parts

    def paragraph(text: str) -> nodes.paragraph:
        return nodes.paragraph("", "", *inline(text))

    def paragraphs(text: str) -> list[nodes.Node]:
        return [paragraph(p.replace("\n", " ")) for p in text.split("\n\n") if p.strip()]

    def table(header: list[str], rows: list[list[Any]], widths: list[int]) -> nodes.table:
        group = nodes.tgroup(cols=len(header))
        for width in widths:
            group += nodes.colspec(colwidth=width)
        head = nodes.thead()
        head += row_of([nodes.paragraph(text=h) for h in header])
        body = nodes.tbody()
        for cells in rows:
            body += row_of(
                [c if isinstance(c, nodes.Node | list) else paragraph(str(c)) for c in cells]
            )
        group += head
        group += body
        result = nodes.table("", group)
        result["classes"] += ["jsr-reference", "colwidths-given"]
        return result

    def row_of(cells: list[nodes.Node | list[nodes.Node]]) -> nodes.row:
        """A table row; a cell is a node, or a list of them (paragraphs)."""
        row = nodes.row()
        for cell in cells:
            entry = nodes.entry()
            entry += cell
            row += entry
        return row

    def literal(text: str) -> nodes.literal:
        return nodes.literal(text, text)

    def anchor(prefix: str, name: str) -> str:
        return f"{prefix}-{name}".replace("_", "-").lower()

    class _Directive(Directive):
        def target(self, ident: str) -> nodes.target:
            node = nodes.target("", "", ids=[ident], names=[ident])
            self.state.document.note_explicit_target(node)
            return node

        def section(self, ident: str, title: str, *body: nodes.Node) -> nodes.section:
            section = nodes.section("", ids=[ident], names=[ident])
            self.state.document.note_implicit_target(section)
            section += nodes.title(title, "", literal(title))
            for node in body:
                section += node
            return section

    _SETTINGS: dict[str, Callable[[], list[Setting]]] = {
        "cluster": cluster_settings,
        "own": own_settings,
        "adapt": adapt_settings,
    }

    class SettingsDirective(_Directive):
        """``{jsr-settings} cluster|own|adapt``: each setting with its default, how it is set
        and its description; an anchor ``setting-<name>`` each."""

        required_arguments = 1

        def run(self) -> list[nodes.Node]:
            items = nodes.definition_list()
            items["classes"].append("jsr-settings")
            for setting in _SETTINGS[self.arguments[0]]():
                term = nodes.term("", "", literal(setting.name))
                term["ids"].append(anchor("setting", setting.name))
                term["names"].append(anchor("setting", setting.name))
                self.state.document.note_explicit_target(term)
                facts = nodes.field_list()
                for label, value in (
                    ("Default", literal(setting.default)),
                    ("Type", nodes.Text(setting.kind)),
                    ("Environment", literal(setting.env) if setting.env else None),
                    ("Set with", _joined(setting.ways)),
                ):
                    if value is not None:
                        facts += nodes.field(
                            "",
                            nodes.field_name(label, label),
                            nodes.field_body("", nodes.paragraph("", "", value)),
                        )
                definition = nodes.definition("", paragraph(setting.help), facts)
                items += nodes.definition_list_item("", term, definition)
            return [items]

    def _joined(ways: tuple[str, ...]) -> nodes.inline:
        parts: list[nodes.Node] = []
        for index, way in enumerate(ways):
            if index:
                parts.append(nodes.Text(", "))
            parts.append(literal(way))
        return nodes.inline("", "", *parts)

    class SettingsTableDirective(_Directive):
        """``{jsr-settings-table}``: every setting in one table, each linked to its entry."""

        def run(self) -> list[nodes.Node]:
            rows = []
            for group, collect in _SETTINGS.items():
                for setting in collect():
                    ref = addnodes.pending_xref(
                        "",
                        literal(setting.name),
                        refdomain="std",
                        reftype="ref",
                        reftarget=anchor("setting", setting.name),
                        refexplicit=True,
                    )
                    where = {"cluster": "cluster", "own": "package", "adapt": "adapt"}[group]
                    env = literal(setting.env) if setting.env else nodes.Text("—")
                    rows.append(
                        [
                            nodes.paragraph("", "", ref),
                            where,
                            literal(setting.default),
                            nodes.paragraph("", "", env),
                        ]
                    )
            return [table(["Setting", "Of", "Default", "Environment variable"], rows, [3, 2, 3, 4])]

    class FormerNamesDirective(_Directive):
        """``{jsr-former-names}``: settings' former names, which still work (warning)."""

        def run(self) -> list[nodes.Node]:
            rows = [[literal(former), literal(name)] for former, name in former_names().items()]
            return [table(["Former name", "Now"], rows, [1, 1])]

    class CommandsDirective(_Directive):
        """``{jsr-commands} magic|cli``: the root's and each subcommand's --help, a section each."""

        required_arguments = 1

        def run(self) -> list[nodes.Node]:
            program = self.arguments[0]
            root, subcommands = command_parsers()[program]
            sections = []
            for command, parser in {"": root, **subcommands}.items():
                title = f"{root.prog} {command}".strip()
                text = help_text(parser)
                block = nodes.literal_block(text, text)
                block["language"] = "text"
                sections.append(self.section(anchor(program, command or "command"), title, block))
            return sections

    class RoutesDirective(_Directive):
        """``{jsr-routes}``: the server extension's routes, methods and what each does."""

        def run(self) -> list[nodes.Node]:
            rows = [
                [
                    ", ".join(r.methods) or "—",
                    literal(r.path),
                    paragraphs(r.doc),
                ]
                for r in routes()
            ]
            return [
                table(
                    ["Methods", "Path (under the server's base URL)", "What it does"],
                    rows,
                    [1, 3, 6],
                )
            ]

    class ViewDirective(_Directive):
        """``{jsr-view} ClusterView``: a TypedDict of ``server/views.py``, key by key."""

        required_arguments = 1

        def run(self) -> list[nodes.Node]:
            from jupyter_slurm_ray.server import views

            view = getattr(views, self.arguments[0])
            rows = [
                [
                    literal(f.name),
                    literal(f.type),
                    "always" if f.required else "in some answers",
                    f.note,
                ]
                for f in view_fields(view)
            ]
            doc = paragraphs(inspect.getdoc(view) or "")
            return [*doc, table(["Key", "Type", "Present", "Note"], rows, [2, 3, 1, 4])]

    class ErrorsDirective(_Directive):
        """``{jsr-errors}``: the package's exceptions, what each means, the REST status."""

        def run(self) -> list[nodes.Node]:
            rows = [
                [
                    literal(e.name),
                    nodes.paragraph("", "", *_literals(e.bases)),
                    paragraphs(e.doc),
                    str(e.status) if e.status else "—",
                ]
                for e in error_types()
            ]
            return [table(["Exception", "Is a", "Meaning", "REST status"], rows, [2, 2, 6, 1])]

    def _literals(names: tuple[str, ...]) -> list[nodes.Node]:
        parts: list[nodes.Node] = []
        for index, name in enumerate(names):
            parts += [nodes.Text(", ")] if index else []
            parts.append(literal(name))
        return parts

    class EventsDirective(_Directive):
        """``{jsr-events}``: every event name of ``events.jsonl``, who writes it, the phases
        and roles, and the bootstrap's own description (its HELP)."""

        def run(self) -> list[nodes.Node]:
            from jupyter_slurm_ray.bootstrap import jsr_wire

            help_text = bootstrap_help()
            rows = [
                [literal(e.name), e.writer, e.note or _in_help(e.name, help_text)] for e in events()
            ]
            phases = [[literal(v), literal(k)] for k, v in constants(jsr_wire.Phase)]
            roles = [[literal(v), literal(k)] for k, v in constants(jsr_wire.Role)]
            text = bootstrap_help()
            block = nodes.literal_block(text, text)
            block["language"] = "text"
            return [
                self.section(
                    "event-names", "event", table(["event", "Written by", "Note"], rows, [2, 3, 4])
                ),
                self.section("event-phases", "phase", table(["phase", "Phase."], phases, [1, 1])),
                self.section("event-roles", "role", table(["role", "Role."], roles, [1, 1])),
                self.section("bootstrap-help", "bootstrap --help", block),
            ]

    class QueueReasonsDirective(_Directive):
        """``{jsr-queue-reasons}``: Slurm's pending reasons, what each means, what to do."""

        def run(self) -> list[nodes.Node]:
            rows = [
                [literal(code), meaning, action, "never, as asked" if never else "when it can"]
                for code, meaning, action, never in queue_reasons()
            ]
            header = ["Slurm's reason", "It means", "Do", "Starts"]
            return [table(header, rows, [2, 4, 4, 1])]

    def check_descriptions(app: Any) -> None:
        missing = missing_descriptions()
        for name in missing:
            logger.warning(f"no description of {name}", type="jsr", subtype="description")
        if missing:  # whatever -W says
            raise ExtensionError(
                "the reference needs a description of every setting and option; none for: "
                + ", ".join(missing)
            )

    app.connect("builder-inited", check_descriptions)
    for name, directive in {
        "jsr-settings": SettingsDirective,
        "jsr-settings-table": SettingsTableDirective,
        "jsr-former-names": FormerNamesDirective,
        "jsr-commands": CommandsDirective,
        "jsr-routes": RoutesDirective,
        "jsr-view": ViewDirective,
        "jsr-errors": ErrorsDirective,
        "jsr-events": EventsDirective,
        "jsr-queue-reasons": QueueReasonsDirective,
    }.items():
        app.add_directive(name, directive)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
