"""Worker groups: named shapes for a cluster's worker jobs (issue 9).

A cluster's head allocation has the cluster's spec. Its worker jobs have, by default, the same
shape on one node (the group ``default``); a *worker group* changes some of the Slurm side of
that shape: e.g. a CPU head on a cheap partition with GPU workers on the ``gpu`` partition::

    worker_groups = {"gpu": {"partition": "gpu", "gpus_per_node": 1, "time": "2:00:00"}}

Groups are a cluster setting like any other (``%config SlurmRay.worker_groups``, a profile's
``[profiles.NAME.worker_groups.GROUP]`` table, the magics' ``--worker-group
GROUP:key=value,...``). Each worker job's Ray node carries the resource ``group:<name>`` (1 per
node), so that tasks can be sent to a group: ``@ray.remote(resources={"group:gpu": 0.01})``.
A group's ``setup`` lines run after the cluster's, its ``env`` adds to the cluster's; the other
settings replace the cluster's.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from typing import Any, Protocol, TypeVar

from ..bootstrap.jsr_wire import GROUP_VARIABLE
from ..errors import SpecError


class GroupedSpec(Protocol):
    """What worker groups read of a ``ClusterSpec`` (which checks its groups with this module)."""

    @property
    def worker_groups(self) -> tuple[tuple[str, tuple[tuple[str, Any], ...]], ...]: ...
    @property
    def env(self) -> tuple[tuple[str, str], ...]: ...
    @property
    def setup(self) -> tuple[str, ...]: ...
    def replace(self: Spec, **changes: Any) -> Spec: ...


Spec = TypeVar("Spec", bound=GroupedSpec)

DEFAULT_GROUP = "default"
#: What a group may change: where its jobs run and what each node has, not how Ray starts.
GROUP_FIELDS = (
    "partition",
    "account",
    "qos",
    "reservation",
    "constraint",
    "cpus_per_node",
    "gpus_per_node",
    "mem_per_node",
    "time",
    "exclusive",
    "extra_sbatch",
    "setup",
    "env",
)
NAME_ALLOWED = "a group name: a lowercase letter, then lowercase letters, digits or _ (at most 32)"
_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}", re.ASCII)
_ALLOWED = (
    "a mapping of group names to tables of worker settings, e.g. "
    '{"gpu": {"partition": "gpu", "gpus_per_node": 1}}'
)

Groups = tuple[tuple[str, tuple[tuple[str, Any], ...]], ...]


def checked_groups(field: str, value: Any) -> Groups:
    """The ``worker_groups`` setting's shape: names and keys checked, values kept as given
    (``ClusterSpec`` checks each value as its own setting: see :func:`group_spec`)."""
    if isinstance(value, tuple):  # already normalised (a spec copied or read back)
        value = {name: dict(settings) for name, settings in value}
    if not isinstance(value, Mapping):
        raise SpecError(field, value, _ALLOWED)
    groups = []
    for name, settings in value.items():
        checked_name(f"{field} name", name)
        if not isinstance(settings, Mapping):
            raise SpecError(f"{field}.{name}", settings, "a table of worker settings")
        pairs = tuple(sorted(_setting(f"{field}.{name}", k, v) for k, v in settings.items()))
        groups.append((name, pairs))
    return tuple(sorted(groups))


def checked_name(field: str, name: Any) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise SpecError(field, name, NAME_ALLOWED)
    return name


def _setting(where: str, key: Any, value: Any) -> tuple[str, Any]:
    name = key.replace("-", "_") if isinstance(key, str) else ""
    if name not in GROUP_FIELDS:
        close = difflib.get_close_matches(name, GROUP_FIELDS, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        allowed = f"a setting a worker group may change; {hint}those are: {', '.join(GROUP_FIELDS)}"
        raise SpecError(where, key, allowed)
    if isinstance(value, list):
        value = tuple(value)
    elif isinstance(value, Mapping):
        value = tuple(sorted(value.items()))
    return name, value


def group_names(spec: GroupedSpec) -> list[str]:
    """The groups a worker job of this cluster can belong to: ``default`` first."""
    return [DEFAULT_GROUP, *(name for name, _ in spec.worker_groups if name != DEFAULT_GROUP)]


def group_spec(spec: Spec, group: str) -> Spec:
    """The spec of one worker job of ``group``: the cluster's, on one node, with the group's
    settings (each checked as that setting is; errors name ``worker_groups.<group>.<key>``);
    its ``setup`` lines run after the cluster's, its ``env`` adds to the cluster's."""
    if group not in group_names(spec):
        known = ", ".join(group_names(spec))
        raise SpecError("group", group, f"a worker group of this cluster: {known}")
    settings = dict(dict(spec.worker_groups).get(group, ()))
    settings["env"] = {**dict(spec.env), **dict(settings.get("env", ())), GROUP_VARIABLE: group}
    settings["setup"] = (*spec.setup, *settings.get("setup", ()))
    try:
        return spec.replace(nodes=1, worker_groups=(), **settings)
    except SpecError as error:
        where = f"worker_groups.{group}.{error.field}"
        raise SpecError(where, error.value, error.allowed) from None


def parse_group_option(text: str) -> tuple[str, dict[str, str]]:
    """``GROUP:key=value,key=value`` (the magics' ``--worker-group``) as (name, settings);
    a value with a comma is given in a profile or the config instead."""
    name, _, rest = text.partition(":")
    checked_name("--worker-group", name.strip())
    settings: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, equals, value = item.partition("=")
        if not equals or not key.strip():
            allowed = "GROUP:key=value,key=value (e.g. gpu:partition=gpu,gpus_per_node=1)"
            raise SpecError("--worker-group", text, allowed)
        settings[key.strip()] = value.strip()
    return name.strip(), settings
