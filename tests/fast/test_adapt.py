"""The adaptive policy with scripted inputs (elastic/policy.py): Ray's demand → submissions,
the pending limit, Slurm's never-start reasons, unplaceable demand, idle retirement; the
settings' one-line errors; Ray's ``api/cluster_status`` answer as the dashboard gives it."""

from __future__ import annotations

import pytest

from jupyter_slurm_ray.elastic.policy import AdaptSettings, JobView, checked_settings, decide
from jupyter_slurm_ray.elastic.raydemand import (
    PlacementDemand,
    Shape,
    describe_demand,
    nodes_for,
    parse_cluster_status,
)
from jupyter_slurm_ray.errors import SpecError
from jupyter_slurm_ray.ui.magic_args import parse

ONE_CPU = Shape(1.0, 0.0, 8e9)
SETTINGS = AdaptSettings(minimum=1, maximum=3, idle_timeout=10.0, max_pending=2)


def cpu(n: float = 1.0) -> dict[str, float]:
    return {"CPU": n}


def test_demand_submits_up_to_the_maximum_and_the_pending_limit():
    decision = decide(SETTINGS, 1, ONE_CPU, [(cpu(), 11)], [])
    assert decision.submit == 2  # maximum 3 nodes in all: head + 2
    assert decision.cause == "11 pending tasks/actors need 11 CPU"
    limited = AdaptSettings(1, 10, 10.0, max_pending=2)
    assert decide(limited, 1, ONE_CPU, [(cpu(), 11)], []).submit == 2
    one_pending = [JobView("7", pending=True, reason="Resources")]
    assert decide(limited, 1, ONE_CPU, [(cpu(), 11)], one_pending).submit == 1


def test_jobs_on_their_way_count_before_anything_more_is_submitted():
    coming = [JobView("7", pending=False), JobView("8", pending=True, reason="Priority")]
    assert decide(SETTINGS, 1, ONE_CPU, [(cpu(), 2)], coming).submit == 0
    settling = [JobView("7", pending=False, joined=True, settling=True)]
    assert decide(SETTINGS, 1, ONE_CPU, [(cpu(), 1)], settling).submit == 0
    joined = [JobView("7", pending=False, joined=True)]
    assert decide(SETTINGS, 1, ONE_CPU, [(cpu(), 1)], joined).submit == 1


def test_pending_jobs_are_never_cancelled_while_demand_remains():
    waiting = [JobView("7", True, "Resources"), JobView("8", True, "Resources")]
    decision = decide(SETTINGS, 1, ONE_CPU, [(cpu(), 5)], waiting)
    assert (decision.submit, decision.retire) == (0, ())


def test_a_job_that_can_never_start_is_reported_and_blocks_the_same_shape():
    stuck = [JobView("9", True, "PartitionNodeLimit")]
    decision = decide(SETTINGS, 1, ONE_CPU, [(cpu(), 4)], stuck)
    assert decision.submit == 0 and decision.retire == ()
    ((key, message),) = decision.reports
    assert key == "never:9"
    assert "PENDING (PartitionNodeLimit)" in message and "never start; not retried" in message


def test_demand_no_worker_node_can_hold_is_reported_not_submitted_for():
    decision = decide(SETTINGS, 1, ONE_CPU, [({"CPU": 8.0}, 1), ({"GPU": 1.0}, 2)], [])
    assert decision.submit == 0
    messages = dict(decision.reports)
    assert len(messages) == 2
    assert any("a worker node has 1 CPU, not 8" in m for m in messages.values())
    assert any("a worker node has 0 GPU, not 1" in m for m in messages.values())


def test_idle_joined_workers_are_retired_never_below_the_minimum():
    idle = [JobView("7", False, joined=True, idle_for=12.0), JobView("8", False, joined=True)]
    decision = decide(SETTINGS, 1, ONE_CPU, [], idle)
    assert decision.retire == ("7",)
    assert decision.cause == "worker job 7 idle 12 s"
    both = [JobView(j, False, joined=True, idle_for=30.0) for j in ("7", "8")]
    at_least_two = AdaptSettings(2, 3, 10.0, 2)
    assert decide(at_least_two, 1, ONE_CPU, [], both).retire == ("7",)
    assert decide(SETTINGS, 1, ONE_CPU, [(cpu(), 1)], both).retire == ()  # work is waiting


def test_below_the_minimum_submits_and_above_the_maximum_retires_pending_first():
    assert decide(AdaptSettings(3, 3, 10.0, 2), 1, ONE_CPU, [], []).submit == 2
    jobs = [JobView("7", False, joined=True), JobView("8", True, "Resources")]
    assert decide(AdaptSettings(1, 2, 10.0, 2), 1, ONE_CPU, [], jobs).retire == ("8",)


def test_pending_jobs_go_only_after_a_long_quiet():
    jobs = [JobView("8", True, "Resources")]
    assert decide(SETTINGS, 1, ONE_CPU, [], jobs, quiet_for=3.0).retire == ()
    decision = decide(SETTINGS, 1, ONE_CPU, [], jobs, quiet_for=11.0)
    assert decision.retire == ("8",)
    assert decision.cause == "worker job 8 PENDING, nothing to run for 11 s"


def test_packing_counts_nodes_not_cpus():
    two = Shape(2.0)
    assert nodes_for([(cpu(), 3)], two) == 2
    assert nodes_for([(cpu(1.5), 3)], two) == 3
    assert describe_demand([(cpu(), 3)]) == "3 pending tasks/actors need 3 CPU"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"minimum": -1, "maximum": 3}, "minimum"),
        ({"minimum": 1, "maximum": 2.5}, "maximum"),
        ({"minimum": 1, "maximum": "three"}, "maximum"),
        ({"minimum": 3, "maximum": 2}, "maximum"),
        ({"minimum": 0, "maximum": 2}, "minimum"),  # below the head's allocation
        ({"minimum": 1, "maximum": 2, "idle_timeout": -5}, "idle_timeout"),
        ({"minimum": 1, "maximum": 2, "max_pending": 0}, "max_pending"),
        ({"minimum": 1, "maximum": 2, "group": "gpu"}, "group"),
    ],
)
def test_bad_settings_are_one_line_naming_the_field(kwargs, field):
    values = {"idle_timeout": 10, "max_pending": 2, "group": None, **kwargs}
    with pytest.raises(SpecError) as caught:
        checked_settings(
            values["minimum"],
            values["maximum"],
            values["idle_timeout"],
            values["max_pending"],
            values["group"],
            head_nodes=1,
        )
    assert field in str(caught.value) and "\n" not in str(caught.value)


def test_settings_from_magic_strings():
    settings = checked_settings("1", "3", "5", "2", "default", head_nodes=1)
    assert settings == AdaptSettings(1, 3, 5.0, 2)
    args = parse("adapt ray --minimum 1 --maximum 3 --idle 5 --max-pending 1")
    assert (args.name, args.minimum, args.maximum, args.idle, args.max_pending) == (
        "ray",
        "1",
        "3",
        "5",
        "1",
    )
    assert parse("adapt --off").off is True


# What Ray 2.60's dashboard answered on the testbed (trimmed): 3 one-CPU tasks and one 4-CPU
# task waiting on a one-CPU head.
CLUSTER_STATUS = {
    "clusterStatus": {
        "time": 1796109649.5,
        "loadMetricsReport": {
            "resourceDemand": [[{"CPU": 1.0}, 3], [{"CPU": 4.0}, 1]],
            "pgDemand": [[{"bundles": [[{"CPU": 1.0}, 2]], "strategy": "PACK"}, 1]],
            "requestDemand": [],
            "usageByNode": {
                "0472": {
                    "node:10.200.0.11": [0.0, 1.0],
                    "CPU": [1.0, 1.0],
                    "memory": [0.0, 24438333440.0],
                    "node:InternalHead": [0.0, 1.0],
                },
                "9a1c": {"node:10.200.0.12": [0.0, 1.0], "CPU": [0.0, 1.0], "GPU": [0.0, 0.0]},
            },
        },
    }
}


def test_the_dashboards_cluster_status_gives_demand_usage_and_the_head_shape():
    view = parse_cluster_status(CLUSTER_STATUS)
    assert view.demand == (({"CPU": 1.0}, 3), ({"CPU": 4.0}, 1))
    assert view.groups == (PlacementDemand("PACK", (({"CPU": 1.0}, 2),), 1),)  # apart
    assert view.busy == {"10.200.0.11": True, "10.200.0.12": False}
    assert view.head_shape == Shape(1.0, 0.0, 24438333440.0)
    assert parse_cluster_status({}).demand == ()


# -- the loop (adapt.Adapter) with a stub cluster: it survives a failing step ----------------
class _State:
    is_final = False


class _Workers:
    wanted = 0

    def active(self, group=None):
        return []

    async def exclusively(self, move):  # one change at a time: there is only this one
        return await move(None)


class _Status:
    state = _State()


class _Spec:
    name, nodes, cpus_per_node, gpus_per_node, mem_per_node = "ray", 1, 1, 0, None


class _StubCluster:
    """What Adapter reads of a cluster (no Slurm, no Ray)."""

    spec, status, workers, events, stopping = _Spec(), _Status(), _Workers(), [], False

    def __init__(self) -> None:
        self.updates = 0

    def _update_state(self) -> None:
        self.updates += 1


async def test_a_failing_step_is_shown_and_the_loop_goes_on():
    import asyncio

    from jupyter_slurm_ray.elastic.adapt import Adapter
    from jupyter_slurm_ray.elastic.raydemand import RayView

    cluster = _StubCluster()
    adapter = Adapter(
        cluster,  # type: ignore[arg-type]
        cluster.workers,  # type: ignore[arg-type]
        SETTINGS,
        interval=0.01,
        on_change=cluster._update_state,
    )
    answers = [RuntimeError("dashboard: connection refused"), RayView((), {}, ONE_CPU)]
    errors_seen = []

    async def read_ray():
        answer = answers.pop(0) if answers else RayView((), {}, ONE_CPU)
        if isinstance(answer, Exception):
            raise answer
        return answer

    adapter.read_ray = read_ray  # type: ignore[method-assign]
    adapter.start()
    for _ in range(200):
        errors_seen.append(adapter.error)
        if not answers and adapter.error is None and len(errors_seen) > 2:
            break
        await asyncio.sleep(0.01)
    assert "dashboard: connection refused" in errors_seen  # shown while it failed
    assert adapter.running and adapter.error is None  # and it went on
    assert adapter.lines()[0] == SETTINGS.describe()
    await adapter.stop()
    assert not adapter.running and cluster.updates >= 2


async def test_stop_waits_for_a_step_under_way_and_a_cancelled_caller_stays_cancelled():
    import asyncio

    from jupyter_slurm_ray.elastic.adapt import Adapter
    from jupyter_slurm_ray.elastic.raydemand import RayView

    cluster = _StubCluster()
    adapter = Adapter(cluster, cluster.workers, SETTINGS, interval=0.01)  # type: ignore[arg-type]
    in_step, step_ended = asyncio.Event(), asyncio.Event()

    async def read_ray():  # a step that finishes what it does even when cancelled
        in_step.set()
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await asyncio.sleep(0.05)  # e.g. a worker job's sbatch still answering
            step_ended.set()
            raise
        return RayView((), {}, ONE_CPU)

    adapter.read_ray = read_ray  # type: ignore[method-assign]
    adapter.start()
    await in_step.wait()
    await adapter.stop()  # returns once the step ended, without raising its cancellation
    assert step_ended.is_set() and not adapter.running

    step_ended.clear()
    in_step.clear()
    adapter.start()
    await in_step.wait()
    stopping = asyncio.create_task(adapter.stop())
    await asyncio.sleep(0.01)
    stopping.cancel()  # the caller (e.g. a kernel's down) is cancelled while it waits
    with pytest.raises(asyncio.CancelledError):
        await stopping
    await asyncio.wait_for(step_ended.wait(), 5)


def test_the_magic_command_passes_the_settings_and_off():
    from jupyter_slurm_ray.ui.adaptcommand import adapt_command

    calls = []

    class Cluster:
        spec = _Spec()

        def adapt_or_ask(self, *args, **kwargs):  # this kernel's cluster: applied here
            calls.append((args, kwargs))
            return (None if kwargs["off"] else AdaptSettings(1, 3, 60.0, 2)), True

    class Session:
        def find(self, name):
            assert name == "ray"
            return Cluster()

        def setting(self, name, default):
            return {"adapt_idle_timeout": 60.0, "adapt_max_pending": None}.get(name) or default

    args = parse("adapt ray --minimum 1 --maximum 3")
    assert adapt_command(Session(), args) == ["ray: " + AdaptSettings(1, 3, 60.0, 2).describe()]
    # what the command leaves unset, the cluster fills in from the configuration (one place
    # for every path: tests/fast/test_scaling_interfaces.py)
    unset = {"idle_timeout": None, "max_pending": None, "group": None}
    assert calls[-1] == (("1", "3"), {"off": False, **unset})
    assert adapt_command(Session(), parse("adapt ray --off"))[0].startswith("ray: adaptive")
    assert calls[-1] == ((None, None), {"off": True, **unset})
    with pytest.raises(Exception, match="give --maximum N"):
        adapt_command(Session(), parse("adapt ray --minimum 1"))
