"""``%slurm_ray`` in a real IPython shell against the testbed, plus a second real kernel.

One cluster is started by this shell's ``up`` and shared by the tests that read it; a second one
is started by another kernel (``%%slurm_ray up --detach``) to show ``list`` across kernels and
``attach`` after that kernel restarts. The argument handling, ``config`` and ``script`` are
tested on a scripted Slurm in tests/fast/test_magics.py.
"""

from __future__ import annotations

import contextlib
import io
import re
import time
import uuid
from collections.abc import Iterator

import psutil
import pytest
from IPython.testing.globalipapp import start_ipython

from jupyter_slurm_ray import session as session_module
from jupyter_slurm_ray.client.rayinit import NoClusterError
from jupyter_slurm_ray.naming import DASHBOARD_BASE_ENV
from jupyter_slurm_ray.registry import Registry
from jupyter_slurm_ray.ui.clientlimits import ray_data_through_client
from jupyter_slurm_ray.ui.magics import SlurmRayMagics

from .helpers.ipyshell import one_line_error
from .helpers.jobs import batch_script, job_fields, jobs_named
from .helpers.notebook import NotebookKernel as Kernel
from .helpers.site import configured_site
from .helpers.testbed import USER, node_ip_pattern
from .helpers.waiting import wait_for

pytestmark = pytest.mark.testbed


def get_ipython():
    """The test shell (IPython's global test app; ``start_ipython`` returns it only once)."""
    from IPython.core.interactiveshell import InteractiveShell

    start_ipython()
    return InteractiveShell.instance()


class Shell:
    """An IPython shell with the magics loaded; ``run`` returns (stdout, stderr, error)."""

    def __init__(self) -> None:
        self.ip = get_ipython()
        session_module._session = None  # a fresh kernel session for this module
        self.magics = SlurmRayMagics(self.ip)
        self.ip.register_magics(self.magics)

    def run(self, cell: str, capfd) -> tuple[str, str, BaseException | None]:
        capfd.readouterr()
        result = self.ip.run_cell(cell)
        out, err = capfd.readouterr()
        return out, err, result.error_in_exec


@pytest.fixture(scope="module")
def site(tmp_path_factory, testbed) -> Iterator[dict[str, str]]:
    with configured_site(tmp_path_factory.mktemp("site")) as environment:
        yield environment


@pytest.fixture(scope="module")
def shell(site) -> Iterator[Shell]:
    shell = Shell()
    shell.ip.run_cell('%config SlurmRay.default_profile = "testbed"')
    yield shell
    shell.ip.run_cell("%config SlurmRay.default_profile = None")
    session_module._session = None


@pytest.fixture
def run(shell: Shell, capfd):
    return lambda cell: shell.run(cell, capfd)


@pytest.fixture
def name() -> str:
    return "m" + uuid.uuid4().hex[:8]


# -- Slurm's own refusal --------------------------------------------------------------------
def test_a_request_sbatch_refuses_is_one_line_and_submits_nothing(run, name):
    _, err, error = run(f"%slurm_ray up --name {name} -C fast")
    assert "Invalid feature specification" in one_line_error(err)  # sbatch's words, in one line
    assert error is not None
    assert jobs_named(name) == []
    assert [r for r in Registry().all() if r.name == name] == []


def test_connect_driver_where_it_cannot_work_is_refused_before_anything_is_submitted(run, name):
    started = time.monotonic()
    _, err, error = run(f"%slurm_ray up --name {name} --connect driver")
    line = one_line_error(err)
    assert "connect = driver is not possible here" in line and "another user" in line, line
    assert "nothing was submitted" in line and error is not None
    assert time.monotonic() - started < 5  # not after a job's start
    assert jobs_named(name) == []
    assert [r for r in Registry().all() if r.name == name] == []


def ray_started_here() -> list[str]:
    """Ray's own daemons among this process's descendants: a Ray started on this host."""
    daemons = ("gcs_server", "raylet")
    return [p.name() for p in psutil.Process().children(recursive=True) if p.name() in daemons]


def one_line_ray_refusal(out: str, error: BaseException | None) -> str:
    """The one line a refused ``ray.init()`` shows in the shell (no traceback)."""
    assert isinstance(error, NoClusterError), error
    lines = [line for line in out.splitlines() if line.strip()]
    assert lines == [f"NoClusterError: {error}"], out
    return lines[0]


def test_ray_init_with_no_cluster_connected_is_one_line_and_starts_no_ray_here(run):
    out, _, error = run("import ray\nray.init()")
    assert "%slurm_ray up" in one_line_ray_refusal(out, error)
    # Ray's own automatic ray.init() (a task's .remote()) meets the same line
    out, _, error = run("@ray.remote\ndef one():\n    return 1\none.remote()")
    one_line_ray_refusal(out, error)
    assert ray_started_here() == []


# -- one cluster started by this shell --------------------------------------------------------
@pytest.fixture(scope="module")
def started(shell: Shell, site) -> Iterator[dict]:
    """``up`` with every Slurm short option the testbed accepts, connected."""
    name = "m" + uuid.uuid4().hex[:8]
    started = time.monotonic()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        result = shell.ip.run_cell(
            f"%slurm_ray up -N 1 -p debug -t 10 -A physics -q normal -c 1 --mem 1500M -G 1 "
            f"--name {name}"
        )
    assert result.error_in_exec is None, result.error_in_exec
    cluster = shell.magics.session.current
    seconds = time.monotonic() - started
    info = {"name": name, "cluster": cluster, "seconds": seconds, "out": printed.getvalue()}
    yield info
    if not cluster.state.is_final:
        cluster.down()


def test_up_ends_connected_and_asks_slurm_for_the_options(started):
    import ray

    cluster = started["cluster"]
    assert cluster.state.value == "CONNECTED"
    job = job_fields(cluster.job_id)
    assert job["JobName"] == started["name"] and job["Partition"] == "debug"
    assert job["TimeLimit"] == "00:10:00" and job["NumNodes"] == "1"
    assert job["Account"] == "physics"
    # Without accounting, Slurm keeps no QOS; the script Slurm got shows it was asked for.
    assert "#SBATCH --qos=normal" in batch_script(cluster.job_id).splitlines()
    assert job["MinMemoryNode"] == "1500M" and job["CPUs/Task"] == "1"
    assert "gpu:1" in job["TresPerNode"]
    assert ray.cluster_resources()["GPU"] == 1
    assert ray.get(ray.remote(lambda: 6 * 7).remote()) == 42


def test_up_printed_each_state_in_order_as_text_in_a_terminal(started):
    printed = re.findall(r"^\[ *[0-9.]+s\] ([A-Z]+)", started["out"], re.M)
    seen = list(dict.fromkeys(printed))
    order = ["SUBMITTING", "PENDING", "STARTING", "READY", "CONNECTED"]
    assert seen == [state for state in order if state in seen], started["out"]
    assert {"PENDING", "STARTING", "CONNECTED"} <= set(seen), started["out"]
    assert f"{started['name']} (" in started["out"].splitlines()[-2]  # the summary line


def test_ray_init_after_up_means_the_cluster_and_starts_nothing_here(started, run):
    cell = (
        "import ray, socket\n"
        "first = ray.init()\n"
        "again = ray.init('auto', ignore_reinit_error=True)\n"
        "@ray.remote\n"
        "def where():\n"
        "    return socket.gethostname()\n"
        "host = ray.get(where.remote())\n"
    )
    _, _, error = run(cell)
    assert error is None, error
    namespace = get_ipython().user_ns
    assert namespace["first"] is namespace["again"]
    assert re.fullmatch(r"node\d", namespace["host"]), namespace["host"]
    assert ray_started_here() == []


def test_ray_data_through_ray_client_says_why_and_how_to_get_a_driver(started, run):
    out, _, error = run("import ray.data\nray.data.range(10).show(2)")
    assert isinstance(error, AttributeError)  # Ray's own, from inside ray/data
    assert ray_data_through_client(started["name"]) in out.splitlines(), out
    assert "(Ray's error: AttributeError:" in out and "Traceback" not in out
    # an error of the user's own is shown as IPython shows it
    out, _, error = run("{}['missing']")
    assert isinstance(error, KeyError) and "Ray Data" not in out and "KeyError" in out


def test_tune_through_ray_client_keeps_its_results_on_the_clusters_side(started, run):
    cell = (
        "from ray import tune\n"
        "def trial(config):\n"
        "    return {'score': config['x']}\n"
        "tuner = tune.Tuner(\n"
        "    trial,\n"
        "    param_space={'x': tune.grid_search([1, 2])},\n"
        "    run_config=tune.RunConfig(name='two-trials'),\n"
        ")\n"
        "best = tuner.fit().get_best_result(metric='score', mode='max')\n"
    )
    _, _, error = run(cell)
    assert error is None, error  # not PermissionError: '/root/ray_results'
    best = get_ipython().user_ns["best"]
    assert best.metrics["score"] == 2
    assert best.path.startswith(f"/home/{USER}/ray_results/two-trials/"), best.path  # job user's


def test_status_asks_slurm_and_shows_the_cluster(started, run):
    out, _, error = run("%slurm_ray status")
    assert error is None
    assert f"SlurmRayCluster {started['name']}" in out
    assert f"CONNECTED · job {started['cluster'].job_id}" in out
    out, _, _ = run(f"%slurm_ray status {started['cluster'].job_id}")
    assert started["name"] in out


def test_logs_show_the_job_output_and_a_nodes_ray_log(started, run):
    out, _, error = run("%slurm_ray logs --tail 5")
    assert error is None and "==> slurm-" in out and "ready" in out
    assert len([line for line in out.splitlines() if not line.startswith("==>")]) <= 10
    node = started["cluster"].status.nodes[0]
    out, _, error = run(f"%slurm_ray logs {started['name']} --node {node} --tail 3")
    assert error is None and f"ray-head-{node}.log" in out


def test_dashboard_gives_a_link(started, run):
    out, _, error = run("%slurm_ray dashboard")
    assert error is None
    assert re.search(rf"direct: https://{node_ip_pattern()}:\d+/", out)  # the head's relay
    # no Jupyter server runs this kernel: where to get a link that works without the token
    assert f"`jupyter slurm-ray dashboard {started['name']}` serves the dashboard" in out


def test_disconnect_then_connect(started, run):
    import ray

    out, _, error = run("%slurm_ray disconnect")
    assert error is None and "READY" in out and not ray.is_initialized()
    out, _, error = run(f"%slurm_ray connect {started['name']}")
    assert error is None and "CONNECTED" in out
    assert ray.get(ray.remote(lambda: "again").remote()) == "again"


def test_a_second_connection_is_refused_in_one_line(started, run, name):
    _, err, _ = run(f"%slurm_ray up --name {name}")
    assert "allows one connection per process" in one_line_error(err)
    assert jobs_named(name) == []


# -- a second kernel --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def other(site, testbed) -> Iterator[dict]:
    """A cluster started, detached, by another kernel with ``%%slurm_ray up`` and setup lines."""
    kernel = Kernel()
    name = "k" + uuid.uuid4().hex[:8]
    try:
        kernel.run("%load_ext jupyter_slurm_ray")
        started = time.monotonic()
        out = kernel.run(
            f"%%slurm_ray up --profile testbed --name {name} --detach\n"
            'echo "setup line ran on $(hostname)"\n'
        )
        seconds = time.monotonic() - started
        pid = int(kernel.run("import os; print(os.getpid())"))
        yield {"kernel": kernel, "name": name, "out": out, "pid": pid, "seconds": seconds}
    finally:
        kernel.stop()


def test_cell_body_lines_run_as_setup_before_ray(other, run):
    assert "CONNECTED" in other["out"]
    assert "SIGTERM" not in other["out"]  # Ray's warning when it connects off the main thread
    out, _, error = run(f"%slurm_ray logs {other['name']}")
    assert error is None
    assert re.search(r"setup line ran on node\d", out)


def test_list_shows_a_cluster_started_by_another_kernel(other, started, run):
    out, _, error = run("%slurm_ray list")
    assert error is None
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:]}
    assert rows[other["name"]][3] == "CONNECTED"
    assert "detached" in " ".join(rows[other["name"]][5:])
    assert rows[started["name"]][3] == "CONNECTED"
    assert "this process" in " ".join(rows[started["name"]])


def test_attach_after_a_kernel_restart_reconnects_to_the_detached_cluster(other):
    kernel = other["kernel"]
    job_id = Registry().find(other["name"]).job_id
    kernel.restart()
    assert int(kernel.run("import os; print(os.getpid())")) != other["pid"]
    assert jobs_named(other["name"]) == [job_id]  # the restart did not cancel it
    # as a Jupyter server with the extension starts its kernels: the dashboard's proxied path
    base = "/user/alice/slurm-ray/dashboard/"
    kernel.run(f"import os; os.environ[{DASHBOARD_BASE_ENV!r}] = {base!r}")
    kernel.run("%load_ext jupyter_slurm_ray")
    out = kernel.run(f"%slurm_ray attach {job_id}")
    assert "CONNECTED" in out, out
    out = kernel.run(  # a Ray example's own ray.init() in a real kernel: the attached cluster
        "import ray, socket\nray.init()\n"
        "print(ray.get(ray.remote(lambda: socket.gethostname()).remote()))"
    )
    assert re.fullmatch(r"node\d\n", out), out
    # Ray's own view of it links the dashboard where the server proxies it, not the head
    cluster_id = Registry().find(other["name"]).id
    proxied = f"{base}{cluster_id}/"
    out = kernel.run("context = ray.init()\nprint(context.dashboard_url)")
    assert out == proxied + "\n", out
    assert f'href="{proxied}"' in kernel.run("print(context._repr_html_())")
    table = kernel.run("print(context._context_table_template())")  # Ray's, as it shows it
    assert "Dashboard:" in table and "http://" not in table, table


def test_interrupting_a_cell_cancels_the_ray_tasks_it_waits_for(other):
    kernel = other["kernel"]  # a real kernel, attached through Ray Client
    kernel.run(
        "import ray, time\n"
        "@ray.remote(num_cpus=0)\n"
        "def slow():\n"
        "    time.sleep(300)\n"
        "refs = [slow.remote() for _ in range(2)]\n"
    )
    status, printed = kernel.run_interrupted("ray.get(refs)", after=3)
    assert status == "error" and "KeyboardInterrupt" in printed, printed
    assert "interrupted: cancelled 2 Ray tasks this cell was waiting for" in printed, printed
    out = kernel.run(  # what Ray says of them now
        "from ray.exceptions import TaskCancelledError\n"
        "for ref in refs:\n"
        "    try:\n"
        "        ray.get(ref, timeout=60)\n"
        "    except TaskCancelledError:\n"
        "        print('cancelled')\n"
    )
    assert out.split() == ["cancelled", "cancelled"], out


# -- stopping ---------------------------------------------------------------------------------
def test_down_by_name_stops_the_cluster(started, run):
    import ray

    cluster = started["cluster"]
    out, _, error = run(f"%slurm_ray down {started['name']}")
    assert error is None and "STOPPED" in out
    assert not ray.is_initialized()
    assert job_fields(cluster.job_id)["JobState"] in ("CANCELLED", "COMPLETED")
    # the next task meets the one line, and no Ray starts here in the cluster's stead
    out, _, error = run("where.remote()")
    one_line_ray_refusal(out, error)
    assert ray_started_here() == []


def test_down_all_stops_every_active_cluster_of_every_kernel(other, run):
    out, _, error = run("%slurm_ray down --all")
    assert error is None
    assert re.search(rf"{other['name']} .*STOPPED", out), out
    job_id = Registry().find(other["name"]).job_id
    wait_for(
        lambda: job_fields(job_id)["JobState"] in ("CANCELLED", "COMPLETED"), 30, "the job end"
    )
    out, _, _ = run("%slurm_ray list")
    assert "CONNECTED" not in out and "READY" not in out


def test_timings(started, other):
    """Not a check: the numbers for the report (pytest -s shows them)."""
    print(f"\nup+connect in this shell: {started['seconds']:.1f} s")
    print(f"%%slurm_ray up --detach in another kernel: {other['seconds']:.1f} s")
