"""adapt's settings beside its bounds (``idle_timeout``, ``max_pending``), declared once: each
one's default and the ``SlurmRay.adapt_*`` setting that changes it (``config.py`` makes its
traits from these; ``policy.AdaptSettings`` takes its defaults from them). Pure, and it imports
nothing of the package: the configuration reads it without the policy."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class AdaptOption:
    """One setting of ``adapt`` beside its bounds, declared once: the ``adapt()`` keyword and
    ``AdaptSettings`` field ``name``, its default, and the ``SlurmRay.adapt_<name>`` setting
    (of ``kind``, with ``help``) that changes the default wherever adapt is asked for (the
    magic, the CLI, the REST API, another process's request)."""

    name: str
    kind: str  # "float" or "int": the SlurmRay trait's kind
    default: float
    help: str

    @property
    def setting(self) -> str:
        return f"adapt_{self.name}"


ADAPT_OPTIONS = (
    AdaptOption(
        "idle_timeout", "float", 60.0, "Seconds a node runs nothing before `adapt` retires it"
    ),
    AdaptOption("max_pending", "int", 2, "Worker jobs `adapt` lets wait in Slurm's queue at once"),
)
ADAPT_DEFAULTS: Mapping[str, float] = {option.name: option.default for option in ADAPT_OPTIONS}
