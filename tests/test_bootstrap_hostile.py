"""A hostile neighbour on the compute nodes gets no token: bob, inside the head node's network
namespace, watches the node's TCP sockets for every new listener of alice's cluster and binds
the ten ports after it as it appears (or binds the port he can predict beforehand), answering
like a gRPC server and recording every byte. Alice's cluster either starts on ports bob does
not hold or fails clearly, and no piece of any token her job ever had is in what bob received.

Real jobs on the testbed as alice, bob's listeners run as bob (``helpers/squatter.py``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from .helpers.bootstrap import (
    JobDir,
    assert_cleaned_up,
    bootstrap_module,
    cancel_and_check_cleanup,
    cancel_leftovers,
    claims,
    log,
    run_as_user,
    run_ray_client,
    user_uid,
    wait_until_gone,
)
from .helpers.faults import record_figure
from .helpers.neighbour import BOB, Bob, Tokens, assert_no_token_reached

# One worker runs every test where bob squats ports or holds the nodes' shared port lock: two
# such tests at once would each see the other's bob.
pytestmark = pytest.mark.xdist_group("bob-squats-ports")

portblock = bootstrap_module("portblock")

HASH_RANGE = (19000, 19999)  # only the hash_jobid test's: below the other clusters' 20000-32000
# only the watched cluster's: bob squats after its listeners alone, not other tests' clusters
WATCHED_RANGE = (17000, 17999)


@pytest.fixture
def jobs(testbed) -> Iterator[list[JobDir]]:
    created: list[JobDir] = []
    yield created
    cancel_leftovers(created)


@pytest.fixture
def bobs(testbed) -> Iterator[list[Bob]]:
    started: list[Bob] = []
    yield started
    for bob in started:
        bob.leave()


@pytest.mark.testbed
@pytest.mark.ray
@pytest.mark.parametrize("role", ["head", "worker"])
def test_a_neighbour_squatting_the_next_ports_never_gets_the_token(
    jobs: list[JobDir], bobs: list[Bob], role: str
) -> None:
    """bob squats after each new listener of alice's cluster on the head's node, or on a
    worker's."""
    node = 1 if role == "head" else 2
    # start_timeout 240 s: on a loaded CI machine the head's dashboard had not answered in 120
    job = JobDir.create(nodes=2, port_range=list(WATCHED_RANGE), start_timeout=240.0)
    jobs.append(job)
    tokens = Tokens(job.path / "ray_token")
    bobs.append(Bob(node=node, mode="watch:{}-{}".format(*WATCHED_RANGE)))
    bob = bobs[0]
    job.submit(extra_sbatch=["--nodelist=node1,node2"])
    began = job.wait_started()["t"]
    end = job.wait_for_event(
        lambda e: e["event"] in ("ready", "error") and e["role"] == "head", 330, fail_on_error=False
    )

    events = job.events()
    retries = [e for e in events if e["event"] == "ports_retry" and e["role"] == role]
    squatted = bob.squatted()
    for retry in retries:  # each names ports bob took; the head's with a new token
        assert retry["new_token"] is (role == "head")
        if retry["by_uids"]:
            assert retry["by_uids"] == [user_uid(BOB)]
            assert set(retry["ports"]) <= squatted, (retry, sorted(squatted))
    if end["event"] == "ready":
        connection = job.connection()
        held_by_bob = set(connection["ports"].values()) & squatted
        assert not held_by_bob, f"the cluster uses ports bob holds: {sorted(held_by_bob)}"
        assert set(connection["verified"]["listeners"]) == {"gcs", "client", "dashboard", "relay"}
        outcome = f"started after {len(retries)} {role} retries"
    else:
        assert "was taken after the probe" in end["reason"], end
        assert not (job.path / "connection.json").exists()
        assert not (job.path / "head.json").exists()
        outcome = f"failed clearly after {len(retries)} {role} retries: {end['reason'][:200]}"
    log(f"hostile neighbour ({role}): {outcome} ({end['t'] - began:.1f} s after the start)")

    if end["event"] == "ready":
        cancel_and_check_cleanup(job)
    else:
        wait_until_gone(job.job_id, 30)
        assert_cleaned_up(job)
    seen = tokens.stop()
    assert len(seen) >= 1 + (len(retries) if role == "head" else 0)  # a new one per head block
    received = bob.received()
    log(
        f"hostile neighbour ({role}): bob held {len(squatted)} ports, received {len(received)} "
        f"connections with {sum(map(len, received.values()))} bytes; alice had {len(seen)} tokens"
    )
    assert_no_token_reached(bob, seen)
    record_figure(
        f"another user squats the ports after each new listener on the {role}'s node",
        outcome=outcome,
        retries=len(retries),
        tokens=len(seen),
        bob_ports=len(squatted),
        bob_connections=len(received),
        bob_bytes=sum(map(len, received.values())),
        token_pieces_at_bob=0,
        seconds=round(end["t"] - began, 1),
    )


@pytest.mark.testbed
@pytest.mark.ray
def test_hash_jobid_takes_the_derived_block_and_the_next_one_when_squatted(
    jobs: list[JobDir], bobs: list[Bob]
) -> None:
    # a range no other test's cluster uses: a block claimed beside this test would move plain's
    plain = JobDir.create(nodes=1, port_strategy="hash_jobid", port_range=list(HASH_RANGE))
    squatted = JobDir.create(nodes=1, port_strategy="hash_jobid", port_range=list(HASH_RANGE))
    jobs += [plain, squatted]
    size = len(portblock.PORT_NAMES) + plain.settings["worker_ports"]
    port_range = tuple(plain.settings["port_range"])
    plain.submit(extra_sbatch=["--nodelist=node2"])
    squatted.submit(extra_sbatch=["--nodelist=node3", "--hold"])
    order = portblock.derived_starts(squatted.job_id, size, port_range, [])
    dashboard = order[0] + portblock.PORT_NAMES.index("dashboard")
    bobs.append(Bob(node=3, mode="hold", ports=(dashboard,)))  # predictable: bob binds it first
    tokens = Tokens(squatted.path / "ray_token")
    run_as_user("scontrol", "release", squatted.job_id)

    expected = portblock.derived_starts(plain.job_id, size, port_range, [])[0]
    connection = plain.wait_ready()
    assert connection["ports"]["node_manager"] == expected
    assert [c["start"] for c in claims() if c["job_id"] == plain.job_id] == [expected]

    connection = squatted.wait_ready()
    # a later derived block: the next one, unless plain's claim covers it
    start = connection["ports"]["node_manager"]
    assert start in order[1:], (start, order[:5])
    assert dashboard in bobs[0].squatted()
    assert not [e for e in squatted.events() if e["event"] == "ports_retry"]  # the probe saw it
    cancel_and_check_cleanup(plain)
    cancel_and_check_cleanup(squatted)
    assert_no_token_reached(bobs[0], tokens.stop())
    log(f"hash_jobid: job {plain.job_id} -> {expected}; {squatted.job_id} -> {start}")


def servers_started(proxier_said: str) -> dict[int, str]:
    """The proxier's per-client servers by port: port -> the client's id (its INFO lines)."""
    found = re.findall(
        r"SpecificServer started on port: (\d+) with PID: \d+ for client: (\S+)", proxier_said
    )
    return {int(port): client for port, client in found}


@pytest.mark.testbed
@pytest.mark.ray
def test_a_neighbour_cannot_take_ray_clients_own_server_port(
    jobs: list[JobDir], bobs: list[Bob]
) -> None:
    """Ray Client's proxier starts a server per client on 127.0.0.1:<port>; the port is on that
    server's command line a second or two before it binds it, and bob binds it as soon as he
    reads it there. The port is one the kernel chose, held for the server (jsr_clientguard):
    bob's bind fails, the client connects at its first attempt, and bob receives nothing."""
    job = JobDir.create(nodes=1, port_strategy="kernel")
    jobs.append(job)
    job.submit(extra_sbatch=["--nodelist=node3"])
    connection = job.wait_ready()
    tokens = Tokens(job.path / "ray_token")
    bobs.append(Bob(node=3, mode=f"clientserver:1:{connection['gcs_address']}"))
    used = run_ray_client(job)
    assert used["hosts"] == ["node3"]
    bob = bobs[0]
    seen = [e["port"] for e in bob.log() if e["what"] == "client_server_seen"]
    failed = [e for e in bob.log() if e["what"] == "bind_failed"]
    proxier_said = job.head_log("ray_client_server.err")
    started = servers_started(proxier_said)
    accepted = [e for e in bob.log() if e["what"] == "accepted"]
    log(
        f"Ray Client squatter: bob saw client servers on {seen}, his binds failed on "
        f"{[e['port'] for e in failed]}; the proxier started servers on {sorted(started)}"
    )
    assert_no_token_reached(bob, tokens.stop())
    assert seen and not bob.squatted() and not accepted, bob.log()
    assert [e["port"] for e in failed] == seen  # the port was held for alice's server
    assert len(started) == 1 and "Not sending client" not in proxier_said  # the first attempt
    assert not any(23000 <= port <= 23999 for port in started)  # not Ray's shared range
    cancel_and_check_cleanup(job)
    record_figure(
        "another user binds Ray Client's per-client server port before that server does",
        bob_ports=0,
        bob_binds_failed=len(failed),
        bob_connections=len(accepted),
        client_connected_first_attempt=True,
    )
