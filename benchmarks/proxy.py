"""Cost of the authenticated dashboard proxy, against the Ray head reached directly.

One run, one cluster (one node, one CPU) and one Jupyter server subprocess:

- latency of ``api/cluster_status`` and of the dashboard index, through the proxy's two routes
  and direct to the head (medians of interleaved rounds, and the proxy/direct ratio);
- requests per second through the proxy with 8 concurrent clients;
- the Jupyter server process's memory (RSS, PSS) before and after 1,000 proxied requests;
- a large log download (Ray's ``api/v0/logs/file``, 200 MB by default) direct and through the
  page route: MB/s of each, and the server's peak RSS growth while it streams.

Run on the testbed's login node:
    scripts/testbed exec -- /opt/jupyter-slurm-ray/venv/bin/python benchmarks/proxy.py
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urljoin

import psutil
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.results import write_result
from jupyter_slurm_ray.aio import run_sync
from tests.helpers.server import head_of, jupyter_server, start_cluster


def median_ms(fetch: Callable[[], requests.Response], repeats: int) -> float:
    fetch().raise_for_status()  # warm-up: connection, target cache
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        response = fetch()
        samples.append(time.perf_counter() - started)
        response.raise_for_status()
    return statistics.median(samples) * 1000


def throughput(url: str, headers: dict[str, str], clients: int, seconds: float) -> float:
    """Requests per second with ``clients`` connections: by wrk (one thread; its CPU cost is
    small beside the servers'), else by as many Python threads (their own CPU cost, on a small
    machine, then shows in the figures)."""
    if shutil.which("wrk"):
        return wrk_rate(url, headers, clients, seconds)
    return threads_rate(url, headers, clients, seconds)


def wrk_rate(url: str, headers: dict[str, str], clients: int, seconds: float) -> float:
    argv = ["wrk", "-t1", f"-c{clients}", f"-d{seconds:g}s"]
    for name, value in headers.items():
        argv += ["-H", f"{name}: {value}"]
    out = subprocess.run([*argv, url], capture_output=True, text=True, check=True).stdout
    if "Non-2xx" in out:
        raise RuntimeError(f"wrk got errors from {url}:\n{out}")
    match = re.search(r"Requests/sec:\s+([0-9.]+)", out)
    if match is None:
        raise RuntimeError(f"no rate in wrk's output:\n{out}")
    return float(match.group(1))


def threads_rate(url: str, headers: dict[str, str], clients: int, seconds: float) -> float:
    """Requests per second completed by ``clients`` threads, each with its own session."""
    done = [0] * clients
    stop = time.monotonic() + seconds

    def client(index: int) -> None:
        with requests.Session() as session:
            while time.monotonic() < stop:
                session.get(url, headers=headers, timeout=30).raise_for_status()
                done[index] += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(done) / (time.monotonic() - started)


def sandboxed_url(server, cluster_id: str) -> str:
    """The capability URL a logged-in user's dashboard tab is given (ends with a slash)."""
    minted = requests.post(
        f"{server.url}slurm-ray/dashboard-links/{cluster_id}", headers=server.headers(), timeout=30
    )
    minted.raise_for_status()
    return urljoin(server.url, minted.json()["url"])


def memory_mb(pid: int) -> tuple[float, float]:
    info = psutil.Process(pid).memory_full_info()
    return info.rss / 2**20, info.pss / 2**20


def main(
    repeats: int,
    requests_for_memory: int,
    seconds: float,
    rounds: int,
    settle: float,
    download_mb: int,
) -> None:
    user = os.environ["JSR_USER"]
    with tempfile.TemporaryDirectory(prefix="jsr-bench-") as tmp:
        root = Path(tmp)
        cluster = start_cluster(root / "state", user, "bench")
        try:
            with jupyter_server(root, user) as server:
                run(
                    server,
                    cluster,
                    repeats,
                    requests_for_memory,
                    seconds,
                    rounds,
                    settle,
                    download_mb,
                )
        finally:
            cluster.down()


def cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def run(
    server,
    cluster,
    repeats: int,
    requests_for_memory: int,
    seconds: float,
    rounds: int,
    settle: float,
    download_mb: int,
) -> None:
    """Every figure measured ``rounds`` times, the routes interleaved in each round (the
    machine's speed drifts by tens of percent within a minute here): medians of the rounds."""
    figures: dict[str, object] = {"repeats": repeats, "rounds": rounds}
    time.sleep(settle)  # a new head's agents use a core for its first minute or so
    head = head_of(cluster)
    proxied = f"{server.url}slurm-ray/dashboard/{cluster.id}/"
    jupyter = server.headers()
    sandboxed = sandboxed_url(server, cluster.id)
    proxy_session, direct_session = requests.Session(), requests.Session()
    print(f"cluster {cluster.id} (job {cluster.job_id}), head {head.url}, proxy {proxied}")
    routes = {
        "direct": (direct_session, head.url, head.headers()),
        "page": (proxy_session, sandboxed, {}),
        "token": (proxy_session, proxied, jupyter),
    }
    print(f"{'':20}{'direct ms':>10}{'page ms':>10}{'ratio':>7}{'token ms':>10}{'ratio':>7}")
    print(
        f"   (medians of {rounds} rounds of {repeats} requests each, the routes interleaved; "
        "ratio = proxy / direct; page: the sandboxed capability URL the dashboard tab uses; "
        "token: the script's route with Jupyter's token)"
    )
    for path in ("api/cluster_status", ""):
        samples: dict[str, list[float]] = {name: [] for name in routes}
        for _ in range(rounds):
            for name, (session, root, headers) in routes.items():
                fetch = lambda s=session, u=root + path, h=headers: s.get(u, headers=h)  # noqa: E731
                samples[name].append(median_ms(fetch, repeats))
        direct, page, through = (statistics.median(samples[n]) for n in routes)
        label = path or "index.html"
        print(
            f"{label:20}{direct:10.2f}{page:10.2f}{page / direct:7.2f}"
            f"{through:10.2f}{through / direct:7.2f}"
        )
        figures[label] = {"direct_ms": direct, "page_ms": page, "proxy_ms": through}
    # what any request through Jupyter costs: an authenticated no-op of Jupyter's own API
    status_url = server.url + "api/status"
    floor = median_ms(lambda: proxy_session.get(status_url, headers=jupyter), repeats)
    print(f"{'jupyter api/status':20}{'':10}{floor:10.2f}   (Jupyter's own cost, no proxying)")
    figures["jupyter api/status ms"] = floor
    rates: dict[str, list[float]] = {name: [] for name in routes}
    proxy_cpu: list[float] = []
    for _ in range(rounds):
        for name, (_, root, headers) in routes.items():
            before = cpu_seconds(server.proc.pid)
            rate = throughput(root + "api/cluster_status", headers, 8, seconds)
            rates[name].append(rate)
            if name == "page":
                proxy_cpu.append((cpu_seconds(server.proc.pid) - before) / (rate * seconds))
    direct_rate, page_rate, rate = (statistics.median(rates[n]) for n in routes)
    print(
        f"8 clients ({'wrk' if shutil.which('wrk') else 'Python threads'}), {seconds:g} s, "
        f"api/cluster_status: {direct_rate:.0f} req/s direct, "
        f"{page_rate:.0f} through the page's route ({page_rate / direct_rate:.2f}), "
        f"{rate:.0f} through the token route ({rate / direct_rate:.2f}); the Jupyter server's "
        f"CPU per request on the page's route {statistics.median(proxy_cpu) * 1000:.2f} ms"
    )
    figures["8 clients req/s"] = {"proxy": rate, "page": page_rate, "direct": direct_rate}
    figures["page route server CPU ms per request"] = statistics.median(proxy_cpu) * 1000
    figures["load generator"] = "wrk -t1" if shutil.which("wrk") else "Python threads"
    before_mb = memory_mb(server.proc.pid)
    for i in range(requests_for_memory):
        path = "api/cluster_status" if i % 2 else ""
        proxy_session.get(proxied + path, headers=jupyter).raise_for_status()
    after_mb = memory_mb(server.proc.pid)
    print(
        f"server memory before/after {requests_for_memory} proxied requests: "
        f"RSS {before_mb[0]:.1f} -> {after_mb[0]:.1f} MB, "
        f"PSS {before_mb[1]:.1f} -> {after_mb[1]:.1f} MB"
    )
    figures["server RSS MB"] = {"before": before_mb[0], "after": after_mb[0]}
    if download_mb:
        figures["download"] = download(server, cluster, head, sandboxed, download_mb)
    write_result("proxy", figures)


def download(server, cluster, head, sandboxed: str, size_mb: int) -> dict[str, float]:
    """A log file of ``size_mb`` MB written in the head's log dir by the cluster's user,
    downloaded direct and through the page route (each once; the server's peak RSS sampled)."""
    connection = json.loads(
        run_sync(cluster.transport.read_file(f"{cluster.job_dir}/connection.json"))
    )
    path = f"{connection['temp_dir']}/session_latest/logs/jsr-bench-download.log"
    line = "a line of the head's log, 0123456789 abcdefghijklmnopqrstuvwxyz"
    script = 'yes "$1" | head -c "$2" > "$3"'
    run_sync(cluster.transport.run(["sh", "-c", script, "sh", line, str(size_mb * 10**6), path]))
    query = (
        f"api/v0/logs/file?node_ip={head.info.head_ip}&filename={path.rsplit('/', 1)[1]}&lines=-1"
    )
    try:
        direct_s, _ = timed_download(head.url + query, head.headers(), None)
        page_s, growth = timed_download(sandboxed + query, {}, server.proc.pid)
    finally:
        run_sync(cluster.transport.run(["rm", "-f", "--", path]))
    direct, page = size_mb / direct_s, size_mb / page_s
    print(
        f"{size_mb} MB log download: {direct:.0f} MB/s direct, {page:.0f} MB/s through the "
        f"page route ({page / direct:.2f}); the server's RSS grew by {growth:.1f} MB at most"
    )
    return {"direct MB/s": direct, "page MB/s": page, "server RSS growth MB": growth}


def timed_download(url: str, headers: dict[str, str], pid: int | None) -> tuple[float, float]:
    """Seconds to read the whole answer, and (with ``pid``) that process's peak RSS growth."""
    baseline = peak = psutil.Process(pid).memory_info().rss if pid else 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while pid and not done.wait(0.02):
            peak = max(peak, psutil.Process(pid).memory_info().rss)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.perf_counter()
    with requests.get(url, headers=headers, stream=True, timeout=60) as response:
        response.raise_for_status()
        for _ in response.iter_content(chunk_size=2**20):
            pass
    seconds = time.perf_counter() - started
    done.set()
    sampler.join()
    return seconds, (peak - baseline) / 2**20


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settle", type=float, default=45.0, help="seconds before measuring")
    parser.add_argument("--download-mb", type=int, default=200, help="0: no download")
    args = parser.parse_args()
    main(args.repeats, args.requests, args.seconds, args.rounds, args.settle, args.download_mb)
