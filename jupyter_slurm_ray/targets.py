"""The transports of one process, built only from its own configuration, one per target.

A *target* is the name of where Slurm commands run (``Transport.target``: ``"local"``,
``"local (runuser -u alice --)"``, ``"ssh://alice@login1"``; ``"local mode"`` or
``"local mode (runuser -u alice --)"`` for clusters run as processes of this machine).
Records keep only that name; a record asking for a target this process is not configured
for gets :class:`UnknownTarget`, so a hostile record can never make this process run a
command of its choosing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from .errors import UnknownTarget
from .naming import local_mode_target, target_name
from .transport import Transport

__all__ = ["Transports"]


class Transports:
    """The configured transport (made on first use) and the lookup of records' targets."""

    def __init__(
        self, make_configured: Callable[[], Transport], *, reconfigurable: bool = True
    ) -> None:
        self._make_configured = make_configured
        self._reconfigurable = reconfigurable
        self._configured: Transport | None = None

    def configured(self) -> Transport:
        """The transport this process's configuration describes: one instance per target,
        reused (one SSH connection per login node). When ``reconfigurable`` (a kernel), it is
        replaced once the configuration names another target (``%config SlurmRay.…``); a
        server's configuration is fixed, so it is made once."""
        if self._configured is not None and not self._reconfigurable:
            return self._configured
        candidate = self._make_configured()
        if self._configured is None or self._configured.target != candidate.target:
            self._configured = candidate
        return self._configured

    def for_target(self, target: object) -> Transport:
        """The configured transport if ``target`` names it (or its local-mode sibling),
        else UnknownTarget."""
        name = target_name(target)  # type: ignore[arg-type]
        configured = self.configured()
        local = configured.for_local_mode()
        if name == local_mode_target(local.target):
            return local
        if name != configured.target:
            raise UnknownTarget(
                f"the cluster was started through {name!r}, but this process is configured for "
                f"{configured.target!r}; set the same login host / command prefix here "
                "(SlurmRay config or JUPYTER_SLURM_RAY_* variables) to manage it"
            )
        return configured

    def reaches(self, target: object) -> bool:
        configured = self.configured()
        name = target_name(target)  # type: ignore[arg-type]
        local = local_mode_target(configured.for_local_mode().target)
        return name in (configured.target, local)

    async def close(self) -> None:
        if self._configured is not None:
            with contextlib.suppress(Exception):
                await self._configured.for_local_mode().close()
                await self._configured.close()
            self._configured = None
