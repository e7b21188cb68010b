"""``jupyter slurm-ray dashboard NAME`` from a terminal: the server extension's dashboard proxy,
served alone on this host's loopback until the command is interrupted.

A Jupyter server with this package's extension only (no Lab, no kernels) listens on
127.0.0.1, the extension loaded by its name as Jupyter loads it (``jupyter-config/``). The URL
printed is the proxy's sandboxed capability route (``server/capabilities.py``): an
unguessable path segment that stands for one cluster in this process only, and is worth
nothing once the command ends. Another user of the host who connects to the port without it
gets nothing; the cluster's Ray token is added by the proxy, server-side, as in Lab, and is
never in a URL. Jupyter's own token is random and never printed: nothing else of this server
is meant for a browser.
"""

from __future__ import annotations

import secrets
import signal
from collections.abc import Callable
from typing import Any

from jupyter_server.utils import url_path_join

from ..errors import SlurmRayError
from ..naming import CAPABILITIES_SETTING, DASHBOARD_ROUTE

EXTENSION = "jupyter_slurm_ray.server"  # as jupyter-config enables it


def dashboard_server_argv(port: int) -> list[str]:
    """The server's settings: loopback, no browser, a random token, no other extension."""
    return [
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        "--ServerApp.open_browser=False",
        f"--IdentityProvider.token={secrets.token_urlsafe(32)}",
        "--ServerApp.log_level=WARN",
    ]


def serve_dashboard(
    cluster_id: str, name: str, port: int = 0, tell: Callable[[str], None] = print
) -> None:
    """Serve the dashboard of ``cluster_id`` on 127.0.0.1:``port`` (0: one the kernel picks)
    until SIGINT or SIGTERM; ``tell`` is given the URL once the port is bound."""
    if not 0 <= port <= 65535:
        raise SlurmRayError(f"--port: {port} is not a TCP port (1-65535, or 0 for any free one)")
    from jupyter_server.serverapp import ServerApp

    app = ServerApp()
    app.jpserver_extensions = {EXTENSION: True}
    try:
        app.initialize(argv=dashboard_server_argv(port), find_extensions=False)
    except SystemExit as exc:  # Jupyter's way to say the port is taken
        raise SlurmRayError(
            f"--port: {port} is taken on 127.0.0.1: choose another, or 0 for any free one"
        ) from exc
    capabilities = app.web_app.settings.get(CAPABILITIES_SETTING)
    if capabilities is None:
        raise SlurmRayError(f"the server extension {EXTENSION} did not load")
    capability = capabilities.mint(cluster_id)
    path = url_path_join(app.base_url, DASHBOARD_ROUTE, cluster_id, f"~{capability}")

    def bound() -> None:  # called after the server's own bind on the same loop
        tell(f"Ray dashboard of {name}: http://127.0.0.1:{app.port}{path}/")
        tell("(this URL works while this command runs: Ctrl-C ends it)")

    app.io_loop.add_callback(bound)
    _stop_on_signals(app)
    try:
        app.io_loop.start()
    finally:
        app.http_server.stop()
        app.io_loop.run_sync(app.cleanup_extensions)


def _stop_on_signals(app: Any) -> None:
    """SIGINT and SIGTERM stop the loop (not Jupyter's confirm-on-Ctrl-C prompt)."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        app.io_loop.asyncio_loop.add_signal_handler(signum, app.io_loop.stop)
