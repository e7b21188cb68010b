"""``doctor`` and the kernel's own Python on the real testbed (issue 10, items 1 and 4).

- ``jupyter slurm-ray doctor`` as alice (``runuser``), in a child process as from a terminal:
  on the healthy testbed every check passes (the test job really ran on a node and was
  cancelled); each broken setting in turn gives exactly its one ✗ with its fix: a Python
  without Ray, a Python whose Ray is another version (a wrapper in a directory the nodes see),
  a bad ``network_interface``, a job dir root on a tmpfs only the login side mounts (a mount
  namespace of its own: the nodes, started by slurmd, see the empty directory beneath), a
  walltime over the partition's MaxTime.
- A fresh kernel with only ``%slurm_ray up -N 2 -t 10`` (no python, no setup, no profile)
  reaches CONNECTED on this venv's Python.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from jupyter_slurm_ray.client.connect import local_versions
from jupyter_slurm_ray.doctor.checklist import _TITLES

from .helpers.ipyshell import *  # noqa: F403  (the fixtures ipython_shell and magic)
from .helpers.ipyshell import MagicShell
from .helpers.jobs import in_queue
from .helpers.paths import NODES_SEE, VENV_PYTHON, child_environment
from .helpers.site import cancel_recorded_jobs, configured_site
from .helpers.testbed import USER, node_ip, runuser
from .test_containers import IMAGE, needs_image

pytestmark = [pytest.mark.testbed, pytest.mark.ray]

CHECKS = [
    "ssh", "slurm", "request", "job_dir", "test_job", "python", "ray", "libraries", "address",
]  # fmt: skip


@pytest.fixture
def site_env(tmp_path: Path, testbed) -> dict[str, str]:
    """A terminal's environment on the login node: Slurm as alice, nothing else configured."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER_SLURM_RAY_")}
    environ.update(
        JUPYTER_SLURM_RAY_STATE_DIR=str(tmp_path / "state"),
        JUPYTER_SLURM_RAY_COMMAND_PREFIX=" ".join(runuser(USER)),
        JUPYTER_SLURM_RAY_PROFILES_FILE=str(tmp_path / "no-profiles.toml"),
    )
    return environ


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every node sees and alice can read (pytest's tmp dirs are root's, 0700)."""
    path = Path(tempfile.mkdtemp(prefix="jsr-doctor-", dir=NODES_SEE))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def doctor(environ: dict[str, str], *args: str, wrap: list[str] | None = None) -> dict:
    """``jupyter slurm-ray doctor --json ARGS`` (under ``wrap``); its JSON, with its status."""
    argv = [sys.executable, "-m", "jupyter_slurm_ray.ui.cli", "doctor", "--json", *args]
    done = subprocess.run(
        [*(wrap or []), *argv], env=environ, capture_output=True, text=True, timeout=400
    )
    assert done.stdout.strip(), done.stderr
    report = json.loads(done.stdout)
    report["exit_status"] = done.returncode
    job_id = report["test_job"]["job_id"]
    if job_id:  # the test job is always cancelled
        assert not in_queue(job_id) or _cancelled(job_id), f"test job {job_id} left running"
    return report


def _cancelled(job_id: str) -> bool:
    state = subprocess.run(
        ["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"], capture_output=True, text=True
    ).stdout.strip()
    return state in ("", "CANCELLED", "COMPLETING", "COMPLETED")


def failures(report: dict) -> dict[str, dict]:
    return {c["name"]: c for c in report["checks"] if c["status"] == "fail"}


def statuses(report: dict) -> dict[str, str]:
    return {c["name"]: c["status"] for c in report["checks"]}


def test_the_healthy_testbed_passes_every_check(site_env):
    report = doctor(site_env, "-t", "10")
    assert report["exit_status"] == 0 and failures(report) == {}, report
    seen = statuses(report)
    assert seen["ssh"] == "skip"  # Slurm runs here: SSH not used
    ray = next(c for c in report["checks"] if c["name"] == "ray")
    if ray["status"] == "warn":  # a busy testbed: the one warning its load can cause
        assert "(slow: each of Ray's" in ray["detail"], ray
        seen["ray"] = "ok"
    assert all(seen[name] == "ok" for name in CHECKS if name != "ssh"), report
    job = report["test_job"]
    assert job["node"].startswith("node") and job["queue_wait"] is not None
    assert job["import_ray_seconds"] is not None
    python = next(c for c in report["checks"] if c["name"] == "python")
    assert str(VENV_PYTHON) in python["detail"]  # this kernel's Python, python not set
    print(f"\ndoctor: {report['checks'][4]['detail']}; import ray {job['import_ray_seconds']} s")


@pytest.fixture
def site(tmp_path: Path, testbed) -> Iterator[dict[str, str]]:
    """The testbed as a configured site (the magics' profile ``testbed``), for ``magic``."""
    with configured_site(tmp_path) as environment:
        yield environment


def printed_checklist(out: str) -> tuple[str, dict[str, str]]:
    """The checklist the magic printed: its headline, and each check's symbol by name."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("doctor ("))
    symbols = {}
    for line in lines[start + 1 :]:
        symbol, _, rest = line.partition(" ")
        symbols.update({name: symbol for name, title in _TITLES.items() if rest.startswith(title)})
    return lines[start], symbols


def test_the_magic_prints_the_checklist_with_every_check_passing(magic: MagicShell):
    out, err, error = magic.run("%slurm_ray doctor -t 10")
    assert error is None, err
    headline, symbols = printed_checklist(out)
    assert headline.endswith(": all checks passed"), out  # a warning is no failure
    assert "✗" not in out
    assert symbols["ssh"] == "–"  # Slurm runs here: SSH not used
    if symbols["ray"] == "!":  # a busy testbed: the one warning its load can cause
        assert "(slow: each of Ray's" in out, out
        symbols["ray"] = "✓"
    assert all(symbols[name] == "✓" for name in CHECKS if name != "ssh"), out
    job = re.search(r"test job (\d+) on (node\d+)", headline)
    assert job is not None, headline  # it really ran on a node, and was cancelled
    assert not in_queue(job[1]) or _cancelled(job[1]), f"test job {job[1]} left running"


def test_a_python_without_ray_is_the_one_failure(site_env, shared_dir):
    probe = subprocess.run(["/usr/bin/python3", "-c", "import ray"], capture_output=True)
    if probe.returncode == 0:
        pytest.skip("/usr/bin/python3 has ray here")
    report = doctor(site_env, "-t", "10", "--python", "/usr/bin/python3")
    assert report["exit_status"] == 1
    assert list(failures(report)) == ["ray"], report
    ray = failures(report)["ray"]
    assert "No module named 'ray'" in ray["detail"]
    assert f"ray[default]=={local_versions()[0]}" in ray["fix"]


def test_another_ray_version_is_the_one_failure(site_env, shared_dir):
    fake = shared_dir / "site" / "ray"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('__version__ = "2.59.0"\n')
    python = shared_dir / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={fake.parent} exec {VENV_PYTHON} "$@"\n')
    for path in (python, fake.parent, fake, fake / "__init__.py"):
        path.chmod(0o755)
    report = doctor(site_env, "-t", "10", "--python", str(python))
    assert list(failures(report)) == ["ray"], report
    ray = failures(report)["ray"]
    assert f"the node has Ray 2.59.0, this kernel Ray {local_versions()[0]}" in ray["detail"]
    assert "same Ray version" in ray["fix"]


def test_a_bad_network_interface_is_the_one_failure(site_env):
    environ = {**site_env, "JUPYTER_SLURM_RAY_NETWORK_INTERFACE": "ib0"}
    report = doctor(environ, "-t", "10")
    assert list(failures(report)) == ["address"], report
    address = failures(report)["address"]
    assert "network_interface ib0 has no IPv4 address" in address["detail"]
    subnet = node_ip(1).rpartition(".")[0]
    assert "set network_interface" in address["fix"] and f"eth0 {subnet}." in address["fix"]


def test_a_job_dir_root_only_the_login_side_mounts_is_the_one_failure(site_env, shared_dir):
    root = shared_dir / "login-only"
    root.mkdir()
    environ = {**site_env, "JUPYTER_SLURM_RAY_JOB_DIR_ROOT": f"{root}/jobs"}
    # a tmpfs in a mount namespace of its own: this doctor sees it, slurmd's jobs do not
    script = textwrap.dedent(
        """
        mount -t tmpfs -o mode=0755 jsr-doctor-login-only "$1" || exit 97
        mkdir "$1/jobs" && chown "$2" "$1/jobs" && chmod 700 "$1/jobs" || exit 98
        shift 2; exec "$@"
        """
    )
    wrap = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"]
    # python set: unset, it would be refused too (the venv is not on that root's filesystem)
    python = ["--python", str(VENV_PYTHON)]
    report = doctor(environ, "-t", "10", *python, wrap=[*wrap, str(root), USER])
    assert list(failures(report)) == ["job_dir"], report
    job_dir = failures(report)["job_dir"]
    assert f"{root}/jobs is not shared" in job_dir["detail"]
    assert "did not see the file written here" in job_dir["detail"]
    assert "set job_dir_root" in job_dir["fix"]


def test_a_walltime_over_the_partition_limit_is_the_one_failure(site_env):
    report = doctor(site_env, "-p", "short", "-t", "2:00:00")
    assert report["exit_status"] == 1
    assert list(failures(report)) == ["request"], report
    request = failures(report)["request"]
    assert "at most 00:30:00 in partition short (MaxTime=00:30:00)" in request["detail"]
    assert "time (-t)" in request["fix"]


def test_the_text_output_is_a_checklist(site_env):
    argv = [
        sys.executable,
        "-m",
        "jupyter_slurm_ray.ui.cli",
        "doctor",
        "-p",
        "short",
        "-t",
        "1:00:00",
    ]
    done = subprocess.run(argv, env=site_env, capture_output=True, text=True, timeout=400)
    lines = done.stdout.splitlines()
    assert done.returncode == 1 and lines[0].endswith("1 check(s) failed"), done.stdout
    assert any(line.startswith("✗ The request fits the site") for line in lines)
    assert any(line.strip().startswith("fix: ask for a time (-t)") for line in lines)
    passed = sum(line.startswith("✓ ") for line in lines)
    slow = sum(line.startswith("! Ray on the node") and "(slow: " in line for line in lines)
    assert passed + slow == 10, done.stdout  # with "submit" (sbatch is here); slow: a busy node
    # the job dirs are alice's (command_prefix), this process is root's: auto means Ray Client
    driver = next(line for line in lines if "The nodes reach this kernel" in line)
    assert driver.startswith("– ") and "auto connects with Ray Client from here" in driver
    assert "another user (command_prefix)" in done.stdout
    protections = next(line for line in lines if "Protections against other users" in line)
    assert protections.startswith("✓ ") and "TLS: Ray's channels" in protections
    assert re.search(r"\(OpenSSL \d+\.\d+\.\d+ on the node\)", protections), protections


# -- issue 10, item 1 -----------------------------------------------------------------------------
_FRESH_KERNEL = """
import json
from IPython.core.interactiveshell import InteractiveShell
from jupyter_slurm_ray.session import get_session
ip = InteractiveShell.instance()
ip.run_line_magic("load_ext", "jupyter_slurm_ray")
result = ip.run_cell("%slurm_ray up -N 2 -t 10")
cluster = get_session().current
state = cluster.state.value if cluster else None
nodes = None
if state == "CONNECTED":
    import ray
    nodes = len({n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]})
print("RESULT " + json.dumps({"state": state, "job_dir": cluster and cluster.job_dir,
                              "nodes": nodes, "spec_python": cluster and cluster.spec.python}),
      flush=True)
if cluster is not None:
    ip.run_cell("%slurm_ray down")
"""


def test_a_fresh_kernel_with_only_up_reaches_connected_on_its_own_python(site_env, tmp_path):
    environ = child_environment(
        {k: v for k, v in site_env.items() if k.startswith("JUPYTER_SLURM_RAY_")}
    )
    for name in ("JUPYTER_SLURM_RAY_PYTHON", "JUPYTER_SLURM_RAY_SETUP"):
        environ.pop(name, None)
    try:
        done = subprocess.run(
            [str(VENV_PYTHON), "-c", _FRESH_KERNEL],
            env=environ,
            capture_output=True,
            text=True,
            timeout=420,
        )
    finally:
        cancel_recorded_jobs(Path(site_env["JUPYTER_SLURM_RAY_STATE_DIR"]))
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(line.removeprefix("RESULT "))
    assert result["spec_python"] is None  # nothing set
    assert result["state"] == "CONNECTED" and result["nodes"] == 2, done.stdout + done.stderr
    events = Path(result["job_dir"], "events.jsonl").read_text().splitlines()
    started = next(json.loads(e) for e in events if '"bootstrap"' in e)
    assert started["python"] == str(VENV_PYTHON)  # the kernel's own interpreter ran the job


@needs_image
@pytest.mark.host_stack
def test_a_container_clusters_doctor_checks_ray_in_the_image(site_env):
    report = doctor(site_env, "-t", "10", "--container", IMAGE)
    assert report["exit_status"] == 0 and failures(report) == {}, report
    checks = {c["name"]: c for c in report["checks"]}
    assert f"Ray's in the image {IMAGE}" in checks["python"]["detail"]
    assert f"Ray {local_versions()[0]}, as here" in checks["ray"]["detail"]


@needs_image
@pytest.mark.host_stack
def test_a_container_image_missing_on_the_nodes_is_the_one_failure(site_env):
    report = doctor(site_env, "-t", "10", "--container", "/nonexistent/image.sif")
    assert list(failures(report)) == ["ray"], report
    ray = failures(report)["ray"]
    assert "the image /nonexistent/image.sif does not exist on node" in ray["detail"]
    assert "rebuild the image /nonexistent/image.sif" in ray["fix"]


def test_a_packed_clusters_doctor_checks_the_packs_base_python_on_the_node(site_env):
    report = doctor(site_env, "-t", "10", "--environment", "pack")
    assert report["exit_status"] == 0 and failures(report) == {}, report
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["python"]["detail"].startswith("python3 (runs the bootstrap; Ray from the pack)")
    base = os.path.realpath(VENV_PYTHON)
    assert f"its base Python {base} (" in checks["ray"]["detail"], checks["ray"]
