"""Driver mode against Ray Client, side by side in one kernel on a compute node: the connect
time after the head answers (and where it goes), a 1 GiB ``ray.put``/``ray.get``, a small
``ray.tune`` run and a small ``ray.train`` run (a ``DataParallelTrainer`` of two workers, no
torch). Ray Client's figures are printed as ratios against driver mode's, the baseline, run in
the same process, the two interleaved (driver, client, driver, client, …). What Ray Client
cannot do is reported as the error it gives.

Run on the login node (it submits the kernel's job, ``sbatch -N1 -c1 --mem=4G`` on node1, as
the test user, and prints the figures when it is done):

    scripts/testbed exec -- /opt/jupyter-slurm-ray/venv/bin/python benchmarks/driver_vs_client.py

Ray Tune and Train need ``ray[tune]``'s packages (pandas, pyarrow, fsspec, tensorboardX, numpy)
on the kernel's and the nodes' path: ``--deps DIR`` (a ``pip install --target`` directory every
user can read; default ``/tmp/jsr-driver-tune``, made with ``pip install --target DIR pandas
pyarrow fsspec tensorboardX numpy``) is put first on both; without it Tune and Train report
their import error. ``--before CHECKOUT`` runs the same kernel with another
checkout of the package first on its path, Ray Client only: the figures before a change.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO))
USER = os.environ.get("JSR_USER", "alice")
MB = 1024 * 1024
GIB = 1024 * MB
MODES = ("driver", "client")


# ----------------------------------------------------------------------------- in the kernel


def connect_figures(cluster: Any) -> dict[str, float]:
    """Seconds from the head answering (its ``head_ready`` event) to each step of the connect
    (``ClientSide.connect_steps``), and when this host's node joined (driver mode)."""
    from jupyter_slurm_ray.states import State

    events: dict[str, float] = {}
    for event in cluster.events:
        events.setdefault(event.get("phase") or event["event"], event["t"])
    head = events["head_ready"]
    connected_state = min(s.at for s in cluster.history if s.state is State.CONNECTED)
    figures = {"connected (state)": connected_state - head}
    steps = getattr(cluster._client, "connect_steps", {})  # this package's own bookkeeping
    for step in ("started", "read", "chosen", "imported", "connected"):
        if step in steps:
            figures[f"connect step: {step}"] = steps[step] - head
    for name, at in events.items():  # every event's first, from the head answering
        figures[f"event: {name}"] = at - head
    return figures


def put_get(size: int) -> dict[str, Any]:
    import ray

    payload = os.urandom(MB) * (size // MB)
    started = time.monotonic()
    ref = ray.put(payload)
    put = time.monotonic() - started
    back = ray.get(ref, timeout=600)
    got = time.monotonic() - started - put
    ok = len(back) == len(payload) and back[:MB] == payload[:MB] and back[-MB:] == payload[-MB:]
    del back, ref
    return {"put": put, "get": got, "ok": ok}


def tune_run(storage: Path, name: str) -> dict[str, Any]:
    """A function trainable over a grid of 3, 5 reports each."""
    from ray import tune

    def trainable(config: dict[str, Any]) -> None:
        for step in range(5):
            tune.report({"score": config["x"] * step})
            time.sleep(0.1)

    started = time.monotonic()
    tuner = tune.Tuner(
        trainable,
        param_space={"x": tune.grid_search([1, 2, 3])},
        run_config=tune.RunConfig(storage_path=str(storage), name=name, verbose=0),
    )
    results = tuner.fit()
    best = results.get_best_result(metric="score", mode="max")
    return {"seconds": time.monotonic() - started, "trials": len(results), "best": best.config}


def train_run(storage: Path, name: str) -> dict[str, Any]:
    """A data-parallel trainer of two workers, each reporting a few steps (no torch)."""
    from ray import train
    from ray.train import RunConfig, ScalingConfig

    if train.is_v2_enabled():  # Ray's default: its RunConfig is Train V2's
        from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer
    else:
        from ray.train.data_parallel_trainer import DataParallelTrainer  # type: ignore[no-redef]

    def loop(config: dict[str, Any]) -> None:
        for step in range(3):
            train.report({"step": step, "rank": train.get_context().get_world_rank()})

    started = time.monotonic()
    trainer = DataParallelTrainer(
        loop,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=str(storage), name=name),
    )
    result = trainer.fit()
    return {"seconds": time.monotonic() - started, "metrics": result.metrics}


def attempt(what: Any, *args: Any) -> dict[str, Any]:
    """The figures of ``what``, or the error it raised, as it is."""
    try:
        return what(*args)
    except Exception as exc:
        lines = traceback.format_exception_only(type(exc), exc)
        return {"error": " ".join(line.strip() for line in lines)[:600]}


def one_run(mode: str | None, work: Path, options: argparse.Namespace, index: int) -> dict:
    from jupyter_slurm_ray import ClusterSpec, SlurmRayCluster
    from jupyter_slurm_ray.registry import Registry
    from jupyter_slurm_ray.transport import LocalTransport

    setup = [f"source {Path(sys.executable).parent}/activate"]
    if options.deps:
        setup.append(f"export PYTHONPATH={shlex.quote(options.deps)}${{PYTHONPATH:+:$PYTHONPATH}}")
    settings: dict[str, Any] = dict(
        nodes=options.nodes,
        time="15",
        cpus_per_node=1,
        python=sys.executable,
        setup=setup,
        object_store_memory=options.object_store,
        start_timeout=180,
        owner_timeout=60,
    )
    if options.away:
        settings["extra_sbatch"] = ["--exclude=node1"]  # the kernel's node: a node of its own
    if mode is not None:
        settings["connect"] = mode
    cluster = SlurmRayCluster(
        ClusterSpec(**settings), LocalTransport(), registry=Registry(work / "state"),
        poll_interval=options.poll_interval,
    )  # fmt: skip
    figures: dict[str, Any] = {"mode": mode or "client (before)"}
    try:
        cluster.up()
        figures["connect"] = connect_figures(cluster)
        figures["connect_reason"] = getattr(cluster.status, "connect_reason", None)
        figures["put_get_1gib"] = attempt(put_get, GIB)
        storage = work / "results"
        name = f"{mode or 'before'}-{index}"
        figures["tune"] = attempt(tune_run, storage, f"tune-{name}")
        figures["train"] = attempt(train_run, storage, f"train-{name}")
    except Exception:
        figures["error"] = traceback.format_exc()[-2000:]
    finally:
        cluster.down()
    return figures


def kernel(options: argparse.Namespace) -> None:
    work = Path(options.kernel)
    runs: list[dict] = []
    modes: tuple[str | None, ...] = (None,) if options.before else tuple(options.modes)
    for index in range(options.repeats):
        for mode in modes:
            runs.append(one_run(mode, work, options, index))
            (work / "runs.json").write_text(json.dumps(runs, indent=1, default=str))
    (work / "result.json").write_text(json.dumps(runs, indent=1, default=str))


# ----------------------------------------------------------------------------- on the login side


def submit(options: argparse.Namespace) -> tuple[str, Path]:
    work = Path(f"/home/{USER}/.jsr-bench-{uuid.uuid4().hex[:8]}")
    as_user = ["runuser", "-u", USER, "--"]
    subprocess.run([*as_user, "mkdir", "-m", "700", str(work)], check=True)
    code = options.before or str(REPO)
    argv = [
        sys.executable, str(HERE), "--kernel", str(work), "--repeats", str(options.repeats),
        "--nodes", str(options.nodes), "--object-store", options.object_store,
        "--poll-interval", str(options.poll_interval), "--modes", *options.modes,
    ]  # fmt: skip
    if options.deps:
        argv += ["--deps", options.deps]
    if options.away:
        argv += ["--away"]
    if options.before:
        argv += ["--before", options.before]
    script = "\n".join(
        [
            "#!/bin/bash",
            "#SBATCH --job-name=jsr-bench-kernel --nodes=1 --cpus-per-task=1 --mem=4G",
            f"#SBATCH --nodelist=node1 --time=30 --output={work}/kernel.out",
            f"export PYTHONPATH={shlex.quote(code)}"
            + (f":{shlex.quote(options.deps)}" if options.deps else ""),
            "exec " + shlex.join(argv),
        ]
    )
    path = work / "kernel.sbatch"
    subprocess.run(
        [*as_user, "sh", "-c", 'cat > "$1"', "sh", str(path)], input=script, text=True, check=True
    )
    login = [f"HOME=/home/{USER}", f"USER={USER}", "PATH=/usr/local/bin:/usr/bin:/bin"]
    done = subprocess.run(
        [*as_user, "env", "-i", *login, "sbatch", "--parsable", str(path)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout.strip().split(";")[0], work


def wait_for_result(job: str, work: Path, timeout: float) -> list[dict]:
    deadline = time.monotonic() + timeout
    result = work / "result.json"
    while not result.exists():
        queued = subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True)
        if not queued.stdout.strip() and not result.exists():
            out = (work / "kernel.out").read_text() if (work / "kernel.out").exists() else ""
            raise SystemExit(f"the kernel's job {job} ended without a result:\n{out[-4000:]}")
        if time.monotonic() > deadline:
            raise SystemExit(f"no result from job {job} within {timeout:g} s")
        time.sleep(2)
    return json.loads(result.read_text())


def median(runs: list[dict], *keys: str) -> float | None:
    values = []
    for run in runs:
        value: Any = run
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, (int, float)):
            values.append(float(value))
    return statistics.median(values) if values else None


def report(runs: list[dict]) -> dict[str, Any]:
    """The medians per mode, Ray Client's as ratios against driver mode's, printed."""
    by_mode: dict[str, list[dict]] = {}
    for run in runs:
        by_mode.setdefault(run["mode"], []).append(run)
    rows = [
        ("connect after the head answers (s)", ("connect", "connected (state)")),
        ("  connect step: started", ("connect", "connect step: started")),
        ("  connect step: read", ("connect", "connect step: read")),
        ("  connect step: chosen", ("connect", "connect step: chosen")),
        ("  connect step: imported", ("connect", "connect step: imported")),
        ("  connect step: connected", ("connect", "connect step: connected")),
        ("  driver node starting (event)", ("connect", "event: driver_starting")),
        ("  driver node joined (event)", ("connect", "event: driver_joined")),
        ("ray.put 1 GiB (s)", ("put_get_1gib", "put")),
        ("ray.get 1 GiB (s)", ("put_get_1gib", "get")),
        ("ray.tune, 3 trials x 5 reports (s)", ("tune", "seconds")),
        ("ray.train, 2 workers x 3 reports (s)", ("train", "seconds")),
    ]
    table: dict[str, dict[str, float | None]] = {}
    modes = list(by_mode)
    print(f"medians of {max(len(r) for r in by_mode.values())} interleaved runs per mode")
    print(f"{'':40s}" + "".join(f"{m:>18s}" for m in modes) + "   client/driver")
    for label, keys in rows:
        values = {mode: median(by_mode[mode], *keys) for mode in modes}
        table[label] = values
        cells = "".join(f"{v:18.2f}" if v is not None else f"{'—':>18s}" for v in values.values())
        base, other = values.get("driver"), values.get("client")
        ratio = f"{other / base:8.2f}" if base and other is not None else ""
        print(f"{label:40s}{cells}   {ratio}")
    for mode, mode_runs in by_mode.items():
        for run in mode_runs:
            for what in ("put_get_1gib", "tune", "train"):
                error = (run.get(what) or {}).get("error")
                if error:
                    print(f"{mode}: {what} failed: {error}")
            if run.get("error"):
                print(f"{mode}: the run failed: {run['error']}")
        reasons = {run.get("connect_reason") for run in mode_runs}
        print(f"{mode}: connected as {', '.join(sorted(str(r) for r in reasons))}")
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument(
        "--modes", nargs="+", choices=("driver", "client", "auto"), default=list(MODES),
        help="the connect settings to run, interleaved (auto: the default's own choice)",
    )  # fmt: skip
    parser.add_argument("--object-store", default="1500M", help="object_store_memory per node")
    parser.add_argument("--poll-interval", type=float, default=1.0, help="the cluster's")
    parser.add_argument("--deps", default="/tmp/jsr-driver-tune", help="ray[tune]'s packages")
    parser.add_argument("--before", help="another checkout of the package (Ray Client only)")
    parser.add_argument(
        "--away", action="store_true",
        help="the cluster avoids the kernel's node (node1): in driver mode the kernel's host "
        "is then a Ray node of its own; by default the head shares node1 with the kernel",
    )  # fmt: skip
    parser.add_argument("--kernel", help=argparse.SUPPRESS)  # in the job: the work dir
    parser.add_argument("--timeout", type=float, default=1800)
    options = parser.parse_args()
    if options.away and options.nodes > 2:
        parser.error("--away leaves the testbed's node2 and node3 only: --nodes 2 at most")
    if options.deps and not Path(options.deps).is_dir():
        options.deps = ""
    if options.kernel:
        kernel(options)
        return
    from benchmarks.results import write_result

    job, work = submit(options)
    print(f"kernel job {job}, work dir {work}", flush=True)
    try:
        runs = wait_for_result(job, work, options.timeout)
    finally:
        subprocess.run(["scancel", job], check=False)
    table = report(runs)
    name = "driver_vs_client_before" if options.before else "driver_vs_client"
    write_result(
        name, {"medians": table, "runs": runs, "nodes": options.nodes, "away": options.away}
    )
    subprocess.run(["rm", "-rf", "--", str(work)], check=False)


if __name__ == "__main__":
    main()
