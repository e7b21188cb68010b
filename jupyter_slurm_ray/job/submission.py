"""Submitting a cluster's job so that no job is ever left without its record.

The job dir root is checked and the script rendered before anything is written; the job dir
is then written in one command (with ``job.sbatch``, the record of what was submitted) and the
script's text given to sbatch on its stdin, so the job is what was rendered here. When
sbatch's outcome is unknown (it timed out, the SSH connection dropped during the submit), the
job is looked up by its tag before anything is cleaned up, and adopted if it exists. When
nothing was queued, nothing is left behind.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..errors import (
    SlurmError,
    SlurmRayError,
    SlurmUnavailable,
    SubmitOutcomeUnknown,
    TransportError,
)
from ..scheduler.interface import Scheduler
from ..scheduler.kinds import kind_for_mode
from ..spec import ClusterSpec
from ..transport import Transport
from . import packs
from .directory import JobDir, probe_site
from .script import bootstrap_settings, render_job_script

log = logging.getLogger(__name__)

__all__ = ["SubmitOutcomeUnknown", "prepare", "submit", "submit_or_adopt"]


async def prepare(
    transport: Transport, spec: ClusterSpec, cluster_id: str, job_dir: str | None = None
) -> tuple[JobDir, str]:
    """The job dir (its root checked; nothing written there yet) and the job script for it.

    With ``environment = "pack"``, the script names the archive and its content hash: the
    environment is packed on this side first if neither side has the archive yet."""
    site = await probe_site(transport, spec.job_dir_root, spec.export_env)
    directory = JobDir(transport, job_dir or f"{site.job_dir_root.rstrip('/')}/{cluster_id}")
    on_this_machine = kind_for_mode(spec.mode).on_this_machine
    command = directory.bootstrap_command(packs.bootstrap_python(spec), local_mode=on_this_machine)
    if spec.environment == "pack":  # named by what is installed, with its content's hash
        env = packs.describe_environment()  # (packed here if missing; shipped by submit())
        pack = await packs.prepare_pack(transport, env, site.job_dir_root)
        command = packs.bootstrap_command(command, pack)
    script = render_job_script(
        spec,
        cluster_id=cluster_id,
        job_dir=directory.path,
        command=command,
        exported=site.exported,
    )
    return directory, script


async def submit(
    slurm: Scheduler,
    job_dir: JobDir,
    spec: ClusterSpec,
    cluster_id: str,
    *,
    script: str,
    lease: str,
    timeout: float,
    forget_record: Callable[[], None],
) -> str:
    """Write the job dir and submit it (or adopt what a lost answer queued): the job id.

    Whatever fails before anything is queued removes the job dir and calls ``forget_record``.
    """
    try:
        if spec.environment == "pack":
            root = job_dir.path.rsplit("/", 1)[0]
            await packs.ship_pack(job_dir.transport, packs.describe_environment(), root)
        settings = bootstrap_settings(spec, cluster_id)
        await job_dir.create(settings, script=script, lease=lease)
    except SlurmRayError:
        forget_record()  # nothing was written: leave nothing behind
        raise
    try:
        return await submit_or_adopt(slurm, script, cluster_id, timeout=timeout)
    except SlurmError as exc:  # nothing was queued
        forget_record()
        await job_dir.remove()
        if isinstance(exc, SlurmUnavailable):
            raise slurm.unreachable(exc) from None
        raise


async def submit_or_adopt(slurm: Scheduler, script: str, cluster_id: str, *, timeout: float) -> str:
    """The job id of the submitted job script, its text on sbatch's stdin (or of the job a
    lost answer had queued).

    SlurmError: nothing was queued (Slurm refused, or the lookup found no job).
    SubmitOutcomeUnknown: maybe queued; the caller keeps the record so ``gc`` can find it.
    """
    try:
        return await slurm.submit(script, timeout=timeout)
    except SlurmError:
        raise
    except TransportError as exc:
        unknown = exc
    log.warning("the outcome of submitting %s is unknown (%s); looking it up", cluster_id, unknown)
    try:
        job_id = await slurm.find_tagged(cluster_id)
    except SlurmRayError as exc:
        raise SubmitOutcomeUnknown(
            f"submitting {cluster_id} had no clear outcome ({unknown}) and Slurm could not be "
            f"asked about it ({exc}); its record is kept: `jupyter slurm-ray gc` finds the job "
            "if it was queued"
        ) from None
    if job_id is None:
        raise SlurmError(f"submitting {cluster_id} failed ({unknown}); no job was queued")
    log.warning("adopted job %s of %s, queued before the answer was lost", job_id, cluster_id)
    return job_id
