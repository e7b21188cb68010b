"""The bootstrap's view of a node: its address, its allocation, Ray's temp dir and interpreter,
the nodes Ray reports alive, the worker step; and the shipped directory itself. Pure."""

from __future__ import annotations

import ast
import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from jupyter_slurm_ray.job.shipping import bootstrap_files

from ..helpers.bootstrap import BOOTSTRAP_DIR, bootstrap_module

# the job's Python imports them top-level, from the shipped directory
jsr_base = bootstrap_module("jsr_base")
nodeaddr = bootstrap_module("nodeaddr")
rayargs = bootstrap_module("rayargs")
dashapi = bootstrap_module("dashapi")
nodewatch = bootstrap_module("nodewatch")
workerstep = bootstrap_module("workerstep")
BootstrapError, Config = jsr_base.BootstrapError, jsr_base.Config


def test_address_parsing() -> None:
    ip_output = textwrap.dedent("""\
        1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever
        2: eth0    inet 10.200.0.12/24 brd 10.200.0.255 scope global eth0\\       valid_lft
        3: ib0    inet 192.168.7.4/16 scope global ib0
        """)
    assert nodeaddr.ipv4_addresses(ip_output) == ["10.200.0.12", "192.168.7.4"]
    config = "SlurmctldAddr           = (null)\nSlurmctldHost[0]        = vm(10.200.0.1)\n"
    assert nodeaddr.slurmctld_host(config) == "10.200.0.1"
    assert nodeaddr.slurmctld_host("SlurmctldHost[0] = ctl1\n") == "ctl1"
    assert nodeaddr.slurmctld_host("SlurmctldAddr = 10.9.9.9\nSlurmctldHost[0] = a(b)\n") == (
        "10.9.9.9"
    )
    assert nodeaddr.slurmctld_host("") is None
    assert nodeaddr.route_source_address("127.0.0.1") == "127.0.0.1"
    assert not nodeaddr.usable_address("127.0.1.1")


def test_node_address_sources() -> None:
    command = Config(cluster_id="c", node_ip_address_command="echo 10.1.2.3 second-word")
    assert nodeaddr.node_address(command, toward=None) == "10.1.2.3"
    loopback = Config(cluster_id="c", node_ip_address_command="echo 127.0.1.1")
    with pytest.raises(BootstrapError, match="no usable address"):
        nodeaddr.node_address(loopback, None)
    with pytest.raises(BootstrapError, match="network_interface nosuchif0"):
        nodeaddr.node_address(Config(cluster_id="c", network_interface="nosuchif0"), None)


def test_allocation_sizing() -> None:
    slurm = {"SLURM_CPUS_ON_NODE": "4", "SLURM_CPUS_PER_TASK": "2"}
    assert rayargs.allocated_cpus(slurm, usable=8) == 4
    assert rayargs.allocated_cpus({"SLURM_CPUS_PER_TASK": "2"}, usable=8) == 2
    assert rayargs.allocated_cpus(slurm, usable=1) == 1  # the cores the job is bound to
    assert rayargs.visible_gpus({"CUDA_VISIBLE_DEVICES": "0,1"}) == 2
    assert rayargs.visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == 0
    assert rayargs.visible_gpus({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}) == 0
    assert rayargs.visible_gpus({}) == 0
    assert workerstep.worker_step_cpus({"SLURM_JOB_CPUS_PER_NODE": "2(x3)"}) == 2
    assert workerstep.worker_step_cpus({"SLURM_JOB_CPUS_PER_NODE": "8,4(x2),6"}) == 4
    assert workerstep.worker_step_cpus({}) is None
    mib = 1024 * 1024
    assert rayargs.object_store_bytes(None, {"SLURM_MEM_PER_NODE": "1000"}, 2) == 300 * mib
    assert rayargs.object_store_bytes(None, {"SLURM_MEM_PER_CPU": "100"}, 2) == 80 * mib
    assert rayargs.object_store_bytes(None, {"SLURM_MEM_PER_NODE": "100000"}, 2) == 2048 * mib
    assert rayargs.object_store_bytes(123456789, {}, 2) == 123456789
    # what Ray's own processes leave: a 1-CPU head in 1200 MB keeps 280 MB for its store
    assert rayargs.object_store_bytes(None, {"SLURM_MEM_PER_NODE": "1200"}, 1, head=True) == (
        280 * mib
    )
    # Ray's `memory` resource: the job's, less the store and Ray's processes (not the host's)
    env = {"SLURM_MEM_PER_NODE": "3072"}
    store = rayargs.object_store_bytes(None, env, 1, head=True)
    assert rayargs.ray_memory_bytes(env, 1, store, True) == (3072 - 921 - 920) * mib
    assert rayargs.ray_memory_bytes({}, 1, store, True) is None


def test_temp_dir_is_short_and_private() -> None:
    parent = Path(f"/tmp/jsr-{os.getuid()}")
    made_parent = not parent.exists()
    path = rayargs.node_temp_dir("4294967295", "a-very-long-compute-node-name-0001")
    try:
        assert len(str(path)) <= rayargs.MAX_TEMP_DIR
        assert path.parent == parent
        assert path.parent.stat().st_mode & 0o777 == 0o700  # Ray makes `path` itself 0777
    finally:
        path.rmdir()
        if made_parent:  # leave /tmp as it was
            parent.rmdir()


def test_ray_interpreter_from_shebang(tmp_path: Path) -> None:
    script = tmp_path / "ray"
    script.write_text("#!/opt/venv/bin/python3\nimport sys\n")
    assert rayargs.ray_interpreter(str(script)) == "/opt/venv/bin/python3"
    script.write_text("#!/bin/sh\n'''exec' /very/long/venv/bin/python3 \"$0\" \"$@\"\n' '''\n")
    assert rayargs.ray_interpreter(str(script)) == "/very/long/venv/bin/python3"
    script.write_text("#!/usr/bin/env python3\n")
    assert rayargs.ray_interpreter(str(script)) == __import__("shutil").which("python3")
    ray_version, python_version, import_seconds = rayargs.ray_versions(
        str(Path(sys.executable).parent / "ray")
    )
    assert ray_version == "2.60.0" and python_version == platform.python_version()
    assert import_seconds is not None and 0 < import_seconds < 60


def test_node_rows_from_the_state_api() -> None:
    rows = [
        {"node_ip": "10.0.0.2", "node_id": "b", "state": "ALIVE",
         "resources_total": {"slurm_ray_node": 1}},
        {"node_ip": "10.0.0.1", "node_id": "a", "state": "ALIVE",
         "resources_total": {"slurm_ray_node": 1}},
        {"node_ip": "10.0.0.1", "node_id": "a2", "state": "ALIVE",
         "resources_total": {"slurm_ray_node": 1}},
        {"node_ip": "10.0.0.3", "node_id": "c", "state": "DEAD",
         "resources_total": {"slurm_ray_node": 1}},
        {"node_ip": "10.0.0.4", "node_id": "d", "state": "ALIVE", "resources_total": {"CPU": 1}},
    ]  # fmt: skip
    payload = {"result": True, "msg": "", "data": {"result": {"total": 4, "result": rows}}}
    alive = dashapi.alive_slurm_nodes(dashapi.node_rows(payload))
    node = dashapi.AliveNode
    assert alive == [node("10.0.0.1", "a"), node("10.0.0.1", "a2"), node("10.0.0.2", "b")]
    assert dashapi.node_rows({"data": None}) == []


def alive(*pairs: str) -> list:
    """AliveNodes from "ip/id" pairs."""
    return [dashapi.AliveNode(*pair.split("/")) for pair in pairs]


def test_node_watch_reports_each_loss_and_rejoin() -> None:
    events: list[tuple[str, dict]] = []
    watch = nodewatch.NodeWatch(3, lambda event, **f: events.append((event, f)), lambda h: h)
    watch.hosts = {"10.0.0.1": "node1", "10.0.0.2": "node2", "10.0.0.3": "node3"}
    everyone = alive("10.0.0.1/a", "10.0.0.2/b", "10.0.0.3/c")
    watch.note(everyone)
    watch.check_lost(alive("10.0.0.1/a", "10.0.0.3/c"))
    watch.check_lost(alive("10.0.0.1/a", "10.0.0.3/c"))  # no news
    watch.check_lost(everyone)  # node2 back
    watch.check_lost(alive("10.0.0.1/a", "10.0.0.2/b"))  # node3 lost
    watch.check_lost(alive("10.0.0.1/a"))  # node2 lost again

    def nodes(joined: int, hosts: list[str], ids: list[str]) -> tuple[str, dict]:
        return ("nodes", {"joined": joined, "wanted": 3, "hosts": hosts, "node_ids": ids})

    assert [e for e, _ in events] == [
        "nodes", "nodes", "node_lost", "nodes", "nodes", "node_lost", "nodes", "node_lost",
    ]  # fmt: skip
    assert events[0] == nodes(3, ["node1", "node2", "node3"], ["a", "b", "c"])
    assert events[1] == nodes(2, ["node1", "node3"], ["a", "c"])
    assert events[2] == (
        "node_lost",
        {
            "reason": "1 node(s) left the cluster: node2", "hosts": ["node2"],
            "node_ids": ["b"], "log": ["node2"], "joined": 2, "wanted": 3,
        },
    )  # fmt: skip
    assert events[3] == nodes(3, ["node1", "node2", "node3"], ["a", "b", "c"])
    assert events[5][1]["hosts"] == ["node3"] and events[5][1]["joined"] == 2
    assert events[7][1]["hosts"] == ["node2"] and events[7][1]["joined"] == 1


def test_two_nodes_on_one_host_are_two_nodes_and_the_loss_of_one_is_seen() -> None:
    """A worker job on the head's node: same address, another Ray node id."""
    events: list[tuple[str, dict]] = []
    watch = nodewatch.NodeWatch(2, lambda event, **f: events.append((event, f)), lambda h: h)
    watch.hosts = {"10.0.0.1": "node1"}
    watch.note(alive("10.0.0.1/head"))
    watch.note(alive("10.0.0.1/head", "10.0.0.1/job"))
    two = {"joined": 2, "wanted": 2, "hosts": ["node1", "node1"], "node_ids": ["head", "job"]}
    assert events[-1] == ("nodes", two)
    watch.check_lost(alive("10.0.0.1/head"))
    assert events[-1][0] == "node_lost" and events[-1][1]["node_ids"] == ["job"]
    assert events[-1][1]["joined"] == 1


def test_worker_step_passes_the_whole_environment(tmp_path: Path) -> None:
    env = {"SLURMD_NODENAME": "node1", "SLURM_JOB_CPUS_PER_NODE": "2(x3)"}
    argv = workerstep.worker_step_argv("/usr/bin/srun", tmp_path, 2, env)
    assert "--export=ALL" in argv and "--exclude=node1" in argv and "--cpus-per-task=2" in argv
    assert argv[-3:] == [str(tmp_path / "bootstrap"), "worker", str(tmp_path)]


def test_help() -> None:
    done = subprocess.run(
        [sys.executable, str(BOOTSTRAP_DIR), "--help"], capture_output=True, text=True, check=True
    )
    assert "head" in done.stdout and "worker" in done.stdout and "events.jsonl" in done.stdout


def test_shipped_modules_are_stdlib_only_and_shadow_nothing() -> None:
    files = bootstrap_files()
    shipped = {str(p.relative_to(BOOTSTRAP_DIR)) for p in BOOTSTRAP_DIR.glob("**/*.py")}
    assert "__main__.py" in files and set(files) == shipped
    ours = {name.removesuffix(".py") for name in files if "/" not in name}
    assert not ours & sys.stdlib_module_names  # the directory comes first on sys.path
    site = {name.split("/")[1].removesuffix(".py") for name in files if "/" in name}
    assert not (site - {"sitecustomize"}) & sys.stdlib_module_names  # first for Ray's Pythons
    ours |= site
    for name, text in files.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                tops = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{name}: a relative import fails in `python DIR`"
                tops = [(node.module or "").split(".")[0]]
            else:
                continue
            assert all(top in ours or top in sys.stdlib_module_names for top in tops), (name, tops)


def test_rays_processes_get_token_auth_and_no_grpc_fork_handlers(tmp_path: Path) -> None:
    ports = {"autoscaler_metrics": 20001, "dashboard_metrics": 20002}
    env = rayargs.ray_environment(Config(cluster_id="c-1"), tmp_path, ports)
    assert env["RAY_AUTH_MODE"] == "token"
    assert env["RAY_AUTH_TOKEN_PATH"] == str(tmp_path / "ray_token")
    assert env["GRPC_ENABLE_FORK_SUPPORT"] == "0"  # the Ray Client server's fork (see there)
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(tmp_path / "bootstrap" / "sitepath")
    mine = Config(cluster_id="c-1", env={"GRPC_ENABLE_FORK_SUPPORT": "1"})
    assert rayargs.ray_environment(mine, tmp_path, ports)["GRPC_ENABLE_FORK_SUPPORT"] == "1"


@pytest.mark.parametrize(("noted", "counted"), [("1", "1"), ("0", "0"), (None, "0")])
def test_a_walltime_warning_from_before_the_node_listened_is_counted(noted, counted):
    """The job script (or ``__main__``) noted Slurm's USR1 in ``JSR_WALLTIME_WARNED``: the
    node's handlers count it as their own, and Ray does not inherit the variable."""
    code = (
        "import os, noderun; flags = noderun.SignalFlags().install(); "
        "print(flags.walltime_warnings, 'JSR_WALLTIME_WARNED' in os.environ)"
    )
    env = {k: v for k, v in os.environ.items() if k != "JSR_WALLTIME_WARNED"}
    env["PYTHONPATH"] = str(BOOTSTRAP_DIR)
    if noted is not None:
        env["JSR_WALLTIME_WARNED"] = noted
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert result.stdout.split() == [counted, "False"]
