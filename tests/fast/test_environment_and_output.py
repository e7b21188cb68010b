"""What reaches the job's environment, and command output that is not UTF-8."""

from __future__ import annotations

import pytest

from jupyter_slurm_ray.job.script import render_job_script
from jupyter_slurm_ray.spec import ClusterSpec
from jupyter_slurm_ray.spec.environment import drop_reason, exported_names, parse_env0
from jupyter_slurm_ray.transport import LocalTransport


@pytest.mark.parametrize(
    "name",
    [
        "RAY_AUTH_TOKEN",
        "RAY_AUTH_MODE",
        "JUPYTERHUB_API_TOKEN",
        "JPY_SESSION_NAME",
        "SLURM_MEM_PER_CPU",
        "SBATCH_PARTITION",
        "GITHUB_TOKEN",
        "aws_secret_access_key",
        "DB_PASSWORD",
        "MY_API_KEY",
        "JUPYTER_SLURM_RAY_COMMAND_PREFIX",
        "BASH_FUNC_module%%",
    ],
)
def test_credentials_and_an_outer_allocations_variables_are_not_exported(name):
    assert drop_reason(name) is not None
    assert exported_names([name, "PATH"]) == ["PATH"]


def test_the_job_script_names_exactly_the_exported_variables():
    names = exported_names(["PATH", "HOME", "RAY_AUTH_TOKEN", "VIRTUAL_ENV", "LANG"])
    script = render_job_script(
        ClusterSpec(time="10", env={"OMP_NUM_THREADS": "1"}),
        cluster_id="abcd-0001",
        job_dir="/j/abcd-0001",
        command=["true"],
        exported=names,
    )
    assert "#SBATCH --export=HOME,LANG,PATH,VIRTUAL_ENV\n" in script
    assert "export OMP_NUM_THREADS=1\n" in script
    empty = render_job_script(
        ClusterSpec(time="10"), cluster_id="abcd-0001", job_dir="/j/abcd-0001", command=["true"]
    )
    assert "#SBATCH --export=NONE\n" in empty


def test_env0_output_gives_home_and_names_only():
    home, names = parse_env0("/home/a\0PATH=/bin\0X=a=b\nY=fake\0EMPTY=\0")
    assert home == "/home/a" and names == ["PATH", "X", "EMPTY"]


async def test_output_that_is_not_utf8_is_decoded_with_replacement():
    result = await LocalTransport().run(["printf", "caf\\351 \\377\\n"])
    assert result.stdout == "caf\ufffd \ufffd\n"
