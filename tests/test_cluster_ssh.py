"""SSH mode from the laptop side: the laptop reaches only the login node's sshd, so Ray Client
and the dashboard must go through tunnels. The session runs in the host ("laptop") network
namespace as a separate process; this test checks what it saw and what it left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from .helpers.clusters import wait_until_nothing_left
from .helpers.faults import daemon_pid, record_figure
from .helpers.jobs import in_queue
from .helpers.paths import child_environment

pytestmark = [pytest.mark.testbed, pytest.mark.ray]


@pytest.mark.compat
def test_laptop_session_tunnels_ray_client_and_dashboard_and_leaves_nothing(tmp_path, testbed):
    laptop = os.environ["JSR_LAPTOP_NETNS"]
    session = ["nsenter", f"--net={laptop}", sys.executable, "-m", "tests.helpers.laptop_session"]
    result = subprocess.run(
        [*session, str(tmp_path / "state")],
        capture_output=True,
        text=True,
        timeout=400,
        env=child_environment(),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["state"] == "CONNECTED"
    assert seen["head_reachable_directly"] is False  # only the tunnel gets there
    # connect = "auto" (the default) chose Ray Client: a laptop reaches Slurm over SSH
    assert seen["connect_mode"] == "client" and seen["ray_client_connected"] is True
    assert seen["connect_reason"].startswith("auto: Slurm is reached through "), seen
    assert seen["connect_reason"].endswith(": this kernel is off the cluster"), seen
    assert len(seen["hosts"]) == 2 and set(seen["hosts"]) <= {"node1", "node2", "node3"}
    assert seen["hosts"] == sorted(set(seen["hosts"]))  # one task on each of two nodes
    assert seen["dashboard_url"].startswith("https://127.0.0.1:")  # the relay, forwarded
    assert seen["dashboard_with_token"] == 200
    assert seen["dashboard_without_token"] in (401, 403)
    assert seen["forwards_while_up"] == 2 and seen["forwards_after_down"] == 0
    assert seen["final_state"] == "STOPPED"
    assert not in_queue(seen["job_id"])
    wait_until_nothing_left(seen["job_id"], seen["job_dir"])


def test_an_ssh_drop_mid_task_keeps_the_forwards_and_the_lease_and_leaks_no_token(
    tmp_path, testbed
):
    """The sshd process serving the session is killed while a Ray task runs (only this
    session's: the user's others, other tests' beside it, go on)."""
    laptop = os.environ["JSR_LAPTOP_NETNS"]
    daemon = str(daemon_pid("sshd"))
    session = ["nsenter", f"--net={laptop}", sys.executable, "-m", "tests.helpers.laptop_drop"]
    result = subprocess.run(
        [*session, str(tmp_path / "state"), daemon],
        capture_output=True,
        text=True,
        timeout=400,
        env=child_environment(),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    record_figure(
        "SSH session killed mid-task",
        **{k: v for k, v in seen.items() if k not in ("job_dir",)},
    )
    assert seen["sessions_killed"] == 1 and seen["ssh_connects"] >= 2
    assert seen["bystander_connects"] == 1  # the user's other session was not touched
    assert seen["ports_after"] == seen["ports_before"]  # the same listeners, held throughout
    assert seen["squatter_bound"] == [] and seen["squatter_got_token"] is False
    assert seen["lease_renewed_after_drop"] is True
    assert seen["task_after_drop"] in {"node1", "node2", "node3"}
    assert seen["state_after_drop"] == "CONNECTED"
    assert seen["final_state"] == "STOPPED" and seen["forwards_after_down"] == 0
    assert not in_queue(seen["job_id"])
    left_for = wait_until_nothing_left(seen["job_id"], seen["job_dir"])
    left_after = seen["down_s"] + left_for  # down() ran in the laptop's process
    record_figure("SSH session killed mid-task", nothing_left_after_down_s=round(left_after, 1))
