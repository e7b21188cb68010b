"""The labextension's ``ICluster`` (``labextension/src/api.ts``) and the REST view's typed
definition (``server/views.py``) describe the same fields: none on one side only, the same
optionality (``field?:`` there, a ``total=False`` key here), and the same nullability
(``| null`` there, ``None`` admitted here)."""

from __future__ import annotations

import re
import types
from pathlib import Path
from typing import Literal, Union, get_args, get_origin, get_type_hints

import pytest

from jupyter_slurm_ray.server.views import ClusterView, UnreadableView

API_TS = Path(__file__).parents[2] / "labextension" / "src" / "api.ts"

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
