"""JupyterHub on the testbed: PAM logins, each user's server a Slurm job (batchspawner).

scripts/hub starts the hub with this file and the ``JSR_HUB_*`` variables below; a site's own
hub differs in addresses and paths only. The parts that matter for jupyter_slurm_ray:

- ``Spawner.cmd`` is ``jupyterhub-singleuser`` of an environment that has jupyter_slurm_ray
  (both extensions enabled by its install), Ray, and ``jupyterhub`` + ``batchspawner`` beside
  them (batchspawner runs ``batchspawner-singleuser`` in the job, which calls the hub back);
- ``Spawner.environment`` carries the site's ``JUPYTER_SLURM_RAY_*`` defaults to the server and
  to its kernels, which submit their clusters from inside the server's job.
"""

import os

c = get_config()  # type: ignore[name-defined]  # noqa: F821  (JupyterHub's config loader)

env = os.environ
singleuser = env["JSR_HUB_SINGLEUSER_VENV"]
state = env["JSR_HUB_STATE_DIR"]

# -- where it listens: the proxy for browsers, the hub's API for the compute nodes ----------
c.JupyterHub.bind_url = env["JSR_HUB_PUBLIC_URL"]  # the login node's address
c.JupyterHub.hub_bind_url = env["JSR_HUB_API_URL"]  # on the cluster network
c.ConfigurableHTTPProxy.command = [env["JSR_HUB_PROXY_COMMAND"]]
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:8001"
c.ConfigurableHTTPProxy.pid_file = os.path.join(state, "proxy.pid")
c.JupyterHub.pid_file = os.path.join(state, "jupyterhub.pid")
c.JupyterHub.db_url = "sqlite:///" + os.path.join(state, "jupyterhub.sqlite")
c.JupyterHub.cookie_secret_file = os.path.join(state, "cookie_secret")
c.JupyterHub.cleanup_servers = True  # the hub's shutdown stops (scancels) the servers

# -- who may log in: the system's users, checked by PAM -------------------------------------
c.JupyterHub.authenticator_class = "pam"
c.PAMAuthenticator.open_sessions = False
c.Authenticator.allowed_users = set(env["JSR_HUB_USERS"].split(","))

# -- each user's server: a one-CPU Slurm job on a compute node, as that user ----------------
c.JupyterHub.spawner_class = "batchspawner.SlurmSpawner"
# the hub runs as root: no sudo
c.BatchSpawnerBase.exec_prefix = "/usr/sbin/runuser -u {username} --"
c.BatchSpawnerBase.batchspawner_singleuser_cmd = f"{singleuser}/bin/batchspawner-singleuser"
c.Spawner.cmd = [f"{singleuser}/bin/jupyterhub-singleuser"]
c.Spawner.default_url = "/lab"
c.SlurmSpawner.req_partition = env.get("JSR_HUB_PARTITION", "debug")
c.SlurmSpawner.req_nprocs = "1"
c.SlurmSpawner.req_memory = "1G"
c.SlurmSpawner.req_runtime = env.get("JSR_HUB_RUNTIME", "2:00:00")
c.SlurmSpawner.startup_poll_interval = 0.5
# What batchspawner makes of `squeue -h -j ID -o '%T %B'` that is neither RUNNING nor PENDING:
# it knows two of slurmctld's failures as "unknown" and takes any other answer for a job that
# ended, and the hub then stops a server that runs (with the clusters its kernels own). Only
# Slurm's "Invalid job id" and a job's own final state say that; any other failure ("Zero
# Bytes were transmitted or received" under load, a fork that failed) is unknown, asked again.
c.SlurmSpawner.state_unknown_re = r"^(?![A-Z_]+(?:\s|$))(?!slurm_load_jobs error: Invalid job id)\S"
c.Spawner.start_timeout = 180
c.Spawner.http_timeout = 120
c.Spawner.environment = {
    "PATH": f"{singleuser}/bin:/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    # the testbed's site defaults for clusters (a node has 2 CPUs, the server holds one)
    "JUPYTER_SLURM_RAY_CPUS_PER_NODE": "1",
    "JUPYTER_SLURM_RAY_OBJECT_STORE_MEMORY": "200M",
}
