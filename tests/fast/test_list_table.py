"""``list`` shows live clusters first and folds the ended ones into one line (``--all``)."""

from __future__ import annotations

from jupyter_slurm_ray.inventory import Inventory
from jupyter_slurm_ray.naming import job_comment
from jupyter_slurm_ray.registry import ClusterRecord
from jupyter_slurm_ray.targets import Transports
from jupyter_slurm_ray.ui.formatting import format_table

from ..helpers.fakeslurm import FakeJob


def record(cluster_id: str, job_id: str, **fields) -> ClusterRecord:
    name = cluster_id.split("-")[0]
    values = dict(id=cluster_id, name=name, target="fake", job_dir=f"/j/{cluster_id}")
    return ClusterRecord(**(values | {"job_id": job_id} | fields))


async def test_ended_clusters_are_folded_under_the_live_ones_unless_all(registry, transport, slurm):
    registry.save(record("old-0001", "4", state="STOPPED"))
    registry.save(record("gone-0001", "3", state="FAILED"))
    registry.save(record("live-0001", "5"))
    slurm.jobs["5"] = FakeJob("5", "", comment=job_comment("live-0001"), state="RUNNING")
    entries = await Inventory(registry, Transports(lambda: transport)).entries()

    folded = format_table(entries).splitlines()
    assert folded[0].startswith("NAME") and folded[1].startswith("live ")
    assert folded[2:] == ["recent: 2 ended (list --all shows them)"]
    unfolded = format_table(entries, ended=True).splitlines()
    assert unfolded[:2] == folded[:2] and unfolded[2:4] == ["", "recent (2 ended):"]
    assert sorted(line.split()[0] for line in unfolded[5:]) == ["gone", "old"]


async def test_with_only_ended_clusters_the_list_says_none_is_live(registry, transport):
    registry.save(record("old-0001", "4", state="STOPPED"))
    entries = await Inventory(registry, Transports(lambda: transport)).entries()
    assert format_table(entries).splitlines() == [
        "no live clusters",
        "recent: 1 ended (list --all shows them)",
    ]
    assert format_table([]) == "no clusters"
