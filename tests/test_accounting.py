"""Accounting on the real testbed (slurmdbd, ``AccountingStorageEnforce=associations,limits,
qos,safe``), through ``%slurm_ray`` in a real IPython shell acting as alice:

- a request under an account alice has no association with, over a QOS limit, or over a
  partition's MaxTime is refused before anything is submitted (no sbatch, nothing queued),
  naming Slurm's limit; a valid account/QOS pair reaches CONNECTED;
- extending the walltime is refused on the testbed's default policy with Slurm's words, and
  works while alice is an operator (reverted at once), the new time left shown;
- after a known workload (one CPU burnt for ~20 s) the cluster's usage matches sacct, computed
  here from sacct's own fields (CPUTimeRAW, the allocation's TotalCPU, MaxRSS), not with the
  package's parser; the live view prints the one-line summary when the cluster ends.
"""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import uuid
from collections.abc import Callable, Iterator, Sequence

import pytest

from jupyter_slurm_ray import session as session_module
from jupyter_slurm_ray.transport import CommandResult, LocalTransport

from .helpers.clusters import TEST_SPEC
from .helpers.ipyshell import one_line_error
from .helpers.jobs import job_fields, jobs_named
from .helpers.site import configured_site
from .helpers.testbed import USER, runuser
from .helpers.waiting import wait_for
from .test_magics import Shell

pytestmark = [pytest.mark.testbed, pytest.mark.ray]


class RecordingTransport(LocalTransport):
    """The test user's transport, keeping every command it ran (to show no sbatch ran)."""

    def __init__(self) -> None:
        super().__init__(runuser(USER))
        self.commands: list[tuple[str, ...]] = []

    async def run(self, argv: Sequence[str], **kwargs) -> CommandResult:
        self.commands.append(tuple(argv))
        return await super().run(argv, **kwargs)


@pytest.fixture(scope="module")
def recording() -> RecordingTransport:
    return RecordingTransport()


@pytest.fixture(scope="module")
def shell(tmp_path_factory, testbed, recording) -> Iterator[Shell]:
    """The magics as alice on the testbed, with the test clusters' settings (TEST_SPEC)."""
    with (
        configured_site(tmp_path_factory.mktemp("site")),
        pytest.MonkeyPatch.context() as patch,
    ):
        patch.setattr(session_module, "make_transport", lambda config=None: recording)
        shell = Shell()
        shell.ip.run_cell('%config SlurmRay.default_profile = "testbed"')
        shell.ip.run_cell(f"%config SlurmRay.start_timeout = {TEST_SPEC['start_timeout']}")
        yield shell
        shell.ip.run_cell("%config SlurmRay.default_profile = None")
        shell.ip.run_cell("%config SlurmRay.start_timeout = None")
        session_module._session = None


@pytest.fixture
def run(shell: Shell, capfd) -> Callable[[str], tuple[str, str, BaseException | None]]:
    return lambda cell: shell.run(cell, capfd)


def sbatch_calls(commands: Sequence[tuple[str, ...]]) -> list[tuple[str, ...]]:
    return [c for c in commands if "sbatch" in c]


# -- refused before submitting ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (
            "-A chemistry",
            "account: 'chemistry' is not allowed; an account of alice: physics (default) "
            "(sacctmgr shows no association of alice with account chemistry)",
        ),
        (
            "-q short -N 2",
            "qos: 'short' allows at most 1 node per job (MaxTRESPerJob=node=1); you asked for 2",
        ),
        (
            "-p short -t 45",
            "time: '00:45:00' is not allowed; at most 00:30:00 in partition short "
            "(MaxTime=00:30:00)",
        ),
    ],
)
@pytest.mark.compat
def test_a_request_over_a_limit_is_refused_before_submitting(run, recording, options, expected):
    name = "r" + uuid.uuid4().hex[:8]
    before = len(recording.commands)
    _, err, error = run(f"%slurm_ray up --name {name} {options}")
    assert one_line_error(err) == f"UsageError: {expected}"
    assert error is not None
    assert sbatch_calls(recording.commands[before:]) == []  # nothing submitted
    assert jobs_named(name) == []  # nothing queued


# -- a valid account/QOS pair -----------------------------------------------------------------
@pytest.fixture(scope="module")
def connected(shell: Shell, recording) -> Iterator[dict]:
    name = "a" + uuid.uuid4().hex[:8]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        result = shell.ip.run_cell(f"%slurm_ray up -A physics -q short -N 1 -t 5 --name {name}")
    assert result.error_in_exec is None, (result.error_in_exec, printed.getvalue())
    cluster = shell.magics.session.current
    yield {"name": name, "cluster": cluster, "out": printed.getvalue()}
    if not cluster.state.is_final:
        cluster.down()


def test_a_valid_account_and_qos_reach_connected(connected, recording):
    cluster = connected["cluster"]
    assert cluster.state.value == "CONNECTED"
    job = job_fields(cluster.job_id)
    assert (job["Account"], job["QOS"], job["TimeLimit"]) == ("physics", "short", "00:05:00")
    assert "note:" not in connected["out"]  # accounting answered: nothing was skipped
    assert len(sbatch_calls(recording.commands)) == 1


# -- extending the walltime -------------------------------------------------------------------
def sacctmgr_admin_level(level: str) -> None:
    subprocess.run(
        ["sacctmgr", "-i", "modify", "user", USER, "set", f"adminlevel={level}"],
        check=True,
        capture_output=True,
    )


def test_extend_is_refused_by_default_and_allowed_to_an_operator(connected, run):
    name, cluster = connected["name"], connected["cluster"]
    _, err, error = run(f"%slurm_ray extend {name} +2")
    line = one_line_error(err)
    assert error is not None
    assert f"Slurm refused to extend job {cluster.job_id} by 2 min: " in line
    assert f"Access/permission denied for job {cluster.job_id}." in line  # Slurm's own words
    assert "ask an operator or your site's support" in line
    assert job_fields(cluster.job_id)["TimeLimit"] == "00:05:00"
    try:
        sacctmgr_admin_level("operator")
        out, err, error = run(f"%slurm_ray extend {name} +2")
    finally:
        sacctmgr_admin_level("none")
    assert error is None, err
    assert re.fullmatch(
        rf"{name}: walltime extended by 2 min: 0:0[5-7]:\d\d left \(time limit 0:07:00\)",
        out.strip(),
    ), out
    assert job_fields(cluster.job_id)["TimeLimit"] == "00:07:00"
    status, _, _ = run(f"%slurm_ray status {name}")
    assert re.search(r"walltime\s+0:0[5-7]:\d\d left of 0:07:00", status), status
    levels = subprocess.run(
        ["sacctmgr", "-n", "-P", "show", "user", USER, "format=AdminLevel"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert levels.stdout.strip() == "None"  # reverted


# -- usage ----------------------------------------------------------------------------------------
def cpu_seconds(text: str) -> float:
    """sacct's TotalCPU (``[D-][HH:]MM:SS[.mmm]``) in seconds, parsed here on its own."""
    days, _, clock = text.rpartition("-")
    seconds = 0.0
    for part in clock.split(":"):
        seconds = seconds * 60 + float(part)
    return seconds + int(days or 0) * 86400


def sacct_expectation(job_id: str) -> dict:
    """What sacct says the job used, from its own aggregate fields."""
    fields = "JobID,State,CPUTimeRAW,TotalCPU,MaxRSS,MaxRSSNode,AllocTRES,ElapsedRaw,Elapsed"
    out = subprocess.run(
        ["sacct", "-n", "-P", "--noconvert", "-j", job_id, "-o", fields],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = [line.split("|") for line in out.splitlines() if line.strip()]
    (alloc,) = [r for r in rows if r[0] == job_id]
    steps = [r for r in rows if r[0].startswith(f"{job_id}.") and r[4]]
    peak = max(steps, key=lambda r: int(r[4])) if steps else None
    return {
        "state": alloc[1],
        "cpu_hours": int(alloc[2]) / 3600,
        "total_cpu": cpu_seconds(alloc[3]),
        "efficiency": cpu_seconds(alloc[3]) / int(alloc[2]) if int(alloc[2]) else None,
        "max_rss": (peak[5], int(peak[4])) if peak else None,
        "gpus": "gres/gpu" in alloc[6],
        "elapsed": int(alloc[7]),  # seconds
        "elapsed_clock": cpu_seconds(alloc[8]),  # [D-]HH:MM:SS, the same time as sacct shows it
    }


@pytest.mark.compat
def test_the_usage_of_a_known_workload_matches_sacct(connected, run, capfd):
    import ray

    name, cluster = connected["name"], connected["cluster"]

    @ray.remote(num_cpus=1)
    def burn(seconds: float) -> int:
        import time as clock

        started, spins = clock.time(), 0
        while clock.time() - started < seconds:
            spins += 1
        return spins

    assert ray.get(burn.remote(20)) > 0
    down_out, err, error = run(f"%slurm_ray down {name}")
    assert error is None, err
    job_id = cluster.job_id
    expected = wait_for(
        lambda: (e := sacct_expectation(job_id))["state"] not in ("RUNNING", "COMPLETING") and e,
        60,
        "sacct to record the end of the job",
    )
    usage = cluster.usage()
    assert usage.available and usage.final and usage.job_ids == (job_id,)
    assert usage.cpu_hours == pytest.approx(expected["cpu_hours"], abs=1e-9)
    assert usage.gpu_hours == 0 and not expected["gpus"]
    # elapsed to the second, as sacct reports it (ElapsedRaw, and Elapsed as it prints it)
    assert usage.elapsed == expected["elapsed"] == expected["elapsed_clock"]
    assert usage.to_dict()["elapsed"] == expected["elapsed"]  # what the REST API shows
    assert usage.elapsed >= 20  # the 20 s burnt are inside the allocation
    assert usage.cpu_used == pytest.approx(expected["total_cpu"], abs=0.01)
    assert usage.cpu_used >= 15  # the burnt CPU (and Ray's own) is in it
    # the steps' TotalCPU summed, against the allocation's own (24.11 rounds them apart by ms)
    assert usage.cpu_efficiency == pytest.approx(expected["efficiency"], abs=1e-3)
    assert usage.max_rss == expected["max_rss"]
    summary = f"{name} (STOPPED): used "
    seen = [down_out]  # the live view may print it while down still runs

    def printed() -> bool:
        seen[0] += capfd.readouterr().out
        return summary in seen[0]

    wait_for(printed, 60, "the live view's usage line")
    line = next(line for line in seen[0].splitlines() if summary in line)
    print(f"\nusage of {name} (job {job_id}): {line}\nsacct: {expected}")
    assert f"CPU efficiency {expected['efficiency'] * 100:.0f} %" in line
