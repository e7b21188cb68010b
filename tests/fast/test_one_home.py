"""Each setting and operation is declared once: what is derived stays derived, and what cannot
be derived (the bootstrap is a separate stdlib-only program) is pinned equal here."""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
from pathlib import Path

import pytest

import jupyter_slurm_ray
from jupyter_slurm_ray.cluster import SlurmRayCluster
from jupyter_slurm_ray.config import SPEC_SETTINGS, SlurmRay
from jupyter_slurm_ray.job.directory import bootstrap_settings
from jupyter_slurm_ray.spec import FIELD_NAMES, ClusterSpec
from jupyter_slurm_ray.ui.magic_args import _SPEC_OPTIONS, parse

BOOTSTRAP = Path(jupyter_slurm_ray.__file__).parent / "bootstrap"
SPEC_FIELDS = {f.name: f for f in dataclasses.fields(ClusterSpec)}


@pytest.fixture(scope="module")
def bootstrap_config():
    sys.path.insert(0, str(BOOTSTRAP))
    try:
        import jsr_base

        yield jsr_base.Config
    finally:
        sys.path.remove(str(BOOTSTRAP))


def test_every_cluster_setting_is_a_trait_with_the_fields_help():
    traits = SlurmRay.class_traits(config=True)
    for name in SPEC_SETTINGS:
        assert traits[name].help == SPEC_FIELDS[name].metadata["help"], name
        assert getattr(SlurmRay(), name) is None  # "not set here": the spec's default applies


def test_the_magics_options_are_spec_fields_with_the_fields_help():
    parsed = parse("up -N 2 -t 5 --mem 4G")
    assert (parsed.nodes, parsed.time, parsed.mem_per_node) == ("2", "5", "4G")
    assert {field for _, field in _SPEC_OPTIONS} <= set(FIELD_NAMES)


def test_the_bootstrap_reads_every_setting_the_client_writes_with_the_same_defaults(
    bootstrap_config,
):
    written = bootstrap_settings(ClusterSpec(), "abcd-0001")
    read = {f.name: f for f in dataclasses.fields(bootstrap_config)}
    assert set(written) == set(read)
    defaults = bootstrap_config(cluster_id="abcd-0001")
    spec = ClusterSpec()
    for name in set(read) & set(FIELD_NAMES):
        ours = getattr(spec, name)
        theirs = getattr(defaults, name)
        if isinstance(ours, tuple) and name != "port_range":
            ours = dict(ours) if name == "env" else list(ours)
        assert theirs == ours, name
    assert defaults.lock_dir == spec.port_lock_dir


def test_every_coroutine_of_a_cluster_has_its_blocking_twin_declared_and_listed():
    # The whole MRO, should the cluster ever have bases that declare twins too.
    twins = set()
    for cls in SlurmRayCluster.__mro__:
        members = vars(cls)
        for name, f in members.items():
            if not (name.endswith("_async") and inspect.iscoroutinefunction(f)):
                continue
            if name.startswith("_"):
                continue
            twin = members.get(name.removesuffix("_async"))  # declared next to its coroutine
            assert callable(twin) and not inspect.iscoroutinefunction(twin), name
            assert twin.__wrapped__ is members[name], name
            assert "Blocking form of" in (twin.__doc__ or ""), name
            resolved = getattr(SlurmRayCluster, twin.__name__)  # not shadowed by a subclass
            assert resolved.__wrapped__ is getattr(SlurmRayCluster, name), name
            twins.add(twin.__name__)
    assert {"up", "down", "scale", "adapt"} <= twins
    doc = SlurmRayCluster.__doc__ or ""
    listed = re.findall(r"``(\w+)``", doc.split("The twins:", 1)[1])
    assert sorted(listed) == sorted(twins)  # the class docstring lists each twin, once
