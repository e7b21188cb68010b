"""What Slurm's accounting lets this user do: accounts, QOSes and their limits (sacctmgr).

Asked with two ``sacctmgr`` calls (the user's associations, the QOSes) and kept for a minute
per transport, so the panel's form, the magics' checks and the server's POSTs share one answer.
Accounting is optional: without it (no slurmdbd, sacctmgr missing or failing) the answer says
why, and nothing is refused on its account.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field

from ..errors import SlurmError, TransportError
from ..scheduler.interface import Scheduler
from ..scheduler.records import Association, Qos
from ..transport import Transport
from .client import SlurmClient

__all__ = ["Accounting", "forget_cached", "load_accounting"]

CACHE_SECONDS = 60.0


@dataclass(frozen=True)
class Accounting:
    """The user's associations and the site's QOSes; ``unavailable`` says why they are not
    known (then nothing is checked against them)."""

    associations: tuple[Association, ...] = ()
    qos: dict[str, Qos] = field(default_factory=dict)
    unavailable: str | None = None

    @property
    def known(self) -> bool:
        """Slurm's accounting answered and lists at least one association of this user."""
        return self.unavailable is None and bool(self.associations)

    @property
    def user(self) -> str | None:
        return self.associations[0].user if self.associations else None

    @property
    def default_account(self) -> str | None:
        for association in self.associations:
            if association.default_account:
                return association.default_account
        return None

    @property
    def admin_level(self) -> str:
        """``None``, ``Operator`` or ``Administrator`` (operators may raise time limits)."""
        return self.associations[0].admin_level if self.associations else "None"

    def accounts(self) -> list[str]:
        """The user's accounts, the default first."""
        names = list(dict.fromkeys(a.account for a in self.associations))
        default = self.default_account
        return sorted(names, key=lambda name: (name != default, name))

    def associations_of(self, account: str, partition: str | None) -> list[Association]:
        """The associations that apply to ``account`` in ``partition`` (None: the default)."""
        return [
            a
            for a in self.associations
            if a.account == account and (a.partition is None or a.partition == partition)
        ]

    def qos_names(self, account: str, partition: str | None = None) -> list[str]:
        """The QOSes the user may use under ``account``, the default first."""
        names: list[str] = []
        for association in self.associations_of(account, partition):
            names.extend(q for q in association.qos if q not in names)
        default = self.default_qos(account, partition)
        return sorted(names, key=lambda name: (name != default, name))

    def default_qos(self, account: str, partition: str | None = None) -> str | None:
        for association in self.associations_of(account, partition):
            if association.default_qos:
                return association.default_qos
        return None


# per transport, per kind of scheduler asked (the same site may be asked as Slurm and as --here)
_cache: weakref.WeakKeyDictionary[Transport, dict[type[Scheduler], tuple[float, Accounting]]] = (
    weakref.WeakKeyDictionary()
)


async def load_accounting(
    transport: Transport, *, max_age: float = CACHE_SECONDS, scheduler: Scheduler | None = None
) -> Accounting:
    """The user's accounting on ``transport``'s site, asked of ``scheduler`` (default: Slurm's)
    at most once per ``max_age`` s."""
    scheduler = scheduler or SlurmClient(transport)
    known = _cache.setdefault(transport, {})
    cached = known.get(type(scheduler))
    if cached is not None and time.monotonic() - cached[0] < max_age:
        return cached[1]
    accounting = await _ask(scheduler)
    known[type(scheduler)] = (time.monotonic(), accounting)
    return accounting


def forget_cached(transport: Transport) -> None:
    """The next :func:`load_accounting` asks Slurm again."""
    _cache.pop(transport, None)


async def _ask(scheduler: Scheduler) -> Accounting:
    try:
        associations = await scheduler.associations()
        qos = await scheduler.qos() if associations else {}
    except (SlurmError, TransportError) as exc:
        return Accounting(unavailable=f"{scheduler.system}'s accounting did not answer ({exc})")
    if not associations:
        return Accounting(unavailable="sacctmgr lists no association of this user")
    return Accounting(tuple(associations), qos)
