"""Connecting this Python process to a cluster: with Ray Client (preflight, token, bounded
retries), or as an ordinary Ray driver through this host's own Ray node (driver mode,
``client/drivernode.py``).

Both need the same Ray version and the same Python minor version on both sides; this is
checked before connecting so the user gets a clear error instead of a gRPC failure. A cluster
that runs with TLS (``connection.json`` says so) is connected to with its CA and a certificate
it signed (Ray's ``RAY_USE_TLS`` variables in this process, set for the connection and removed
when it ends): the channel is refused before a byte of the token goes to any listener that
cannot show the cluster's certificate. About one
Ray Client connect in twelve fails with "Starting Ray client server failed" (ray#63202): that
one is retried a bounded number of times with a shortened timeout. The channel never goes
through a proxy (``direct_ray_client_channel``): the token travels in its metadata.
``import ray`` costs seconds in a notebook's environment: ``import_ray`` pays it ahead, while
the job waits in the queue.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from ..bootstrap.jsr_wire import TLS_VARIABLES, TlsFiles
from ..errors import ConnectError
from .deferral import defer_costly_imports
from .rayinit import note_connected, note_disconnected, own_init

log = logging.getLogger(__name__)

# The proxier's per-client server can also die at start-up, seen as psutil's ZombieProcess in
# "Initialization failure from server", or lose the new session ("already been cleaned up"):
# the same race, retried alike.
_TRANSIENT = (
    "Starting Ray client server failed",
    # the proxier gave up waiting for its per-client server (slow to start on a busy head, or
    # its port taken by another user): a retry gets a new server
    "Proxy failed to Connect to backend",
    "ray client connection timeout",
    "ZombieProcess",
    "session that has already been cleaned up",
)


_GRPC_PROXY_OPTION = "grpc.enable_http_proxy"


@dataclass(frozen=True)
class ConnectionInfo:
    """The head's ``connection.json``, written by the bootstrap when the cluster is ready."""

    head_ip: str
    client_port: int
    dashboard_port: int
    gcs_address: str
    ray_version: str
    python_version: str
    node_count: int
    job_id: str = ""
    head_host: str = ""
    nodes: tuple[dict[str, str], ...] = ()
    ports: dict[str, int] = field(default_factory=dict)
    import_ray_seconds: float | None = None  # what each of Ray's Python processes pays there
    tls: bool = False  # Ray's TLS: dashboard_port is then the head's relay (https)
    head_node_id: str = ""

    @classmethod
    def from_json(cls, text: str) -> ConnectionInfo:
        try:
            data = json.loads(text)
            info = cls(
                head_ip=str(data["head_ip"]),
                client_port=int(data["client_port"]),
                dashboard_port=int(data["dashboard_port"]),
                gcs_address=str(data["gcs_address"]),
                ray_version=str(data["ray_version"]),
                python_version=str(data["python_version"]),
                node_count=int(data["node_count"]),
                job_id=str(data.get("job_id", "")),
                head_host=str(data.get("head_host", "")),
                nodes=tuple(data.get("nodes", ())),
                ports={str(k): int(v) for k, v in dict(data.get("ports", {})).items()},
                import_ray_seconds=_optional_float(data.get("import_ray_seconds")),
                tls=bool(data.get("tls", False)),
                head_node_id=str(data.get("head_node_id") or ""),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ConnectError(f"connection.json is not valid: {exc}") from None
        _require_verified(data, info)
        return info


def _require_verified(data: dict[str, Any], info: ConnectionInfo) -> None:
    """The head's Ray Client and dashboard ports are the listeners the bootstrap verified as
    the job's own Ray (``bootstrap/listeners.py``), or with TLS its own relay in front of the
    dashboard: the token goes to no other address."""
    verified = data.get("verified")
    listeners = verified.get("listeners") if isinstance(verified, dict) else None
    ports = listeners if isinstance(listeners, dict) else {}
    dashboard = ports.get("relay" if info.tls else "dashboard")
    if ports.get("client") != info.client_port or dashboard != info.dashboard_port:
        raise ConnectError(
            "connection.json does not say that its Ray Client and dashboard ports were verified "
            "as the cluster's own Ray (written by an older bootstrap, or not by one): not "
            "connecting, so that the token goes nowhere else; start the cluster again"
        )


def _optional_float(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


def local_versions() -> tuple[str, str]:
    """(Ray version, Python version) of this process."""
    try:
        ray_version = metadata.version("ray")
    except metadata.PackageNotFoundError:
        ray_version = "not installed"
    return ray_version, ".".join(map(str, sys.version_info[:3]))


def preflight(info: ConnectionInfo) -> None:
    """Refuse to connect when Ray Client cannot work, saying both versions and the fix."""
    ray_here, python_here = local_versions()
    same_ray = ray_here == info.ray_version
    same_python = python_here.split(".")[:2] == info.python_version.split(".")[:2]
    if same_ray and same_python:
        return
    raise ConnectError(
        f"version mismatch: the cluster runs Ray {info.ray_version} on Python "
        f"{info.python_version}, this kernel has Ray {ray_here} on Python {python_here}. "
        "Ray Client and a Ray driver need the same Ray version and the same Python minor "
        "version on both sides: "
        f"install ray[default]=={info.ray_version} with Python "
        f"{'.'.join(info.python_version.split('.')[:2])} in this kernel's environment, or point "
        "the cluster's setup lines / python at an environment matching this kernel."
    )


def import_ray() -> None:
    """Import what connecting imports (ray, Ray Client's modules), in whichever thread calls
    it: 2 s in a notebook's environment, paid while the job waits rather than after the head
    answers. Nothing when ray is missing (``preflight`` says so when it matters)."""
    started = time.monotonic()
    defer_costly_imports()
    try:
        import ray
        import ray.util.client.worker  # noqa: F401
    except Exception as exc:  # a broken install: the connect itself will say how
        log.debug("ray not imported ahead: %s", exc)
        return
    log.debug("ray imported ahead in %.2f s", time.monotonic() - started)


class _AsItIs:
    """``tls=AS_IT_IS``: Ray's TLS variables of this process's environment are kept as they
    are (a script started with them set; the kernel always says which, or None)."""


AS_IT_IS = _AsItIs()
TlsChoice = TlsFiles | None | _AsItIs


def set_token_environment(token_path: str, tls: TlsChoice = AS_IT_IS) -> None:
    """Token auth with this cluster's token, and its TLS (or none), for Ray in this process."""
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN_PATH"] = token_path
    os.environ.pop("RAY_AUTH_TOKEN", None)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if isinstance(tls, _AsItIs):
        return
    clear_tls_environment()
    if tls is not None:
        os.environ.update(tls.environment())


def clear_tls_environment() -> None:
    """No Ray TLS settings of a cluster in this process (none of them outlives its session)."""
    for name in TLS_VARIABLES:
        os.environ.pop(name, None)


def set_client_environment(token_path: str, timeout: float, tls: TlsChoice = AS_IT_IS) -> None:
    """Token auth, TLS and a bounded connect timeout for Ray Client in this process."""
    set_token_environment(token_path, tls)
    seconds = str(max(1, int(timeout)))
    # Ray Client tries 3 times with a backoff (5 s, 10 s, …) capped at this maximum.
    os.environ["RAY_CLIENT_MAX_CONNECTION_TIMEOUT_S"] = seconds
    # A cluster that is gone should fail Ray calls soon, not after Ray's default 30 s.
    os.environ.setdefault("RAY_CLIENT_RECONNECT_GRACE_PERIOD", "15")
    worker: Any = sys.modules.get("ray.util.client.worker")
    if worker is not None:  # already imported: its constants were read at import time
        worker.MAX_TIMEOUT_SEC = int(seconds)
    _reload_ray_auth_settings()


def _reload_ray_auth_settings() -> None:
    """Ray caches the auth mode and the token once read: make it see this cluster's."""
    from ray._raylet import (  # type: ignore[attr-defined]  # compiled, no stubs for these
        AuthenticationTokenLoader,
        Config,
    )

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def connect_ray_client(
    address: str,
    token_path: str,
    *,
    timeout: float = 20.0,
    attempts: int = 3,
    tls: TlsChoice = AS_IT_IS,
    cluster: str = "",
) -> Any:
    """``ray.init("ray://…")`` with token auth (and the cluster's TLS: ``tls``, or Ray's TLS
    variables as this process has them); retries the known transient failure.

    Blocking: call it off the event loop that serves SSH forwards.
    """
    defer_costly_imports()
    set_client_environment(token_path, timeout, tls)
    import ray

    direct_ray_client_channel()

    last: Exception | None = None
    tried = 0
    for attempt in range(1, attempts + 1):
        tried = attempt
        started = time.monotonic()
        try:
            with _quiet_thread_warning(), own_init():
                context = ray.init(address, logging_level=logging.WARNING, log_to_driver=True)
            log.info("connected to %s in %.1f s", address, time.monotonic() - started)
            note_connected(context, cluster, client=True)
            return context
        except ConnectionError as exc:
            last = exc
            if not any(marker in str(exc) for marker in _TRANSIENT):
                break
            log.warning("Ray Client connect attempt %d/%d failed: %s", attempt, attempts, exc)
            _shutdown_quietly()
    raise ConnectError(
        f"could not connect to the Ray cluster at {address} after {tried} attempt(s): {last}. "
        "Check that the cluster is READY (status()) and that this kernel may reach it."
    ) from None


def connect_driver(
    gcs_address: str,
    token_path: str,
    *,
    node_ip: str,
    temp_dir: str,
    tls: TlsChoice = AS_IT_IS,
    cluster: str = "",
) -> Any:
    """``ray.init(address=<GCS>)`` as an ordinary driver, through this host's own Ray node
    (the one at ``node_ip`` whose temp dir is ``temp_dir``: other nodes may share the host),
    with token auth, and with TLS the node's certificate (this process's own gRPC server
    answers the cluster at the node's address). Blocking: call it off the event loop.

    Only once that node joined the cluster at ``gcs_address``: a driver started toward a
    wrong address waits for many minutes.
    """
    set_token_environment(token_path, tls)
    defer_costly_imports()
    _reload_ray_auth_settings()
    import ray

    started = time.monotonic()
    try:
        with _quiet_thread_warning(), own_init():
            context = ray.init(
                address=gcs_address,
                _node_ip_address=node_ip,
                _temp_dir=temp_dir,
                logging_level=logging.WARNING,
                log_to_driver=True,
            )
    except (ConnectionError, RuntimeError, ValueError) as exc:
        _shutdown_quietly()
        raise ConnectError(
            f"could not connect to the Ray cluster at {gcs_address} as a driver: {exc}"
        ) from None
    log.info("connected to %s as a driver in %.1f s", gcs_address, time.monotonic() - started)
    note_connected(context, cluster, client=False)
    return context


def direct_ray_client_channel() -> None:
    """Ray Client's gRPC channel in this process goes straight to the address it is given.

    gRPC honours ``grpc_proxy``, ``https_proxy`` and ``http_proxy`` unless its channel option
    ``grpc.enable_http_proxy`` is 0. Ray 2.60 sets it to 0 for every channel unless
    ``RAY_grpc_enable_http_proxy`` was set when Ray was imported; Ray Client's options (one
    list, shared by its module and the client worker) get the 0 whatever that variable says.
    The environment is left as it is: the user's other programs keep their proxies.
    """
    from ray.util.client import common

    options = common.GRPC_OPTIONS
    options[:] = [(k, v) for k, v in options if k != _GRPC_PROXY_OPTION]
    options.append((_GRPC_PROXY_OPTION, 0))


class _NotMainThreadFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "current thread is not the main thread" not in record.getMessage()


# Where Ray's "SIGTERM handler is not set" warning reaches this process: Ray's own ray.init, and
# Ray Client's log stream, which relays the warning of the server's ray.init on the head (its
# logger has no handler: Python's last resort prints the bare line into the notebook)
_THREAD_WARNING_LOGGERS = ("ray._private.worker", "ray.util.client.logsclient")


@contextlib.contextmanager
def _quiet_thread_warning() -> Iterator[None]:
    """Hide Ray's "SIGTERM handler is not set" warning: we connect off the main thread on
    purpose (the main thread belongs to the notebook), and Ray Client needs no handler; the
    Ray Client server on the head connects off its main thread too. The filters stay: the
    relayed line may come after the connect returned."""
    for name in _THREAD_WARNING_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _NotMainThreadFilter) for f in logger.filters):
            logger.addFilter(_NotMainThreadFilter())
    yield


def disconnect_ray_client() -> None:
    _shutdown_quietly()
    clear_tls_environment()


def disconnect_driver() -> None:
    _shutdown_quietly()
    clear_tls_environment()


def _shutdown_quietly() -> None:
    note_disconnected()
    import ray

    try:
        ray.shutdown()
    except Exception as exc:  # a half-open client can fail to shut down; nothing to keep
        log.debug("ray.shutdown: %s", exc)
