"""Each setting and operation is declared once: what is derived stays derived. What the client
and the bootstrap (a separate stdlib-only program) share is declared in ``bootstrap/jsr_wire.py``
and imported by both."""

from __future__ import annotations

import dataclasses
import inspect
import json
import re

from jupyter_slurm_ray.cluster import SlurmRayCluster
from jupyter_slurm_ray.config import SPEC_SETTINGS, SlurmRay
from jupyter_slurm_ray.job.script import bootstrap_settings
from jupyter_slurm_ray.spec import FIELD_NAMES, ClusterSpec
from jupyter_slurm_ray.ui.magic_args import _SPEC_OPTIONS, parse

from ..helpers.bootstrap import bootstrap_module

SPEC_FIELDS = {f.name: f for f in dataclasses.fields(ClusterSpec)}


def test_every_cluster_setting_is_a_trait_with_the_fields_help():
    traits = SlurmRay.class_traits(config=True)
    for name in SPEC_SETTINGS:
        assert traits[name].help == SPEC_FIELDS[name].metadata["help"], name
        assert getattr(SlurmRay(), name) is None  # "not set here": the spec's default applies


def test_the_magics_options_are_spec_fields_with_the_fields_help():
    parsed = parse("up -N 2 -t 5 --mem 4G")
    assert (parsed.nodes, parsed.time, parsed.mem_per_node) == ("2", "5", "4G")
    assert {field for _, field in _SPEC_OPTIONS} <= set(FIELD_NAMES)


def test_the_bootstrap_reads_back_every_setting_the_client_writes(tmp_path):
    spec = ClusterSpec(
        mode="here", here_nodes="node[1-2]", nodes=2, cpus_per_node=3, here_kernel_tasks=False,
        port_strategy="fixed", fixed_port_base=30000, port_range=(30000, 30999),
        worker_ports=16, network_interface="ib0", ray_start_args=("--verbose",),
        env={"A": "1"}, object_store_memory="1G", owner_timeout=60, start_timeout=90,
        port_lock_dir="/var/lock/ports", container="/img.sif", container_runtime="apptainer",
        walltime_warning=300,
    )  # fmt: skip
    written = bootstrap_settings(spec, "abcd-0001")
    path = tmp_path / "bootstrap.json"
    path.write_text(json.dumps(written))
    read = bootstrap_module("jsr_base").Config.load(path)
    assert dataclasses.asdict(read) == written
    assert read.here_hosts == ["node1", "node2"] and read.lock_dir == "/var/lock/ports"


def test_the_bootstrap_reads_the_leases_former_name_from_an_older_clients_settings(tmp_path):
    path = tmp_path / "bootstrap.json"
    path.write_text(json.dumps({"cluster_id": "abcd-0001", "idle_timeout": 42.0}))
    assert bootstrap_module("jsr_base").Config.load(path).owner_timeout == 42.0
    path.write_text(json.dumps({"cluster_id": "abcd-0001", "owner_timeout": 50.0}))
    assert bootstrap_module("jsr_base").Config.load(path).owner_timeout == 50.0


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
