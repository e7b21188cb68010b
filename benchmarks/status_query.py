"""Cost of one Slurm status query: local, over one reused asyncssh connection, and with a fresh
``ssh host squeue`` process per query (what most tools do). Medians and ratios from one run.

Run on the testbed's login node:
    scripts/testbed exec -- /opt/jupyter-slurm-ray/venv/bin/python benchmarks/status_query.py
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.results import write_result
from jupyter_slurm_ray.slurm.client import SlurmClient
from jupyter_slurm_ray.transport import LocalTransport, SSHTransport


async def timed(query: Callable[[], Awaitable[object]], repeats: int) -> float:
    await query()  # warm-up (connection, caches)
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        await query()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


async def main(repeats: int, jobs: int) -> None:
    env = os.environ
    user, host, key, known = (
        env["JSR_USER"],
        env["JSR_SSH_HOST"],
        env[f"JSR_KEY_{env['JSR_USER']}"],
        env["JSR_KNOWN_HOSTS"],
    )
    local = LocalTransport(["runuser", "-u", user, "--"])
    job_ids = [
        (
            await local.run(
                ["sbatch", "--parsable", "-o", "/dev/null", "-t", "5", "--wrap", "sleep 300"]
            )
        ).stdout.strip()
        for _ in range(jobs)
    ]
    ssh = SSHTransport(host, username=user, client_keys=[key], known_hosts=known, agent_path=None)
    argv = ["squeue", "-h", "-t", "all", "-j", ",".join(job_ids), "-o", "%i|%T|%r|%N"]
    fresh_ssh = [
        "ssh", "-i", key, "-o", f"UserKnownHostsFile={known}", "-o", "StrictHostKeyChecking=yes",
        "-o", "BatchMode=yes", f"{user}@{host}", shlex.join(argv),
    ]  # fmt: skip

    async def fresh() -> None:
        await asyncio.to_thread(subprocess.run, fresh_ssh, check=True, capture_output=True)

    try:
        results = {
            "local (subprocess squeue)": await timed(
                lambda: SlurmClient(local).query(job_ids), repeats
            ),
            "ssh, one reused asyncssh connection": await timed(
                lambda: SlurmClient(ssh).query(job_ids), repeats
            ),
            "ssh, fresh `ssh host squeue` per query": await timed(fresh, repeats),
        }
    finally:
        await local.run(["scancel", *job_ids])
        await ssh.close()
    base = results["ssh, fresh `ssh host squeue` per query"]
    print(f"status query for {jobs} jobs, median of {repeats} (baseline: fresh ssh per query)")
    for name, median in results.items():
        print(f"  {name:42s} {median * 1000:8.1f} ms   ratio vs baseline {median / base:5.2f}")
    write_result(
        "status_query", {"jobs": jobs, "median_ms": {k: v * 1000 for k, v in results.items()}}
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--jobs", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main(args.repeats, args.jobs))
