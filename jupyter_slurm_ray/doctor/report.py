"""The doctor's checklist: its lines (``Check``) and the whole (``Report``) as a table in a
notebook, plain text in a terminal, JSON for scripts and the REST API."""

from __future__ import annotations

import html
import json
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["Check", "Report"]

_SYMBOLS = {"ok": "✓", "fail": "✗", "warn": "!", "skip": "–"}


@dataclass(frozen=True)
class Check:
    """One line of the checklist: ``status`` is ok, fail, warn (works, but see the fix) or
    skip (not applicable, or not checked because an earlier check failed)."""

    name: str
    title: str
    status: str
    detail: str
    fix: str = ""

    @property
    def symbol(self) -> str:
        return _SYMBOLS[self.status]


@dataclass
class Report:
    """The checklist, and the test job's figures (queue wait, duration)."""

    checks: list[Check] = field(default_factory=list)
    target: str = ""
    test_job: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(check.status != "fail" for check in self.checks)

    def check(self, name: str) -> Check:
        return next(check for check in self.checks if check.name == name)

    def failed(self) -> list[str]:
        return [check.name for check in self.checks if check.status == "fail"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "target": self.target,
            "test_job": self.test_job,
            "checks": [{**asdict(check), "symbol": check.symbol} for check in self.checks],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, ensure_ascii=False)

    def headline(self) -> str:
        job = self.test_job
        parts = [f"doctor ({self.target})"]
        if job.get("job_id"):
            where = f" on {job['node']}" if job.get("node") else ""
            wait = job.get("queue_wait")
            waited = f", {wait:g} s in the queue" if wait is not None else ""
            parts.append(f"test job {job['job_id']}{where}{waited}, {job['duration']:g} s in all")
        verdict = "all checks passed" if self.ok else f"{len(self.failed())} check(s) failed"
        return f"{'; '.join(parts)}: {verdict}"

    def text(self) -> str:
        width = max((len(check.title) for check in self.checks), default=0)
        lines = [self.headline()]
        for check in self.checks:
            lines.append(f"{check.symbol} {check.title:<{width}}  {check.detail}")
            if check.fix and check.status in ("fail", "warn"):
                lines.append(f"  {'':<{width}}  fix: {check.fix}")
        return "\n".join(lines)

    def html(self) -> str:
        colors = {"ok": "#1a7f37", "fail": "#cf222e", "warn": "#9a6700", "skip": "#6e7781"}
        rows = []
        for check in self.checks:
            fix = html.escape(check.fix) if check.status in ("fail", "warn") else ""
            rows.append(
                f'<tr><td style="color:{colors[check.status]};font-weight:bold">'
                f"{check.symbol}</td><td>{html.escape(check.title)}</td>"
                f"<td>{html.escape(check.detail)}</td><td>{fix}</td></tr>"
            )
        head = "<tr><th></th><th>check</th><th>what was seen</th><th>fix</th></tr>"
        return (
            f'<div class="jsr-doctor"><p>{html.escape(self.headline())}</p>'
            f'<table style="text-align:left">{head}{"".join(rows)}</table></div>'
        )

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        return {"text/plain": self.text(), "text/html": self.html()}

    def __str__(self) -> str:
        return self.text()
