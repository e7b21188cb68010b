"""``slurm_ray://NAME``: the address scheme that lets Ray's Jobs tools find a cluster of
jupyter_slurm_ray by its name (``ray job submit --address slurm_ray://NAME -- …``,
``RAY_ADDRESS=slurm_ray://NAME``, ``JobSubmissionClient("slurm_ray://NAME")``).

Ray imports the module an address's scheme names and calls this function of it; the work is
``jupyter_slurm_ray.client.jobaddress``'s, with this process's registry and transports.
"""

from __future__ import annotations

from typing import Any

__all__ = ["get_job_submission_client_cluster_info"]


def get_job_submission_client_cluster_info(address: str, **kwargs: Any) -> Any:
    """Ray's hook: the ``ClusterInfo`` (dashboard address, token header) of cluster NAME."""
    from jupyter_slurm_ray.client import jobaddress
    from jupyter_slurm_ray.session import get_session

    session = get_session()
    return jobaddress.get_job_submission_client_cluster_info(
        address, session.registry(), session.transports, **kwargs
    )
