"""``slurm_ray://NAME``: Ray's Jobs tools find one of the user's clusters by its name.

Ray's job-submission client imports the module an address's scheme names and asks its
``get_job_submission_client_cluster_info`` for the dashboard's address and headers: so
``ray job submit --address slurm_ray://NAME -- python train.py``, ``RAY_ADDRESS=slurm_ray://NAME
ray job list`` and ``JobSubmissionClient("slurm_ray://NAME")`` work once the top-level module
``slurm_ray`` (shipped beside the package) answers for it. This is its work: the user's
record of NAME, the token and the cluster's CA from its job dir, and a way to the dashboard
that Ray's client can use as it is.

Ray's client checks HTTPS against the system's CAs (or its ``--verify``), while the head's
relay shows a certificate of the cluster's own CA. So the address given to Ray is a listener on
this host's loopback, in this process (the package's background event loop), that opens TLS to
the relay checked against the cluster's CA (through the SSH forward where the login node is
remote) and copies bytes both ways. Ray's client sends the token to its own process's
listener; it reaches the relay only once the relay proved to be the cluster's. The listener
ends with the process. A cluster without TLS is given as its dashboard's address.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
from dataclasses import dataclass
from typing import Any

from ..aio import run_sync
from ..bootstrap.dashhttp import dashboard_url, token_headers
from ..bootstrap.jsr_wire import TLS_CA_CERT, TLS_DIR
from ..errors import SlurmRayError
from ..job.directory import JobDir
from ..registry import FINAL_RECORD_STATES, Registry
from ..targets import Transports
from .connect import ConnectionInfo

__all__ = [
    "SCHEME",
    "dashboard_endpoint",
    "get_job_submission_client_cluster_info",
    "point_ray_jobs_at",
    "unpoint_ray_jobs",
]

SCHEME = "slurm_ray"
# Ray's Jobs client takes its address from this variable before any other (even one given to
# it): Ray's own examples' JobSubmissionClient("http://127.0.0.1:8265") then means the cluster
API_SERVER_VARIABLE = "RAY_API_SERVER_ADDRESS"
CONNECT_TIMEOUT = 10.0
CHUNK = 64 * 1024


@dataclass(frozen=True)
class Endpoint:
    url: str  # what Ray's client is given
    headers: dict[str, str]  # the token's header


_endpoints: dict[str, Endpoint] = {}  # by cluster id: one listener per cluster and process
_listeners: list[asyncio.Server] = []


def point_ray_jobs_at(name: str) -> None:
    """While this process is connected to cluster ``name``: Ray's Jobs client (and ``ray job``
    run from here, ``!ray job submit`` in a notebook) means it, unless the user set the
    variable."""
    current = os.environ.get(API_SERVER_VARIABLE)
    if current is None or current.startswith(f"{SCHEME}://"):
        os.environ[API_SERVER_VARIABLE] = f"{SCHEME}://{name}"


def unpoint_ray_jobs() -> None:
    """The variable gone again, if it is still the package's."""
    if os.environ.get(API_SERVER_VARIABLE, "").startswith(f"{SCHEME}://"):
        del os.environ[API_SERVER_VARIABLE]


def get_job_submission_client_cluster_info(
    address: str,
    registry: Registry,
    transports: Transports,
    *,
    create_cluster_if_needed: bool = False,
    cookies: dict[str, Any] | None = None,
    metadata: dict[str, Any] | None = None,
    headers: dict[str, Any] | None = None,
    **_: Any,
) -> Any:
    """Ray's hook for ``slurm_ray://NAME`` (``address`` is NAME): the cluster's ``ClusterInfo``,
    from ``registry``'s record, its job dir read through ``transports``."""
    from ray.dashboard.modules.dashboard_sdk import ClusterInfo

    endpoint = dashboard_endpoint(address, registry, transports)
    return ClusterInfo(
        address=endpoint.url,
        cookies=cookies,
        metadata=metadata,
        headers={**(headers or {}), **endpoint.headers},
    )


def dashboard_endpoint(address: str, registry: Registry, transports: Transports) -> Endpoint:
    """The dashboard of the cluster ``address`` names (its name, id or Slurm job id), as this
    process reaches it, with the token's header."""
    name = address.strip().strip("/")
    if not name or "/" in name:
        raise SlurmRayError(
            f"{SCHEME}://{address}: give a cluster's name, id or Slurm job id, e.g. "
            f"{SCHEME}://mycluster (jupyter slurm-ray list shows them)"
        )
    return run_sync(_endpoint(name, registry, transports))


async def _endpoint(name: str, registry: Registry, transports: Transports) -> Endpoint:
    record = registry.find(name)
    if record is None:
        raise SlurmRayError(
            f"{SCHEME}://{name}: no cluster of that name, id or job id in your registry "
            f"({registry.path}); jupyter slurm-ray list shows them"
        )
    if record.state in FINAL_RECORD_STATES:
        raise SlurmRayError(f"{SCHEME}://{name}: the cluster ended ({record.state})")
    known = _endpoints.get(record.id)
    if known is not None:
        return known
    job_dir = JobDir(transports.for_target(record.target), record.job_dir)
    info = ConnectionInfo.from_json(await job_dir.read_connection())
    token = await job_dir.read_token()
    forward = await job_dir.transport.forward(info.head_ip, info.dashboard_port)
    if info.tls:
        ca = await job_dir.transport.read_file(job_dir.file(f"{TLS_DIR}/{TLS_CA_CERT}"))
        port = await _tls_listener(forward.local_host, forward.local_port, info.head_ip, ca)
        url = dashboard_url("127.0.0.1", port).rstrip("/")
    else:
        url = dashboard_url(forward.local_host, forward.local_port).rstrip("/")
    # and Ray's own header: where Ray's token auth is on in the process (RAY_AUTH_MODE), Ray's
    # client would add an Authorization header of its own token, not this cluster's
    headers = {**token_headers(token), "Authorization": f"Bearer {token}"}
    endpoint = _endpoints[record.id] = Endpoint(url, headers)
    return endpoint


async def _tls_listener(host: str, port: int, name: str, ca: str) -> int:
    """A loopback listener whose connections go on over TLS to ``host:port``, whose
    certificate must be the CA's for ``name`` (the head's address); its port."""
    context = ssl.create_default_context(cadata=ca)

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            far_reader, far_writer = await asyncio.wait_for(
                asyncio.open_connection(host, port, ssl=context, server_hostname=name),
                CONNECT_TIMEOUT,
            )
        except (OSError, asyncio.TimeoutError, ssl.SSLError):
            writer.close()
            return
        await asyncio.gather(_copy(reader, far_writer), _copy(far_reader, writer))

    server = await asyncio.start_server(relay, "127.0.0.1", 0)
    _listeners.append(server)
    return int(server.sockets[0].getsockname()[1])


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(CHUNK):
            writer.write(chunk)
            await writer.drain()
    except (OSError, ssl.SSLError):
        pass
    finally:
        with contextlib.suppress(OSError, ssl.SSLError):
            writer.close()
