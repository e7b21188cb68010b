"""Submitting a cluster's job so that no job is ever left without its record.

When sbatch's outcome is unknown (it timed out, the SSH connection dropped during the submit),
the job is looked up by its tag before anything is cleaned up, and adopted if it exists.
"""

from __future__ import annotations

import logging

from .errors import SlurmError, SlurmRayError, SubmitOutcomeUnknown, TransportError
from .slurm import SlurmClient

log = logging.getLogger(__name__)

__all__ = ["SubmitOutcomeUnknown", "submit_or_adopt"]


async def submit_or_adopt(
    slurm: SlurmClient, script_path: str, cluster_id: str, *, timeout: float
) -> str:
    """The job id of the submitted job script (or of the job a lost answer had queued).

    SlurmError: nothing was queued (Slurm refused, or the lookup found no job).
    SubmitOutcomeUnknown: maybe queued; the caller keeps the record so ``gc`` can find it.
    """
    try:
        return await slurm.submit(script_path, timeout=timeout)
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
