"""The memory a cluster's job gets where the site enforces it, checked before submitting: each
release's ``scontrol`` output read alike, a head that would be killed at the site's default
refused in one line naming the setting and what to ask, nothing refused where memory is not
enforced; and the magic refusing before anything is submitted (the scripted Slurm)."""

from __future__ import annotations

from pathlib import Path

import pytest

from jupyter_slurm_ray.errors import LimitError, SpecError
from jupyter_slurm_ray.scheduler.records import Partition
from jupyter_slurm_ray.slurm.memorypolicy import (
    MemoryPolicy,
    check_memory,
    job_memory,
    parse_memory_policy,
    suggested_memory,
)
from jupyter_slurm_ray.spec import ClusterSpec

RELEASES = Path(__file__).parent.parent / "resources" / "slurm-output"
DEBUG = Partition("debug", True, 3, 3, 4, 6428, is_default=True)


def recorded(release: str, config: str = "scontrol-config") -> MemoryPolicy:
    folder = RELEASES / release
    return parse_memory_policy(
        (folder / f"{config}.out").read_text(), (folder / "scontrol-partitions.out").read_text()
    )


@pytest.mark.parametrize("release", ["22.05.8", "24.11.5", "26.05.5"])
def test_every_release_says_its_enforcement_and_defaults_alike(release: str) -> None:
    policy = recorded(release)  # the testbed's enforced profile, as Slurm printed it
    assert policy.enforced_by == "ConstrainRAMSpace=yes"
    assert (policy.default_per_cpu, policy.default_per_node) == (1024, None)
    assert set(policy.partitions) == {"debug", "short", "solo", "solo-short"}
    assert policy.partitions["debug"] == (None, None)  # DefMemPerNode=UNLIMITED: the site's


def test_a_site_that_does_not_enforce_memory_refuses_nothing() -> None:
    policy = recorded("22.05.8", "scontrol-config-permissive")
    assert policy.enforced_by is None and policy.default_per_cpu == 803
    assert check_memory(ClusterSpec(cpus_per_node=1), policy, DEBUG) == ()


def test_a_one_cpu_head_fits_the_sites_default_with_a_store_sized_to_fit() -> None:
    assert check_memory(ClusterSpec(cpus_per_node=1), recorded("24.11.5"), DEBUG) == ()


def test_a_head_that_cannot_fit_the_sites_default_is_refused_saying_what_to_ask() -> None:
    spec = ClusterSpec(cpus_per_node=1, object_store_memory="700M")
    with pytest.raises(LimitError) as refused:
        check_memory(spec, recorded("24.11.5"), DEBUG)
    message = str(refused.value)
    assert isinstance(refused.value, SpecError) and refused.value.field == "mem_per_node"
    assert message == (
        "mem_per_node: this site kills a job over its memory (ConstrainRAMSpace=yes) and each "
        "node of this one would get 1024 MB (the site's DefMemPerCPU=1024 × 1 CPU); a Ray head "
        "with 1 CPU needs about 1620 MB (920 for Ray's processes, 700 for its object store): "
        "ask for --mem 2G (mem_per_node) or more"
    )


def test_enough_memory_passes_and_a_set_object_store_counts() -> None:
    policy = recorded("24.11.5")
    spec = ClusterSpec(cpus_per_node=1, object_store_memory="700M", mem_per_node="2G")
    assert check_memory(spec, policy, DEBUG) == ()
    assert (
        check_memory(ClusterSpec(cpus_per_node=2, object_store_memory="700M"), policy, DEBUG) == ()
    )
    big_store = ClusterSpec(cpus_per_node=2, object_store_memory="2G")
    with pytest.raises(LimitError, match=r"needs about 3028 MB \(980 for Ray's processes, 2048"):
        check_memory(big_store, policy, DEBUG)
    assert suggested_memory(big_store) == "3G"
    assert suggested_memory(ClusterSpec(cpus_per_node=1)) == "1.5G"  # a 30 % store beside Ray


def test_a_partitions_own_default_wins_over_the_sites() -> None:
    policy = MemoryPolicy("ConstrainRAMSpace=yes", 1024, None, {"big": (4096, None)})
    big = Partition("big", True, 1, 1, 8, 64000)
    assert job_memory(policy, ClusterSpec(cpus_per_node=1), big) == (
        4096,
        "partition big's DefMemPerCPU=4096 × 1 CPU",
    )
    per_node = MemoryPolicy("ConstrainRAMSpace=yes", None, 2048, {})
    assert job_memory(per_node, ClusterSpec(cpus_per_node=4), DEBUG) == (
        2048,
        "the site's DefMemPerNode=2048",
    )
    nothing = MemoryPolicy("ConstrainRAMSpace=yes", None, None, {})
    assert job_memory(nothing, ClusterSpec(), DEBUG)[0] == 6428  # the whole node


def test_when_scontrol_does_not_say_the_note_says_so() -> None:
    unknown = MemoryPolicy(unavailable="scontrol did not say (refused)")
    notes = check_memory(ClusterSpec(), unknown, DEBUG)
    assert notes == ("memory not checked: scontrol did not say (refused)",)


async def test_the_magic_refuses_before_submitting_on_an_enforcing_site(slurm, transport):
    from jupyter_slurm_ray.slurm.sitecheck import check_with_slurm

    slurm.enforces_memory = True
    too_big = ClusterSpec(time="10", cpus_per_node=1, object_store_memory="700M")
    with pytest.raises(LimitError, match=r"ask for --mem 2G"):
        await check_with_slurm(too_big, transport)
    assert not slurm.jobs
    checked = await check_with_slurm(too_big.replace(mem_per_node="2G"), transport)
    assert not any("memory" in note for note in checked.notes)
