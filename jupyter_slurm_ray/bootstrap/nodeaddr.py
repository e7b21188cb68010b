"""This node's IPv4 address for Ray, and the Slurm controller's address to route toward."""

from __future__ import annotations

import re
import socket
import subprocess

from jsr_base import BootstrapError, Config, run_text
from slurmenv import own_job_environment


def ipv4_addresses(ip_output: str) -> list[str]:
    """Non-loopback IPv4 addresses in `ip -o -4 addr show` output, in order."""
    found = re.findall(r"\binet (\d+\.\d+\.\d+\.\d+)/", ip_output)
    return [address for address in found if usable_address(address)]


def usable_address(address: str) -> bool:
    return bool(address) and not address.startswith(("127.", "0.")) and address != "localhost"


def slurmctld_host(config_output: str) -> str | None:
    """The controller's address (or name) from `scontrol show config`."""
    values = dict(re.findall(r"^(\S+)\s*=\s*(.*?)\s*$", config_output, re.MULTILINE))
    addr = values.get("SlurmctldAddr", "")
    if addr and addr != "(null)":
        return addr
    host = values.get("SlurmctldHost[0]", "")
    match = re.fullmatch(r"([^()\s]+)(?:\(([^()\s]+)\))?", host)
    if not match:
        return None
    return match.group(2) or match.group(1)


def resolve_ipv4(name: str) -> str | None:
    if re.fullmatch(r"\d+\.\d+\.\d+\.\d+", name):
        return name
    try:
        return str(socket.getaddrinfo(name, None, socket.AF_INET)[0][4][0])
    except (OSError, IndexError):
        return None


def route_source_address(target: str) -> str | None:
    """The local address the kernel would use toward target (UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((target, 9))
            return probe.getsockname()[0]
        except OSError:
            return None


def address_from_command(command: str) -> str:
    try:
        done = subprocess.run(
            ["sh", "-c", command], capture_output=True, text=True, timeout=20, check=False
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise BootstrapError(f"node_ip_address_command {command!r} failed: {exc}") from exc
    words = done.stdout.split()
    if done.returncode != 0 or not words or not usable_address(words[0]):
        raise BootstrapError(
            f"node_ip_address_command {command!r} gave no usable address "
            f"(exit {done.returncode}, output {done.stdout.strip()[:80]!r})",
            done.stderr.splitlines(),
        )
    return words[0]


def interface_address(interface: str) -> str:
    found = ipv4_addresses(run_text(["ip", "-o", "-4", "addr", "show", "dev", interface]))
    if not found:
        raise BootstrapError(f"network_interface {interface} has no IPv4 address on this node")
    return found[0]


def node_address(config: Config, toward: str | None) -> str:
    """This node's address for Ray: site command, interface, route toward a peer, any global."""
    if config.node_ip_address_command:
        return address_from_command(config.node_ip_address_command)
    if config.network_interface:
        return interface_address(config.network_interface)
    target = resolve_ipv4(toward) if toward else None
    source = route_source_address(target) if target else None
    if source and usable_address(source):
        return source
    found = ipv4_addresses(run_text(["ip", "-o", "-4", "addr", "show", "scope", "global"]))
    if found:
        return found[0]
    raise BootstrapError(
        "cannot find this node's IPv4 address; set network_interface or node_ip_address_command"
    )


def slurmctld_address() -> str | None:
    return slurmctld_host(run_text(["scontrol", "show", "config"], env=own_job_environment()))
