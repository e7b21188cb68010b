"""What Ray Client cannot do, said in a notebook where it fails.

Ray Data does not run through Ray Client (Ray's documentation says so): its executor reaches
for the driver's core worker, which a Ray Client process has not, and a notebook shows an
``AttributeError: 'Worker' object has no attribute 'core_worker'`` (or a ``KeyError`` of a
``ClientObjectRef``) from deep inside ``ray/data``. When such an error comes out of Ray Data
while this kernel is connected through Ray Client, the kernel shows instead one line that says
why and how to get a driver, with Ray's own error after it (Ray Data's log of its own stack
trace is left out). Any other error is shown as IPython shows it. Installed with the magics
(IPython's ``set_custom_exc``, unless another handler holds it: there is one per shell).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import TracebackType
from typing import Any

__all__ = ["explain_ray_client_limits", "ray_data_through_client"]

log = logging.getLogger(__name__)

_RAY_DATA = "/ray/data/"
_RAY_DATA_LOGGER = "ray.data.exceptions"


def ray_data_through_client(name: str) -> str:
    """The line shown when Ray Data fails through Ray Client (cluster ``name``)."""
    return (
        "Ray Data does not run through Ray Client, which this kernel uses: run the kernel "
        "where it can be a Ray driver (connect = driver: a kernel on a compute node, under "
        "JupyterHub or Open OnDemand, or with up --here), or run this code as a Ray job: "
        f"ray job submit --address slurm_ray://{name or 'NAME'} -- python script.py"
    )


def _from_ray_data(tb: TracebackType | None) -> bool:
    while tb is not None:
        if _RAY_DATA in tb.tb_frame.f_code.co_filename.replace("\\", "/"):
            return True
        tb = tb.tb_next
    return False


def explain_ray_client_limits(shell: Any, through_client: Callable[[], str | None]) -> bool:
    """Install the handler in ``shell``; ``through_client()`` names the cluster this kernel
    is connected to through Ray Client (None: not so). False when another handler is there."""
    if shell.custom_exceptions:
        log.debug("IPython already has a custom exception handler: not installing ours")
        return False

    def handler(
        self: Any, etype: type, value: BaseException, tb: TracebackType, tb_offset: Any = None
    ) -> list[str]:
        name = through_client()
        if name is None or not _from_ray_data(tb):
            self.showtraceback((etype, value, tb), tb_offset=tb_offset)
            return []
        lines = [ray_data_through_client(name), f"(Ray's error: {etype.__name__}: {value})"]
        self._showtraceback(etype, value, lines)
        return lines

    shell.set_custom_exc((AttributeError, KeyError), handler)
    # Ray Data logs its own stack trace of the failure first ("Exception occurred in Ray Data
    # or Ray Core internal code…"): through Ray Client that is this limitation, said above
    logging.getLogger(_RAY_DATA_LOGGER).addFilter(_QuietThroughClient(through_client))
    return True


class _QuietThroughClient(logging.Filter):
    def __init__(self, through_client: Callable[[], str | None]) -> None:
        super().__init__()
        self.through_client = through_client

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno >= logging.ERROR and self.through_client() is not None)
