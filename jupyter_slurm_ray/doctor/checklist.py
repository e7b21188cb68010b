"""``doctor``: is this site ready for a cluster? A checklist, each line ✓ or ✗ with its fix.

From the login side: SSH (SSH mode), Slurm answers, sbatch is there (a compute node may have
none: SSH mode to a login node then), the request fits the partition and the
accounting (``sitecheck``), the job dir root is safely owned (``jobdir.probe_site``), the
extensions are enabled. From a compute node, with one short test job (``testjob.py``): the
cluster's Python runs there with the same Ray and Python minor version as this kernel (and how
long ``import ray`` takes), the job dir root is the same directory there, and the address the
bootstrap would choose is reachable from the login node on a port of ``port_range``.

Shown as a table in a notebook, plain text in a terminal, JSON for scripts and the REST API.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
from collections.abc import Sequence
from typing import Any

from ..client.connect import local_versions
from ..client.mode import (
    KernelPlace,
    allowed_driver_hosts,
    driver_precheck,
    driver_reach_plan,
    driver_reach_verdict,
    remote_target,
)
from ..config import effective_setting
from ..errors import SlurmRayError, SpecError, TransportError
from ..job import packs
from ..job.directory import (
    KernelEnvironment,
    Site,
    kernel_environment,
    kernel_python_argv,
    probe_site,
)
from ..scheduler.kinds import enclosing_job
from ..slurm.accounting import load_accounting
from ..slurm.client import SlurmClient
from ..slurm.memorypolicy import load_memory_policy
from ..slurm.sitecheck import check_spec, chosen_partition, describe_partition
from ..spec import ClusterSpec, format_walltime
from ..transport import LocalTransport, Transport
from .libraries import libraries_verdict
from .report import Check, Report
from .testjob import NodeReport, run_test_job

__all__ = ["SLOW_IMPORT_SECONDS", "Check", "Report", "run_doctor"]

_MAKE_ROOT = 'umask 077; mkdir -p -- "$1"'  # as JobDir.create makes it
SLOW_IMPORT_SECONDS = 5.0  # `import ray` slower than this on a node gets a warning


async def _driver_refused(spec: ClusterSpec, transport: Transport, root: str) -> str | None:
    """Why a cluster's job dir under ``root`` rules driver mode out from this process (the
    check ``up`` makes before submitting), in the driver line's words; None: it does not."""
    obstacle = await driver_precheck(transport, root)
    if obstacle is None:
        return None
    if spec.connect == "auto":
        return f"auto connects with Ray Client from here: {obstacle}"
    return f"connect = driver is refused here: {obstacle}"


async def run_doctor(
    spec: ClusterSpec,
    transport: Transport,
    *,
    queue_timeout: float = 120.0,
    server_extension_running: bool = False,
    driver_hosts: Sequence[str] | None = None,
) -> Report:
    """Every check, the test job included (always cancelled); never raises for a failed check.

    ``driver_hosts``: ``SlurmRay.driver_hosts`` (None: its environment variable's)."""
    report = Report(target=transport.target)
    hosts = driver_hosts if driver_hosts is not None else effective_setting("driver_hosts")[0]
    place = KernelPlace.here(allowed_driver_hosts(hosts))
    not_driver = driver_reach_plan(spec, place, remote_target(transport))
    add = report.checks.append
    ssh_ok = await _check_ssh(transport, add)
    partitions = await _check_slurm(transport, add) if ssh_ok else None
    slurm_ok = partitions is not None
    if ssh_ok:
        await _check_submit(transport, add)
    else:
        add(_check("submit", "skip", "not checked: no connection"))
    if slurm_ok:
        await _check_request(spec, transport, partitions or [], add)
    else:
        add(Check("request", _TITLES["request"], "skip", "not checked: Slurm did not answer"))
    site = await _probe_root(spec, transport) if ssh_ok else None
    if not_driver is None and isinstance(site, Site):  # what up asks before submitting
        not_driver = await _driver_refused(spec, transport, site.job_dir_root)
    python_argv, python_said, login_verdict = _cluster_python(spec, transport, site)
    node = NodeReport(not_started="Slurm did not answer")
    if slurm_ok and isinstance(site, Site):
        probe_dir = await _make_probe_dir(transport, site)
        try:
            node = await run_test_job(
                transport,
                spec,
                python_argv=python_argv,
                probe_dir=probe_dir,
                exported=site.exported,
                queue_timeout=queue_timeout,
                reach_back=not_driver is None,
            )
        finally:
            if probe_dir is not None:
                await transport.run(["rm", "-rf", "--", probe_dir], check=False)
    elif slurm_ok:
        node = NodeReport(not_started="the job dir root is not usable (see above)")
    report.test_job = {
        "job_id": node.job_id,
        "node": node.node,
        "queue_wait": node.queue_wait,
        "duration": node.duration,
        "import_ray_seconds": node.python.get("import_ray_seconds"),
    }
    add(_job_dir_check(spec, site, node))
    add(_test_job_check(node))
    add(_python_check(node, python_said, login_verdict, spec.container))
    add(_ray_check(spec, node))
    add(_check("libraries", *libraries_verdict(spec, node.python)))
    add(_address_check(spec, node))
    verdict = driver_reach_verdict(
        not_driver, node.node, node.reached_back, node.reach_back_where, node.reach_back_error
    )
    add(_check("driver", *verdict))
    add(protections_check(spec, node))
    add(extensions_check(server_extension_running))
    order = [
        "ssh", "slurm", "submit", "request", "job_dir", "test_job", "python", "ray",
        "libraries", "address", "driver", "protections", "extensions",
    ]  # fmt: skip
    report.checks.sort(key=lambda check: order.index(check.name))
    return report


_TITLES = {
    "ssh": "SSH to the login node",
    "slurm": "Slurm answers",
    "submit": "Jobs can be submitted from here (sbatch)",
    "request": "The request fits the site",
    "job_dir": "Job dir root: yours, shared with the nodes",
    "test_job": "A test job runs",
    "python": "The cluster's Python runs on a node",
    "ray": "Ray on the node matches this kernel",
    "libraries": "Ray Data's, Train's and Tune's libraries on the node match this kernel",
    "address": "The node's address is reachable",
    "driver": "The nodes reach this kernel (driver mode)",
    "protections": "Protections against other users of the nodes",
    "extensions": "JupyterLab and server extensions",
}


def _check(name: str, status: str, detail: str, fix: str = "") -> Check:
    return Check(name, _TITLES[name], status, detail, fix)


# What to do when a step that only has to answer does not.
_FIXES = {
    "ssh": (
        "check login_host, login_user, login_port, ssh_key and known_hosts "
        "(%slurm_ray config shows them); `ssh` to the same host should work without a password"
    ),
    "slurm": (
        "run `sinfo` and `squeue --me` where Slurm runs (the login node): they must answer; "
        "if Slurm is on another machine, set login_host to reach it over SSH"
    ),
}


_SSH_MODE_FIX = (
    "submit from a login node instead, over SSH: set login_host (and login_user, ssh_key, "
    'known_hosts), e.g. %config SlurmRay.login_host = "login1" (docs/admin/jupyterhub-ood.md: '
    "a site that forbids submitting from jobs)"
)


def _failed(name: str, exc: SlurmRayError) -> Check:
    return _check(name, "fail", str(exc), _FIXES[name])


async def _check_ssh(transport: Transport, add: Any) -> bool:
    if isinstance(transport, LocalTransport):
        add(_check("ssh", "skip", "not used: Slurm runs on this machine"))
        return True
    try:
        home = await transport.home()
    except SlurmRayError as exc:
        add(_failed("ssh", exc))
        return False
    add(_check("ssh", "ok", f"{transport.target}: logged in (home {home})"))
    return True


async def _check_slurm(transport: Transport, add: Any) -> list[Any] | None:
    slurm = SlurmClient(transport)
    try:
        partitions = await slurm.partitions()
        await slurm.tagged_jobs()  # squeue --me
    except SlurmRayError as exc:
        add(_failed("slurm", exc))
        return None
    names = ", ".join(p.name + ("*" if p.is_default else "") for p in partitions) or "none"
    add(_check("slurm", "ok", f"sinfo and squeue answer; partitions: {names}"))
    return partitions


async def _check_submit(transport: Transport, add: Any) -> None:
    """``sbatch --version`` where the cluster's job would be submitted; a kernel inside a
    Slurm job is told so (its job's variables are kept out of the package's Slurm commands)."""
    here = isinstance(transport, LocalTransport)
    outer = enclosing_job() if here else None
    where = f"inside Slurm job {outer.job_id} on this node" if outer else transport.target
    try:
        result = await transport.run(["sbatch", "--version"], check=False, timeout=30)
        status, said = result.returncode, (result.stdout or result.stderr).strip()
    except TransportError as exc:  # not started (not installed here), or no answer
        status, said = 127, str(exc)
    if status == 127:
        fix = _SSH_MODE_FIX if here else "set login_host to a login node that has Slurm's sbatch"
        add(_check("submit", "fail", f"no sbatch {where}: {said or 'not found'}", fix))
        return
    if status != 0:
        add(_check("submit", "fail", f"sbatch --version failed {where}: {said}", _FIXES["slurm"]))
        return
    detail = f"{said.splitlines()[0] if said else 'sbatch'} {where}"
    if outer:
        detail += " (its SLURM_* variables are kept out of the cluster's request)"
    add(_check("submit", "ok", detail))


async def _check_request(
    spec: ClusterSpec, transport: Transport, partitions: list[Any], add: Any
) -> None:
    accounting = await load_accounting(transport)
    memory = await load_memory_policy(transport)
    try:
        notes = check_spec(spec, partitions, accounting, memory)
    except SpecError as exc:
        add(_check("request", "fail", str(exc), _spec_fix(exc)))
        return
    chosen = chosen_partition(spec, partitions)
    asked = f"{spec.nodes} node(s)"
    if spec.time is not None:
        asked += f" for {format_walltime(spec.time_seconds or 0)}"
    where = describe_partition(chosen) if chosen else "the default partition"
    detail = f"{asked} fits {where}"
    if accounting.known:
        detail += f"; account {spec.account or accounting.default_account or '?'}"
    if spec.time is None:
        detail += "; no walltime given (-t), so none was checked"
    detail += "".join(f"; {note}" for note in notes)
    add(_check("request", "ok", detail))


_FLAGS = {"time": "-t", "nodes": "-N", "partition": "-p", "account": "-A", "qos": "-q"}


def _spec_fix(exc: SpecError) -> str:
    flag = f" ({_FLAGS[exc.field]})" if exc.field in _FLAGS else ""
    return f"ask for a {exc.field}{flag} within what is allowed: {exc.allowed}"


async def _probe_root(spec: ClusterSpec, transport: Transport) -> Site | SlurmRayError:
    try:
        return await probe_site(transport, spec.job_dir_root, spec.export_env)
    except SlurmRayError as exc:
        return exc


async def _make_probe_dir(transport: Transport, site: Site) -> str | None:
    name = f"doctor-{secrets.token_hex(6)}"
    path = f"{site.job_dir_root.rstrip('/')}/{name}"
    try:
        await transport.run(["sh", "-c", _MAKE_ROOT, "sh", site.job_dir_root])
        await transport.write_files(path, {"from-login": f"login:{name}\n"})
    except SlurmRayError:
        return None
    return path


def _cluster_python(
    spec: ClusterSpec, transport: Transport, site: Site | SlurmRayError | None
) -> tuple[list[str], str, str | None]:
    """(argv, how to name it, the login side's objection): what ``up`` would run."""
    if spec.environment == "pack" and spec.python is None:
        try:
            packs.find_tool(packs.describe_environment())
        except SpecError as exc:
            return ["python3"], "python3 (runs the bootstrap; Ray from the pack)", str(exc)
        return ["python3"], "python3 (runs the bootstrap; Ray from the pack)", None
    if spec.python is not None:
        return [spec.python], f"{spec.python} (python)", None
    if not isinstance(transport, LocalTransport):
        return ["python3"], "python3 (python not set; over SSH)", None
    env = KernelEnvironment.of_this_process()
    objection = None
    if isinstance(site, Site):
        try:
            kernel_environment(site.job_dir_root, env)
        except SpecError as exc:
            objection = str(exc)
    return kernel_python_argv(env), f"{env.python} (this kernel's; python not set)", objection


def _job_dir_check(spec: ClusterSpec, site: Site | SlurmRayError | None, node: NodeReport) -> Check:
    fix_shared = (
        "set job_dir_root to a directory on a filesystem the login and compute nodes both "
        "mount (e.g. under your home or a project/scratch filesystem), owned by you"
    )
    if site is None:
        return _check("job_dir", "skip", "not checked: no connection")
    if isinstance(site, SlurmRayError):
        return _check(
            "job_dir",
            "fail",
            str(site),
            "choose another job_dir_root, or fix the "
            "permissions so that only you (or root) can change its directories",
        )
    root = site.job_dir_root
    if node.node_saw_login_file is None or node.login_saw_node_file is None:
        why = node.refused or node.not_started or node.step_error or "the test job did not run"
        return _check("job_dir", "skip", f"{root} is yours; sharing not checked: {why}")
    if node.node_saw_login_file and node.login_saw_node_file:
        return _check(
            "job_dir",
            "ok",
            f"{root} is yours, closed to others, and {node.node} sees the same files",
        )
    seen = []
    if not node.node_saw_login_file:
        seen.append(f"{node.node} did not see the file written here")
    if not node.node_wrote_file:
        seen.append(f"{node.node} could not write there")
    elif not node.login_saw_node_file:
        seen.append(f"what {node.node} wrote is not here")
    return _check("job_dir", "fail", f"{root} is not shared: {'; '.join(seen)}", fix_shared)


def _test_job_check(node: NodeReport) -> Check:
    if node.refused:
        return _check(
            "test_job",
            "fail",
            node.refused,
            "change what Slurm refused (partition, "
            "account, qos, reservation, constraint): the cluster's job would be refused too",
        )
    if node.job_id is None or node.queue_wait is None:
        status = "skip" if node.job_id is None and not node.refused else "fail"
        why = node.not_started or "not submitted"
        fix = "run doctor again when the queue is shorter, or give it longer (--queue-timeout)"
        return _check("test_job", status, why, fix if status == "fail" else "")
    detail = f"job {node.job_id} ran on {node.node} after {node.queue_wait:g} s in the queue"
    return _check("test_job", "ok", f"{detail}; cancelled after {node.duration:g} s in all")


def _python_check(
    node: NodeReport, python_said: str, login_verdict: str | None, container: str | None = None
) -> Check:
    fix = (
        "set python to a Python the compute nodes can run (with ray installed), and setup to "
        "the lines that make it work there (module load ..., source .../bin/activate)"
    )
    if login_verdict:
        return _check("python", "fail", login_verdict, fix)
    if node.setup_failed:
        return _check("python", "fail", node.setup_failed, "fix or remove that setup line")
    if node.step_error:
        return _check("python", "fail", f"{python_said} did not run: {node.step_error}", fix)
    if not node.python:
        return _check("python", "skip", f"{python_said}: not checked (no test job ran)")
    here = ".".join(local_versions()[1].split(".")[:2])
    there = str(node.python.get("python", "?"))
    detail = f"{python_said}: Python {there} on {node.python.get('host', node.node)}"
    if container and node.python.get("host_python"):
        detail += f" (Ray's in the image {container})"
        fix = f"rebuild the image {container} with Python {here} and ray[default]"
    if there.split(".")[:2] != here.split("."):
        return _check(
            "python",
            "fail",
            f"{detail}, this kernel has Python {here}",
            f"Ray Client needs the same Python minor version: {fix} (Python {here})",
        )
    return _check("python", "ok", detail)


def _ray_check(spec: ClusterSpec, node: NodeReport) -> Check:
    if spec.environment == "pack":
        return _pack_check(node)
    ray_here = local_versions()[0]
    install = f"install ray[default]=={ray_here} in the cluster's Python, or set python/setup "
    install += "to an environment that has it"
    if spec.container:
        install = f"rebuild the image {spec.container} with ray[default]=={ray_here} on its PATH"
    if not node.python:
        return _check("ray", "skip", "not checked: the cluster's Python did not run")
    version = node.python.get("ray")
    if version is None:
        return _check("ray", "fail", f"import ray failed: {node.python.get('ray_error')}", install)
    if version != ray_here:
        detail = f"the node has Ray {version}, this kernel Ray {ray_here}"
        return _check("ray", "fail", detail, f"Ray Client needs the same Ray version: {install}")
    seconds = float(node.python.get("import_ray_seconds") or 0.0)
    detail = f"Ray {version}, as here; import ray took {seconds:.1f} s on the node"
    if seconds > SLOW_IMPORT_SECONDS:
        return _check(
            "ray",
            "warn",
            detail + " (slow: each of Ray's ~15 processes per node pays it)",
            "keep the environment on a fast filesystem, or trim packages Ray imports at start",
        )
    return _check("ray", "ok", detail)


def _pack_check(node: NodeReport) -> Check:
    """environment = "pack": Ray is this kernel's own; a venv's pack also needs its base
    Python at the same path on the nodes (venv-pack keeps the link to it)."""
    ray_here, python_here = local_versions()
    if not node.python:
        return _check("ray", "skip", "not checked: the test job did not run")
    base = node.python.get("pack_base_python")
    if base is None:  # conda and pixi packs carry their Python
        return _check("ray", "ok", f"Ray {ray_here} from the pack of this kernel's environment")
    found = node.python.get("pack_base_version")
    if found is None:
        fix = (
            f"install Python {python_here} at {base} on the compute nodes, or pack a conda "
            "environment (conda-pack carries its Python), or use environment = 'kernel' with "
            "python/setup"
        )
        return _check("ray", "fail", f"the pack's base Python {base} is not on the node", fix)
    detail = f"Ray {ray_here} from the pack; its base Python {base} ({found}) is on the node"
    return _check("ray", "ok", detail)


def _address_check(spec: ClusterSpec, node: NodeReport) -> Check:
    if not node.python:
        return _check("address", "skip", "not checked: the cluster's Python did not run")
    found = node.python.get("interfaces", [])
    interfaces = ", ".join(f"{name} {ip}" for name, ip in found if not ip.startswith("127."))
    chosen = "network_interface" if spec.network_interface else "node_ip_address_command"
    if not (spec.network_interface or spec.node_ip_address_command):
        chosen = "the route toward the Slurm controller"
    address = node.python.get("address")
    if not address:
        error = node.python.get("address_error", "no address")
        fix = f"set network_interface to an interface of the nodes ({interfaces or 'none seen'})"
        if spec.node_ip_address_command:
            fix = "fix node_ip_address_command, or unset it and set network_interface"
        return _check("address", "fail", f"on {node.node}: {error}", fix)
    if node.python.get("port") is None:
        low, high = spec.port_range
        return _check(
            "address",
            "fail",
            f"{address}: no free port in {low}-{high} on {node.node}",
            "choose another port_range (ports the nodes leave free)",
        )
    where = f"{address}:{node.python['port']} on {node.node} (from {chosen})"
    if node.reached:
        return _check("address", "ok", f"{where} answered the login node")
    fix = (
        f"set network_interface to an interface the login node can reach ({interfaces}); "
        "or ask the site which ports between compute and login nodes are open (port_range)"
    )
    return _check(
        "address", "fail", f"{where}: not reached from the login node: {node.reach_error}", fix
    )


def protections_check(spec: ClusterSpec, node: NodeReport) -> Check:
    """Which protections the cluster would run with, from its settings and what the test job
    found on the node (TLS needs openssl there)."""
    openssl = node.python.get("openssl")
    said = ["token auth"]
    if spec.port_strategy == "kernel":
        said.append("every port the kernel's choice (nothing to predict, take first or drain)")
    else:
        said.append(
            f"ports from port_range {spec.port_range[0]}-{spec.port_range[1]} "
            f"({spec.port_strategy}: predictable, watched, moved when taken)"
        )
    said.append("Ray's metrics endpoints on" if spec.ray_metrics else "Ray's metrics off")
    if not spec.tls:
        detail = "; ".join(["TLS off", *said])
        fix = (
            "with tls = false a neighbour who takes the port of a Ray process that died "
            "receives the token (set tls = true; the nodes need openssl)"
        )
        return _check("protections", "warn", detail, fix)
    if node.python and openssl is None:
        fix = "install openssl on the compute nodes (it makes the cluster's certificates)"
        return _check("protections", "fail", "TLS on, but no openssl on the node", fix)
    tls = "TLS: Ray's channels with the cluster's own CA, the dashboard through an HTTPS relay"
    where = f" ({openssl} on the node)" if openssl else ""
    status = "warn" if spec.ray_metrics else "ok"
    fix = (
        "ray_metrics = true: the metrics endpoints answer any user of the node"
        if spec.ray_metrics
        else ""
    )
    return _check("protections", status, "; ".join([tls + where, *said]), fix)


def extensions_check(server_extension_running: bool = False) -> Check:
    """Whether Jupyter Server enables ``jupyter_slurm_ray.server`` and JupyterLab has the
    labextension (installed and not disabled), from Jupyter's own configuration paths."""
    problems = []
    if not server_extension_running and not _server_extension_enabled():
        problems.append("the server extension jupyter_slurm_ray.server is not enabled")
    lab = _labextension_state()
    if lab:
        problems.append(lab)
    if problems:
        fix = (
            "reinstall the package (pip install jupyter-slurm-ray) into the environment that runs "
            "Jupyter, or `jupyter server extension enable jupyter_slurm_ray.server` and "
            "`jupyter labextension enable jupyter-slurm-ray`; then restart JupyterLab"
        )
        return _check("extensions", "fail", "; ".join(problems), fix)
    return _check("extensions", "ok", "jupyter_slurm_ray.server and jupyter-slurm-ray enabled")


def _server_extension_enabled() -> bool:
    try:
        from jupyter_core.paths import jupyter_config_path
        from jupyter_server.extension.config import ExtensionConfigManager
    except ImportError:
        return False
    enabled = ExtensionConfigManager(read_config_path=jupyter_config_path())
    return bool(enabled.get_jpserver_extensions().get("jupyter_slurm_ray.server"))


def _labextension_state() -> str | None:
    """None when the labextension is installed and not disabled; else what is wrong."""

    from jupyter_core.paths import jupyter_config_path, jupyter_path

    name = "jupyter-slurm-ray"
    paths = [os.path.join(p, name, "package.json") for p in jupyter_path("labextensions")]
    if not any(os.path.exists(path) for path in paths):
        return f"the labextension {name} is not installed (looked in {sys.prefix}/share/jupyter)"
    for directory in jupyter_config_path():
        path = os.path.join(directory, "labconfig", "page_config.json")
        try:
            with open(path) as handle:
                disabled = json.load(handle).get("disabledExtensions", {})
        except (OSError, ValueError, AttributeError):
            continue
        names = disabled if isinstance(disabled, list) else [k for k, v in disabled.items() if v]
        if any(str(item).split(":")[0] == name for item in names):
            return f"the labextension {name} is disabled in {path}"
    return None
