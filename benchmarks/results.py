"""Where the benchmarks keep their figures: one JSON file per run, so runs can be compared."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent.parent / "test-artifacts" / "benchmarks"


def write_result(name: str, figures: dict[str, Any], directory: Path | None = None) -> Path:
    """Write ``figures`` with when and where they were measured; returns the file's path."""
    directory = directory or Path(os.environ.get("JSR_BENCHMARK_DIR", RESULTS_DIR))
    directory.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = directory / f"{name}-{stamp}.json"
    document = {
        "benchmark": name,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "figures": figures,
    }
    path.write_text(json.dumps(document, indent=2) + "\n")
    print(f"\nfigures written to {path}")
    return path
