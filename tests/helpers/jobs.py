"""Submitting a rendered job script as the package would, for tests that need a bare job."""

from __future__ import annotations

from jupyter_slurm_ray.slurm import SlurmClient
from jupyter_slurm_ray.transport import Transport


async def submit_script(transport: Transport, script: str, job_dir: str) -> str:
    """Write ``script`` to ``job_dir/job.sbatch`` (dir 0700) and sbatch it; the job id."""
    await transport.make_dir(job_dir, 0o700)
    path = f"{job_dir}/job.sbatch"
    await transport.write_file(path, script, 0o700)
    return await SlurmClient(transport).submit(path)
