"""Pending placement groups in adapt's policy (elastic/raydemand.py,
elastic/policy.py's decide): each strategy
counted as Ray places it (a STRICT_SPREAD group's bundles on distinct nodes, a STRICT_PACK group
on one node), the room present nodes have used first, groups no node or no maximum can hold
reported; and Ray's own answers, recorded on the testbed (tests/resources/cluster_status/,
made by tests/resources/record_cluster_status.py and tests/test_placement_groups.py)."""

from __future__ import annotations

import json
from pathlib import Path

from jupyter_slurm_ray.elastic.policy import AdaptSettings, JobView, decide
from jupyter_slurm_ray.elastic.raydemand import (
    PlacementDemand,
    RayView,
    Shape,
    describe_demand,
    nodes_for,
    parse_cluster_status,
)

RECORDED = Path(__file__).parent.parent / "resources" / "cluster_status"
GPU_NODE = Shape(2.0, 2.0)  # a testbed node: 2 CPUs, 2 GPUs
ONE_GPU = {"CPU": 1.0, "GPU": 1.0}
SETTINGS = AdaptSettings(minimum=1, maximum=3, idle_timeout=5.0, max_pending=2)


def group(strategy: str, bundle: dict[str, float] = ONE_GPU, n: int = 3) -> PlacementDemand:
    return PlacementDemand(strategy, ((bundle, n),))


def test_a_strict_spread_groups_bundles_each_need_a_node_of_their_own():
    assert nodes_for([], GPU_NODE, [group("STRICT_SPREAD")]) == 3
    assert nodes_for([], GPU_NODE, [group("PACK")]) == 2  # packed: two bundles a node
    assert nodes_for([], GPU_NODE, [group("SPREAD")]) == 2  # best effort, as Ray counts it
    two_groups = PlacementDemand("STRICT_SPREAD", ((ONE_GPU, 2),), count=2)
    assert nodes_for([], GPU_NODE, [two_groups]) == 2  # one bundle of each group a node


def test_a_strict_pack_group_is_one_bundle_on_one_node():
    assert group("STRICT_PACK", n=2).placed_as() == [{"CPU": 2.0, "GPU": 2.0}]
    assert nodes_for([], GPU_NODE, [group("STRICT_PACK", n=2)]) == 1
    assert nodes_for([], GPU_NODE, [group("STRICT_PACK", {"CPU": 1.0}, 2)] * 2) == 2


def test_a_pending_group_fills_the_room_present_nodes_have_first():
    idle_head = [{"CPU": 2.0, "GPU": 2.0}]
    assert nodes_for([], GPU_NODE, [group("STRICT_SPREAD")], idle_head) == 2
    assert nodes_for([], GPU_NODE, [group("PACK")], idle_head) == 1
    assert nodes_for([], GPU_NODE, [group("PACK")], [{"CPU": 2.0, "GPU": 0.0}]) == 2
    tasks = [({"CPU": 1.0}, 2)]  # tasks wait only when they do not fit: no room for them
    assert nodes_for(tasks, GPU_NODE, (), idle_head) == 1


def test_adapt_asks_for_the_nodes_a_spread_group_lacks_beside_an_idle_head():
    room = {"10.200.0.11": {"CPU": 2.0, "GPU": 2.0}}
    decision = decide(SETTINGS, 1, GPU_NODE, [], [], groups=[group("STRICT_SPREAD")], room=room)
    assert decision.submit == 2 and decision.wanted == 3
    assert decision.cause == "placement group STRICT_SPREAD of 3 × {CPU: 1, GPU: 1} pending"


def test_worker_jobs_on_their_way_are_not_counted_twice():
    room = {"10.200.0.11": {"CPU": 2.0, "GPU": 2.0}, "10.200.0.12": {"CPU": 2.0, "GPU": 2.0}}
    settling = [JobView("7", False, joined=True, ip="10.200.0.12", settling=True)]
    decision = decide(SETTINGS, 1, GPU_NODE, [], settling, groups=[group("STRICT_SPREAD")],
                      room=room)  # fmt: skip
    assert decision.submit == 1  # 2 lacking: one is the settling job (its room not counted)
    pending = [JobView("7", True, "Resources"), JobView("8", True, "Resources")]
    both = decide(SETTINGS, 1, GPU_NODE, [], pending, groups=[group("STRICT_SPREAD")],
                  room={"10.200.0.11": {"CPU": 2.0, "GPU": 2.0}})  # fmt: skip
    assert (both.submit, both.retire) == (0, ())


def test_a_group_no_worker_node_or_no_maximum_can_hold_is_reported_not_submitted_for():
    too_big = group("STRICT_PACK", {"CPU": 0.5, "GPU": 1.0}, 3)  # 3 GPUs on one node of 2
    decision = decide(SETTINGS, 1, GPU_NODE, [], [], groups=[too_big])
    assert decision.submit == 0
    ((key, message),) = decision.reports
    assert key.startswith("unsatisfiable:")  # told once
    assert message == (
        "placement group STRICT_PACK of 3 × {CPU: 0.5, GPU: 1} can never be placed: "
        "a worker node has 2 GPU, not 3"
    )
    four = group("STRICT_SPREAD", n=4)  # 4 distinct nodes, the maximum is 3
    decision = decide(SETTINGS, 1, GPU_NODE, [], [], groups=[four])
    assert decision.submit == 0
    assert "each of its 4 bundles needs a node of its own, at most 3" in decision.reports[0][1]


def test_idle_workers_stay_while_a_group_waits():
    idle = [JobView("7", False, joined=True, ip="10.200.0.12", idle_for=60.0)]
    waiting = decide(SETTINGS, 1, GPU_NODE, [], idle, groups=[group("STRICT_SPREAD")], room={})
    assert waiting.retire == ()
    assert decide(SETTINGS, 1, GPU_NODE, [], idle).retire == ("7",)


def test_a_groups_own_bundle_resources_are_not_demand_for_new_nodes():
    status = {
        "clusterStatus": {
            "loadMetricsReport": {
                "resourceDemand": [
                    [{"CPU_group_0_3f2a9c1e08b7d6": 1.0, "GPU_group_3f2a9c1e08b7d6": 1.0}, 2],
                    [{"bundle_group_3f2a9c1e08b7d6": 0.001}, 1],
                    [{"CPU": 1.0}, 1],
                ],
                "pgDemand": [
                    [{"bundles": [[{"GPU": 1.0}, 2]], "strategy": "STRICT_SPREAD"}, 1],
                    [{"bundles": [[{"GPU": 1.0}, 1]], "strategy": "NEW_STRATEGY"}, 1],
                ],
            }
        }
    }
    view = parse_cluster_status(status)
    assert view.demand == (({"CPU": 1.0}, 1),)
    assert [g.strategy for g in view.groups] == ["STRICT_SPREAD", "PACK"]  # unknown: as PACK
    assert view.waiting and not RayView((), {}, None).waiting


def test_the_cause_names_tasks_and_groups():
    both = describe_demand([({"CPU": 1.0}, 2)], [group("PACK", n=2)])
    assert both == (
        "2 pending tasks/actors need 2 CPU; placement group PACK of 2 × {CPU: 1, GPU: 1} pending"
    )
    several = PlacementDemand("STRICT_SPREAD", ((ONE_GPU, 3),), count=2)
    assert describe_demand([], [several]).startswith("2 placement groups STRICT_SPREAD of 3 × ")


# -- Ray 2.60's own answers, recorded on the testbed -------------------------------------------
def recorded(name: str) -> RayView:
    body = json.loads((RECORDED / f"{name}.json").read_text())
    return parse_cluster_status(body["data"])


def test_a_recorded_pending_strict_spread_group_with_actors_waiting_for_it():
    """3 × {CPU 0.5, GPU 1} on a 1-node cluster of 1 CPU, 2 GPUs, an actor waiting per bundle:
    the actors' demand names the group's own resources and is left out; the head holds one
    bundle, each other one a worker job of its own."""
    view = recorded("pending-strict-spread-with-actors")
    assert view.demand == ()
    assert view.groups == (group("STRICT_SPREAD", {"CPU": 0.5, "GPU": 1.0}),)
    assert view.head_shape == Shape(1.0, 2.0, 24102699008.0)
    assert view.room == {"10.200.0.11": {"CPU": 1.0, "GPU": 2.0, "memory": 24102699008.0}}
    assert view.busy == {"10.200.0.11": False}
    decision = decide(SETTINGS, 1, view.head_shape, view.demand, [], groups=view.groups,
                      room=view.room)  # fmt: skip
    assert (decision.submit, decision.reports) == (2, ())
    assert decision.cause == "placement group STRICT_SPREAD of 3 × {CPU: 0.5, GPU: 1} pending"
    (spread,) = view.groups
    packed = PlacementDemand("PACK", spread.bundles)
    assert nodes_for((), view.head_shape, [packed], view.room.values()) == 1  # not enough
    two_at_most = AdaptSettings(1, 2, 5.0, 2)
    decision = decide(two_at_most, 1, view.head_shape, view.demand, [], groups=view.groups,
                      room=view.room)  # fmt: skip
    assert decision.submit == 0
    assert "needs a node of its own, at most 2" in decision.reports[0][1]


def test_a_recorded_pending_pack_group_and_task_beside_a_placed_group():
    """A placed group holds half the head's CPU and one GPU (an actor on half of it); then a
    PACK group of 2 × {CPU 0.25, GPU 1} and a task of 2 GPUs wait: the head's free GPU takes
    one bundle, the task a new node, the other bundle another."""
    view = recorded("pending-pack-and-a-task-beside-a-placed-group")
    assert view.demand == (({"CPU": 1.0, "GPU": 2.0}, 1),)
    assert view.groups == (group("PACK", {"CPU": 0.25, "GPU": 1.0}, 2),)
    assert view.room["10.200.0.11"] == {"CPU": 0.5, "GPU": 1.0, "memory": 24102699008.0}
    assert view.busy == {"10.200.0.11": True}
    shape = view.head_shape
    assert shape is not None
    assert nodes_for(view.demand, shape, view.groups, view.room.values()) == 2
    assert nodes_for(view.demand, shape, view.groups) == 2  # no room: the bundles share a node
    decision = decide(SETTINGS, 1, shape, view.demand, [], groups=view.groups, room=view.room)
    assert decision.submit == 2
    assert decision.cause == (
        "1 pending task/actors need 1 CPU, 2 GPU; "
        "placement group PACK of 2 × {CPU: 0.25, GPU: 1} pending"
    )


def test_a_recorded_strict_pack_group_larger_than_a_node_is_reported():
    view = recorded("pending-strict-pack-larger-than-a-node")
    assert view.groups == (group("STRICT_PACK", {"CPU": 0.25, "GPU": 1.0}),)
    assert view.head_shape is not None
    decision = decide(SETTINGS, 1, view.head_shape, view.demand, [], groups=view.groups,
                      room=view.room)  # fmt: skip
    assert decision.submit == 0
    assert [message for _, message in decision.reports] == [
        "placement group STRICT_PACK of 3 × {CPU: 0.25, GPU: 1} can never be placed: "
        "a worker node has 2 GPU, not 3"
    ]


def test_a_recorded_quiet_cluster_waits_for_nothing():
    view = recorded("nothing-pending")
    assert not view.waiting and view.busy == {"10.200.0.11": False}


def test_a_recorded_half_gpu_strict_spread_group_gets_the_two_nodes_packing_would_not():
    """Recorded by tests/test_placement_groups.py's adapt test: 3 × {CPU 0.25, GPU 0.5} on a
    1-node cluster of 1 CPU, 2 GPUs. All three bundles fit one node, so packing them asks for
    one worker job and the group waits for ever; spread, the head holds one and each other
    bundle gets a worker job of its own."""
    view = recorded("pending-half-gpu-strict-spread-on-one-node")
    assert view.demand == ()
    assert view.groups == (group("STRICT_SPREAD", {"CPU": 0.25, "GPU": 0.5}),)
    shape = view.head_shape
    assert shape is not None and (shape.cpus, shape.gpus) == (1.0, 2.0)
    (spread,) = view.groups
    packed = PlacementDemand("PACK", spread.bundles)
    assert nodes_for((), shape, [packed]) == 1  # what the bundles alone, packed, ask for
    decision = decide(SETTINGS, 1, shape, view.demand, [], groups=view.groups, room=view.room)
    assert (decision.submit, decision.wanted, decision.reports) == (2, 3, ())
    assert decision.cause == "placement group STRICT_SPREAD of 3 × {CPU: 0.25, GPU: 0.5} pending"
