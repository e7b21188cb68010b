"""Capture what the Slurm commands the package reads print, on the testbed this runs in, for the
fast tests that run every parser on every release's real output
(tests/fast/test_slurm_releases.py). Run by ``scripts/capture-slurm-output --flavour F``, as
root in the flavour's login node (standard library only: any Python there will do).

Jobs of the test user in known states (completed, failed, cancelled, timed out, out of memory
under an enforced profile, running on two nodes with a GPU and named steps, pending), a
drained node, refusals, and the controller stopped then gone; each command as the package runs
it. Writes ``OUT/<version>/``: ``<name>.out`` (stdout), ``<name>.err`` and the exit status in
``manifest.json`` (beside the commands, the jobs' roles, the flavour and profile), and
``environment-variables.json`` (the man pages' variable lists, as
tests/fast/test_slurm_environment.py reads them).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

USER = os.environ.get("JSR_USER", "alice")
PROFILE = os.environ.get("JSR_PROFILE", "permissive")
SOLO_NODE = (
    f"node{int(os.environ.get('JSR_NODES', '3')) + int(os.environ.get('JSR_SOLO_NODES', '3'))}"
)
RUN = Path("/run/jsr-testbed")
DAEMON_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}

# The package's formats (jupyter_slurm_ray/slurm/output.py), spelled out: this runs without it.
SQUEUE_FORMAT = "%i|%T|%D|%S|%L|%l|%N|%j|%k|%r"
SACCT_FIELDS = "JobID,State,ExitCode,NodeList,Start,Timelimit,JobName"
SINFO_FORMAT = "%R|%a|%F|%c|%m|%G|%l|%P|%s"
ASSOCIATION_FIELDS = (
    "User,DefaultAccount,Account,Partition,QOS,DefaultQOS,MaxWall,MaxTRES,MaxTRESPerNode,AdminLevel"
)
QOS_FIELDS = "Name,MaxWall,MaxTRESPerJob,MaxTRESPerNode,MinTRESPerJob,Flags"
USAGE_FIELDS = "JobID,State,ElapsedRaw,AllocTRES,AllocCPUS,TotalCPU,MaxRSS,MaxRSSNode,NodeList"
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL"}
MISSING_JOB = "999999"
TAG = "jupyter-slurm-ray:"  # naming.JOB_TAG: a cluster's job comment

ENV_COMMANDS = ("sbatch", "srun", "salloc", "squeue", "scontrol", "sacct", "scancel", "sinfo")
INPUT_SECTIONS = {"INPUT ENVIRONMENT VARIABLES", "ENVIRONMENT VARIABLES"}


class Capture:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.commands: dict[str, dict[str, object]] = {}
        self.jobs: dict[str, str] = {}
        self.home = Path(run(["getent", "passwd", USER])[1].split(":")[5])
        self.spool = self.home / "jsr-capture"

    # -- commands ------------------------------------------------------------------------------
    def save(self, name: str, argv: list[str], *, user: bool = True, timeout: float = 60) -> str:
        """Run argv (as the test user unless ``user`` is False) and keep what it printed."""
        code, out, err = run(as_user(argv) if user else argv, timeout=timeout)
        if out:
            (self.out / f"{name}.out").write_text(out)
        if err:
            (self.out / f"{name}.err").write_text(err)
        self.commands[name] = {"argv": argv, "user": USER if user else "root", "exit": code}
        return out

    # -- jobs ----------------------------------------------------------------------------------
    def submit(self, role: str, script: str, *options: str) -> str:
        text = f"#!/bin/sh\n{script}\n"
        argv = [
            "sbatch",
            "--parsable",
            f"--job-name=jsr-{role}",
            f"--output={self.spool}/%x-%j.out",
            *options,
        ]
        code, out, err = run(as_user(argv), input=text)
        if code != 0:
            raise SystemExit(f"sbatch for {role} failed: {err.strip()}")
        job = out.strip().split(";")[0]
        self.jobs[role] = job
        print(f"[capture] {role}: job {job}", file=sys.stderr)
        return job

    def states(self) -> dict[str, str]:
        ids = ",".join(self.jobs.values())
        _, out, _ = run(["squeue", "-h", "-t", "all", "-j", ids, "-o", "%i|%T"])
        return dict(line.split("|", 1) for line in out.split() if "|" in line)

    def wait(self, roles: list[str], wanted: set[str], limit: float) -> None:
        """Until each role's job is in one of ``wanted``; each job that ends is described by
        scontrol and squeue at once (slurmctld forgets it MinJobAge later)."""
        deadline = time.monotonic() + limit
        while True:
            states = self.states()
            for role, job in self.jobs.items():
                if states.get(job) in FINAL and f"scontrol-job-{role}" not in self.commands:
                    self.save(f"scontrol-job-{role}", ["scontrol", "show", "job", "-o", job])
                    self.save(
                        f"squeue-job-{role}",
                        ["squeue", "-h", "-t", "all", "-j", job, "-o", SQUEUE_FORMAT],
                    )
            if all(states.get(self.jobs[role]) in wanted for role in roles):
                return
            if time.monotonic() > deadline:
                raise SystemExit(f"jobs not {wanted} after {limit} s: {states} ({self.jobs})")
            time.sleep(0.5)


def run(argv: list[str], *, input: str | None = None, timeout: float = 60):
    try:
        done = subprocess.run(
            argv, input=input, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:
        return 124, exc.stdout or "", (exc.stderr or "") + f"\n[timed out after {timeout} s]"
    return done.returncode, done.stdout, done.stderr


def as_user(argv: list[str]) -> list[str]:
    return ["runuser", "-u", USER, "--", *argv]


def man_page_variables(text: str, sections: set[str]) -> list[str]:
    """The variable names of a man page's sections (the bold word after each ``.TP``), as
    tests/fast/test_slurm_environment.py reads them."""
    names: list[str] = []
    inside = take = False
    for line in text.splitlines():
        if line.startswith(".SH"):
            inside, take = line[3:].strip().strip('"') in sections, False
        elif inside and line.startswith(".TP"):
            take = True
        elif take:
            names += re.findall(r"\\fB([A-Z][A-Z0-9_]*)\\fR", line)
            take = False
    return names


def man_page(command: str) -> str:
    return gzip.open(f"/usr/share/man/man1/{command}.1.gz", "rt", errors="replace").read()


def environment_variables(version: str, package: str) -> dict[str, object]:
    inputs = {c: man_page_variables(man_page(c), INPUT_SECTIONS) for c in ENV_COMMANDS}
    inputs["sacctmgr"] = man_page_variables(man_page("sacctmgr"), INPUT_SECTIONS)
    return {
        "source": f"Slurm's man pages as installed by Debian's slurm-client {package} in "
        "/usr/share/man/man1 (scripts/capture-slurm-output)",
        "slurm_version": version,
        "sections": "input: each command's INPUT ENVIRONMENT VARIABLES (sbatch, srun, salloc) or "
        "ENVIRONMENT VARIABLES (squeue, scontrol, sacct, scancel, sinfo, sacctmgr); "
        "sbatch_output: sbatch's OUTPUT ENVIRONMENT VARIABLES (a batch job's own)",
        "extracted_by": "tests/resources/capture_slurm_output.py (man_page_variables)",
        "input": inputs,
        "sbatch_output": man_page_variables(man_page("sbatch"), {"OUTPUT ENVIRONMENT VARIABLES"}),
    }


def slurmctld_pid() -> int:
    return int((RUN / "slurmctld.pid").read_text().split()[0])


def capture(out_root: Path) -> Path:
    package = run(["dpkg-query", "-W", "-f=${Version}", "slurm-client"])[1].strip()
    version = package.split(":")[-1].split("-")[0]
    out = out_root / version
    out.mkdir(parents=True, exist_ok=True)
    for old in out.iterdir():
        old.unlink()
    c = Capture(out)
    run(["install", "-d", "-o", USER, "-m", "0755", str(c.spool)])
    enforced = PROFILE == "enforced"

    # Jobs in every state the package reads
    c.submit("completed", "sleep 1", "--time=5")
    c.submit("failed", "exit 3")
    c.submit("cancelled", "sleep 600")
    c.submit("timeout", "sleep 600", "--time=1")
    if enforced:  # killed by its memory cgroup: OUT_OF_MEMORY
        c.submit("oom", "python3 -c 'x = bytearray(400 << 20)'", "--mem=100M")
    # two nodes, a GPU, a cluster's tag; its steps named (as --here's are): the batch
    # environment and a step's are kept
    seen = "env | grep -E '^(SLURM|SBATCH|SRUN|SALLOC)_' | sort"
    c.submit(
        "running",
        f"{seen} >{c.spool}/batch-env\n"
        f'srun --overlap -N1 -n1 -w "$SLURMD_NODENAME" sh -c "{seen}" >{c.spool}/step-env\n'
        "srun --overlap -N1 -n1 --job-name=jsr-named-step sleep 600 &\nsleep 600",
        "--nodes=2",
        "--cpus-per-task=2",
        "--mem=300M",
        "--gres=gpu:1",
        "--time=30",
        f"--comment={TAG}capture",
        "--partition=debug",
    )
    c.submit("pending", "true", "--begin=now+3600")  # waits for its start time
    c.submit("held", "true", "--hold")
    c.wait(["cancelled", "running"], {"RUNNING"}, 120)
    run(as_user(["scancel", c.jobs["cancelled"]]))
    c.wait(["completed", "failed", "cancelled"] + (["oom"] if enforced else []), FINAL, 120)
    c.wait(["timeout"], {"TIMEOUT"}, 180)
    time.sleep(6)  # the running job's steps have started and written what they saw
    ids = ",".join(c.jobs.values())

    # squeue: the package's queries, the user's whole queue, tags, dirs, steps, an allocation's end
    c.save("squeue-jobs", ["squeue", "-h", "-t", "all", "-j", ids, "-o", SQUEUE_FORMAT])
    c.save("squeue-me", ["squeue", "-h", "--me", "-t", "all", "-o", SQUEUE_FORMAT])
    c.save("squeue-tags", ["squeue", "-h", "--me", "-o", "%i|%k"])
    c.save("squeue-dirs", ["squeue", "-h", "--me", "-o", "%i|%Z"])
    c.save("squeue-steps", ["squeue", "-h", "--steps", "-j", c.jobs["running"], "-o", "%i|%j"])
    c.save("squeue-end", ["squeue", "-h", "-j", c.jobs["running"], "-o", "%e"])
    c.save("squeue-missing", ["squeue", "-h", "-t", "all", "-j", MISSING_JOB, "-o", SQUEUE_FORMAT])
    # sacct: final states (slurmdbd, and jobcomp's file with -c), usage with steps
    c.save("sacct", ["sacct", "-X", "-n", "-P", "-j", ids, "-o", SACCT_FIELDS])
    c.save("sacct-jobcomp", ["sacct", "-c", "-X", "-n", "-P", "-j", ids, "-o", SACCT_FIELDS])
    c.save("sacct-usage", ["sacct", "-n", "-P", "--noconvert", "-j", ids, "-o", USAGE_FIELDS])
    # scontrol: a running job with its details per node (--here's allocation), a missing job
    c.save("scontrol-job-running", ["scontrol", "show", "job", "-o", c.jobs["running"]])
    c.save("scontrol-job-detail", ["scontrol", "show", "job", "-d", "-o", c.jobs["running"]])
    c.save("scontrol-job-pending", ["scontrol", "show", "job", "-o", c.jobs["pending"]])
    c.save("scontrol-job-missing", ["scontrol", "show", "job", "-o", MISSING_JOB])
    c.save("scontrol-config", ["scontrol", "show", "config"])
    c.save("scontrol-extend", ["scontrol", "update", f"JobId={c.jobs['running']}", "TimeLimit=+5"])
    # sinfo: the widget's partitions, a drained node's reason
    c.save("sinfo-partitions", ["sinfo", "-h", "-o", SINFO_FORMAT])
    run(["scontrol", "update", f"nodename={SOLO_NODE}", "state=drain", "reason=jsr capture drill"])
    c.save("sinfo-reasons", ["sinfo", "-h", "-N", "-R", "-n", SOLO_NODE, "-o", "%N|%E"])
    run(["scontrol", "update", f"nodename={SOLO_NODE}", "state=resume"])
    # sacctmgr: the user's associations (as the package asks: user=<whoever runs it>), QOSes
    c.save(
        "sacctmgr-associations",
        [
            "sacctmgr",
            "-n",
            "-P",
            "show",
            "user",
            "withassoc",
            f"format={ASSOCIATION_FIELDS}",
            "where",
            f"user={USER}",
        ],
    )
    c.save("sacctmgr-qos", ["sacctmgr", "-n", "-P", "show", "qos", f"format={QOS_FIELDS}"])
    # sbatch: its version, its answer, its refusals
    c.save("sbatch-version", ["sbatch", "--version"])
    held = c.save("sbatch-parsable", ["sbatch", "--parsable", "--hold", "--wrap", "true"])
    run(as_user(["scancel", held.strip().split(";")[0]]))
    c.save("sbatch-no-partition", ["sbatch", "-p", "nosuch", "--wrap", "true"])
    c.save("sbatch-too-many-cpus", ["sbatch", "-c", "99", "--wrap", "true"])
    # more nodes than the partition has (22.05 queues it: PartitionNodeLimit, for ever)
    nodes = str(int(os.environ.get("JSR_NODES", "3")) + 1)
    c.save(
        "sbatch-more-nodes-than-the-partition",
        ["sbatch", "--parsable", "-N", nodes, "-p", "debug", "--wrap", "true"],
    )
    c.save("sbatch-qos-limit", ["sbatch", "--qos=short", "-N", "2", "--wrap", "true"])
    c.save("sbatch-wrong-account", ["sbatch", "-A", "chemistry", "--wrap", "true"])
    c.save("scancel-missing", ["scancel", MISSING_JOB])
    # what the jobs saw
    for name in ("batch-env", "step-env"):
        (out / f"{name}.out").write_text((c.spool / name).read_text())
    run(as_user(["scancel", "-u", USER]))  # and what a refusal that was none queued

    # the controller paused (clients time out), then gone (connection refused)
    pid = slurmctld_pid()
    os.kill(pid, signal.SIGSTOP)
    try:
        c.save("squeue-controller-paused", ["squeue", "-h", "--me"], timeout=120)
        c.save("sbatch-controller-paused", ["sbatch", "--wrap", "true"], timeout=120)
    finally:
        os.kill(pid, signal.SIGCONT)
    time.sleep(2)
    os.kill(pid, signal.SIGTERM)
    for _ in range(100):
        if not Path(f"/proc/{pid}").exists():
            break
        time.sleep(0.1)
    c.save("squeue-controller-gone", ["squeue", "-h", "--me"], timeout=120)
    c.save("sbatch-controller-gone", ["sbatch", "--wrap", "true"], timeout=120)
    subprocess.run(["slurmctld", "-i"], env=DAEMON_ENV, cwd="/", check=True, timeout=30)
    for _ in range(300):
        if run(["sinfo", "-h"])[0] == 0:
            break
        time.sleep(0.2)

    (out / "environment-variables.json").write_text(
        json.dumps(environment_variables(version, package), indent=1) + "\n"
    )
    manifest = {
        "slurm_version": version,
        "package": f"slurm-client {package}",
        "flavour": os.environ.get("JSR_FLAVOUR", ""),
        "profile": PROFILE,
        "user": USER,
        "jobs": c.jobs,
        "missing_job": MISSING_JOB,
        "drained_node": SOLO_NODE,
        "controller": os.environ.get("JSR_CONTROLLER_IP", ""),
        "commands": {
            name: {**info, "shown": shlex.join(info["argv"])}  # type: ignore[arg-type]
            for name, info in c.commands.items()
        },
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return out


if __name__ == "__main__":
    written = capture(Path(sys.argv[1] if len(sys.argv) > 1 else "tests/resources/slurm-output"))
    print(f"[capture] {written}", file=sys.stderr)
