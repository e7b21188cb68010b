"""The labextension's ``ICluster`` (``labextension/src/api.ts``) and the REST view's typed
definition (``server/views.py``) describe the same fields: none on one side only, the same
optionality (``field?:`` there, a ``total=False`` key here), and the same nullability
(``| null`` there, ``None`` admitted here); so do the records inside it (worker jobs, queue
insight, usage), whose figures are what the server sends. The labextension's state groups
(``labextension/src/states.ts``) are ``states.py``'s."""

from __future__ import annotations

import re
import types
from pathlib import Path
from typing import Literal, Union, get_args, get_origin, get_type_hints

import pytest

from jupyter_slurm_ray.server.views import (
    ClusterView,
    QueueView,
    UnreadableView,
    UsageView,
    WorkerJobView,
)
from jupyter_slurm_ray.slurm.usage import Usage
from jupyter_slurm_ray.states import FINAL, UP, State

API_TS = Path(__file__).parents[2] / "labextension" / "src" / "api.ts"
STATES_TS = API_TS.parent / "states.ts"
RECORDS = [(WorkerJobView, "IWorkerJob"), (QueueView, "IQueueInsight"), (UsageView, "IUsage")]

_COMMENTS = re.compile(r"/\*.*?\*/|//[^\n]*", re.DOTALL)
_FIELD = re.compile(r"^\s*(\w+)(\?)?\s*:\s*(.+?);?\s*$")


class TsField:
    def __init__(self, optional: bool, type_text: str) -> None:
        self.optional = optional
        self.type_text = type_text

    @property
    def nullable(self) -> bool:
        return "null" in (part.strip() for part in self.type_text.split("|"))


def interface_fields(source: str, name: str) -> dict[str, TsField]:
    """The fields of ``export interface <name> { … }`` (one field a line, as prettier writes)."""
    start = re.search(rf"^export interface {name} \{{\n", source, re.MULTILINE)
    assert start, f"no `export interface {name}` in {API_TS}"
    body = source[start.end() : source.index("\n}", start.end())]
    fields = {}
    for line in _COMMENTS.sub("", body).splitlines():
        if not line.strip():
            continue
        match = _FIELD.match(line)
        assert match, f"{name}: cannot read the line {line!r} (one field a line)"
        fields[match[1]] = TsField(match[2] == "?", match[3])
    return fields


def admits_none(annotation: object) -> bool:
    if annotation is type(None):
        return True
    if get_origin(annotation) is Literal:
        return None in get_args(annotation)
    if get_origin(annotation) in (Union, types.UnionType):
        return any(admits_none(arg) for arg in get_args(annotation))
    return False


@pytest.fixture(scope="module")
def icluster() -> dict[str, TsField]:
    return interface_fields(API_TS.read_text(), "ICluster")


def test_every_field_is_on_both_sides(icluster):
    python = set(get_type_hints(ClusterView))
    assert sorted(python - set(icluster)) == [], "in views.ClusterView, not in ICluster"
    assert sorted(set(icluster) - python) == [], "in ICluster, not in views.ClusterView"


def test_optional_fields_are_the_same(icluster):
    optional_ts = {name for name, field in icluster.items() if field.optional}
    assert sorted(optional_ts) == sorted(ClusterView.__optional_keys__)


def test_nullable_fields_are_the_same(icluster):
    hints = get_type_hints(ClusterView)
    nullable_python = {name for name, hint in hints.items() if admits_none(hint)}
    nullable_ts = {name for name, field in icluster.items() if field.nullable}
    # ``error`` of a readable cluster is always null; ICluster's is a string when unreadable
    assert sorted(nullable_ts ^ nullable_python) == []


def test_an_unreadable_row_is_readable_as_an_icluster(icluster):
    assert sorted(set(get_type_hints(UnreadableView)) - set(icluster)) == []


def test_the_reader_sees_every_field_and_its_optionality():
    source = """
export interface ICluster {
  id: string;
  /** A comment: with: colons; */
  notice?: string | null;
  // another
  nodes: string[];
}
"""
    fields = interface_fields(source, "ICluster")
    assert list(fields) == ["id", "notice", "nodes"]
    assert [fields[n].optional for n in fields] == [False, True, False]
    assert [fields[n].nullable for n in fields] == [False, True, False]


@pytest.mark.parametrize(("view", "interface"), RECORDS, ids=[i for _, i in RECORDS])
def test_the_records_in_a_view_are_the_same_on_both_sides(view, interface):
    fields = interface_fields(API_TS.read_text(), interface)
    hints = get_type_hints(view)
    assert sorted(hints) == sorted(fields), f"{view.__name__} and {interface}"
    assert sorted(view.__optional_keys__) == sorted(n for n, f in fields.items() if f.optional)
    nullable = {name for name, hint in hints.items() if admits_none(hint)}
    assert sorted(nullable) == sorted(n for n, f in fields.items() if f.nullable)


def test_the_usage_the_server_sends_is_the_usage_view():
    usage = Usage(("7",), final=True, elapsed=60, cpu_seconds=120, max_rss_by_node={"n1": 5})
    assert sorted(usage.to_dict()) == sorted(get_type_hints(UsageView))  # one cluster's details
    assert sorted(usage.compact()) == sorted(UsageView.__required_keys__)  # the listing's


def test_the_labextensions_state_groups_are_the_servers():
    source = STATES_TS.read_text()
    groups = {
        name: set(re.findall(r"'([A-Z_]+)'", body))
        for name, body in re.findall(r"export const (\w+) = new Set\(\[(.*?)\]\)", source, re.S)
    }
    assert groups["UP"] == {state.value for state in UP}
    assert groups["FINAL"] == {state.value for state in FINAL}
    assert groups["BUSY"] == {state.value for state in State} - groups["UP"] - groups["FINAL"]
