"""The real Slurm testbed (``scripts/testbed``) as the tests see it: its users, its SSH login.

The real tier runs as root inside the testbed's login namespace, "on the login node"; it acts
as the unprivileged test user through ``runuser``, or logs in as that user over SSH.
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass

from jupyter_slurm_ray.transport import SSHTransport

#: The unprivileged test user (``$JSR_USER`` inside the testbed).
USER = os.environ.get("JSR_USER", "alice")

#: The testbed's compute network (``$JSR_CLUSTER_NET``: each flavour of scripts/testbed has its
#: own; the host's, bookworm, 10.200.0.0/24).
CLUSTER_NET = ipaddress.ip_network(os.environ.get("JSR_CLUSTER_NET", "10.200.0.0/24"))

#: Whether the testbed kills a job over its memory as a site does (``$JSR_PROFILE`` enforced:
#: the rooted flavours' default), and then what the tests' 1-CPU clusters ask for.
ENFORCED = os.environ.get("JSR_PROFILE") == "enforced"
ENFORCED_MEMORY = "1536M" if ENFORCED else None
#: Whether each job has a /tmp of its own (job_container/tmpfs): the enforced profile's too.
PRIVATE_TMP = ENFORCED

#: The login node's address on the laptop side (``$JSR_SSH_HOST``).
SSH_HOST = os.environ.get("JSR_SSH_HOST", "10.201.0.2")


def node_ip_pattern() -> str:
    """A regular expression for any address of the compute network (a /24)."""
    return re.escape(node_ip(0).rpartition(".")[0]) + r"\.\d+"


def node_ip(index: int) -> str:
    """The address of ``node<index>`` (scripts/testbed gives node I the host part 10 + I); with
    an index no node has, an address of the compute network that nothing answers."""
    return str(CLUSTER_NET.network_address + 10 + index)


#: The partition of the testbed's solo nodes (``scripts/testbed up -s``), which no other
#: partition holds but ``solo-short``: the tests marked ``solo`` take every node of it, one
#: test at a time, beside the tests sharing the default partition's nodes.
SOLO = "solo"


@dataclass(frozen=True)
class Testbed:
    __test__ = False  # not a test class, despite its name

    ssh_host: str
    ssh_port: int
    known_hosts: str
    user: str
    user2: str
    keys: dict[str, str]
    nodes: int
    solo_nodes: int
    gpus: int

    def key(self, user: str) -> str:
        return self.keys[user]

    @property
    def node_names(self) -> tuple[str, ...]:
        """The default partition's nodes: ``node1`` … ``nodeN``, as scripts/testbed names them."""
        return tuple(f"node{i}" for i in range(1, self.nodes + 1))

    @property
    def solo_node_names(self) -> tuple[str, ...]:
        """The nodes of the partition :data:`SOLO`, numbered after the default partition's."""
        return tuple(f"node{i}" for i in range(self.nodes + 1, self.nodes + self.solo_nodes + 1))


def testbed_from_environment() -> Testbed | None:
    """The testbed ``scripts/testbed exec`` describes in ``JSR_*`` variables; None outside."""
    env = os.environ
    if env.get("JSR_TESTBED") != "1":
        return None
    users = (env["JSR_USER"], env["JSR_USER2"])
    return Testbed(
        ssh_host=env["JSR_SSH_HOST"],
        ssh_port=int(env.get("JSR_SSH_PORT", "22")),
        known_hosts=env["JSR_KNOWN_HOSTS"],
        user=users[0],
        user2=users[1],
        keys={u: env[f"JSR_KEY_{u}"] for u in users},
        nodes=int(env["JSR_NODES"]),
        solo_nodes=int(env.get("JSR_SOLO_NODES", "0")),
        gpus=int(env["JSR_GPUS"]),
    )


def runuser(user: str) -> list[str]:
    """The argv prefix that runs a command as ``user`` (a LocalTransport's command prefix)."""
    return ["runuser", "-u", user, "--"]


def ssh_transport(testbed: Testbed, user: str | None = None, **overrides) -> SSHTransport:
    """An SSHTransport logging in to the login node as ``user`` (the test user by default)."""
    user = user or testbed.user
    options = dict(
        port=testbed.ssh_port,
        username=user,
        client_keys=[testbed.key(user)],
        known_hosts=testbed.known_hosts,
        agent_path=None,
        connect_timeout=5,
    )
    options.update(overrides)
    return SSHTransport(testbed.ssh_host, **options)
