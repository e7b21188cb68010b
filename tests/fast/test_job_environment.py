"""The job's environment is an allow-list: the default list, ``export_env``, nothing else; and
``extra_sbatch`` (a worker group's too) refuses what would undo the cluster's guarantees."""

from __future__ import annotations

import os

import pytest
from traitlets import TraitError

from jupyter_slurm_ray.cluster import SlurmRayCluster
from jupyter_slurm_ray.config import SlurmRay, resolve_spec
from jupyter_slurm_ray.errors import SpecError
from jupyter_slurm_ray.spec import ClusterSpec
from jupyter_slurm_ray.spec.environment import DEFAULT_EXPORT, drop_reason, exported_names
from jupyter_slurm_ray.ui.magic_args import parse, spec_arguments

# What a kernel's environment holds and no job may get.
SECRETS = {
    "DATABASE_URL": "postgres://app:pw-4711@db/app",
    "GH_PAT": "ghp_4711",
    "HTTPS_PROXY": "http://user:pw-4711@proxy:3128",
    "https_proxy": "http://user:pw-4711@proxy:3128",
    "ALL_PROXY": "socks5://user:pw-4711@proxy:1080",
    "KUBECONFIG": "/home/a/.kube/config",
    "NETRC": "/home/a/.netrc",
    "KRB5CCNAME": "FILE:/tmp/krb5cc_1000",
    "AWS_ACCESS_KEY_ID": "AKIA4711",
    "GOOGLE_APPLICATION_CREDENTIALS": "/home/a/key.json",
    "SSH_AUTH_SOCK": "/tmp/ssh-x/agent.1",
    "DISPLAY": ":0",
}
DEFAULTS_PRESENT = [
    "PATH",
    "LD_LIBRARY_PATH",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "HOME",
    "USER",
    "LOGNAME",
    "TMPDIR",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "MODULEPATH",
    "MODULESHOME",
    "LOADEDMODULES",
    "_LMFILES_",
    "LMOD_CMD",
    "__LMOD_REF_COUNT_PATH",
    "_ModuleTable001_",
    "MODULES_CMD",
    "BASH_ENV",
]
# What a login session of an ordinary user holds besides (su -l, ssh, a desktop's terminal).
LOGIN_SESSION = {
    "HOME": "/home/a",
    "USER": "a",
    "LOGNAME": "a",
    "SHELL": "/bin/bash",
    "MAIL": "/var/mail/a",
    "TERM": "xterm-256color",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "PWD": "/home/a",
    "OLDPWD": "/home/a",
    "SHLVL": "1",
    "XDG_SESSION_ID": "4",
    "XDG_RUNTIME_DIR": "/run/user/1000",
    "MOTD_SHOWN": "pam",
    "EDITOR": "vi",
}
TIME = {"time": "10"}


def test_the_default_list_is_small_and_documented():
    assert len(DEFAULT_EXPORT) < 30
    assert {"PATH", "LANG", "LC_*", "TZ", "HOME", "USER", "TMPDIR", "MODULEPATH"} <= {
        *DEFAULT_EXPORT
    }


def test_by_default_only_the_default_list_goes():
    names = [*SECRETS, *DEFAULTS_PRESENT, "FOO_SETTING", "EDITOR", "OMP_NUM_THREADS"]
    assert exported_names(names) == sorted(DEFAULTS_PRESENT)
    for name in SECRETS:
        assert drop_reason(name) == "not in the default list nor in export_env"


def test_export_env_adds_names_and_patterns_but_a_pattern_skips_secret_looking_names():
    names = ["FOO_SETTING", "MYAPP_HOME", "MYAPP_URL", "MYAPP_TOKEN", "MYAPP_DB_PASSWORD", "X"]
    assert exported_names(names, ["FOO_SETTING", "MYAPP_*"]) == [
        "FOO_SETTING",
        "MYAPP_HOME",
        "MYAPP_URL",
    ]
    assert "named like a secret" in str(drop_reason("MYAPP_TOKEN", ["MYAPP_*"]))
    assert exported_names(names, ["MYAPP_TOKEN"]) == ["MYAPP_TOKEN"]  # named: it goes


def test_everything_else_never_goes_even_with_a_catch_all_pattern():
    names = [
        *SECRETS,
        "EDITOR",
        "SLURM_MEM_PER_NODE",
        "SRUN_CPUS_PER_TASK",
        "RAY_AUTH_TOKEN_PATH",
        "JUPYTERHUB_API_TOKEN",
        "JPY_SESSION_NAME",
        "JUPYTER_SLURM_RAY_COMMAND_PREFIX",
        "BASH_FUNC_module%%",
    ]
    spec = ClusterSpec(**TIME, export_env="*")
    exported = exported_names(names, spec.export_env)
    assert "EDITOR" in exported and "KUBECONFIG" in exported  # the user asked for all
    never = {n for n in names if n.startswith(("SLURM", "SRUN", "RAY_AUTH", "JUPYTERHUB", "JPY"))}
    assert not never & set(exported)
    assert not {"GH_PAT", "GOOGLE_APPLICATION_CREDENTIALS", "AWS_ACCESS_KEY_ID"} & set(exported)
    assert "BASH_FUNC_module%%" not in exported


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ("RAY_AUTH_TOKEN", "each cluster has its own token"),
        ("SLURM_MEM_PER_NODE", "Slurm sets the job's own"),
        ("SLURM_*", "Slurm sets the job's own"),
        ("SRUN_CPUS_PER_TASK", "Slurm sets the job's own"),
        ("JUPYTERHUB_API_TOKEN", "the notebook server's"),
        ("JPY_*", "stay with the kernel"),
        ("JUPYTER_SLURM_RAY_PYTHON", "the client's"),
        ("A-B", "variable names (A-Z a-z 0-9 _) or glob patterns"),
        ("1ABC", "variable names"),
        ("$HOME", "variable names"),
    ],
)
def test_export_env_refuses_what_can_never_go_saying_why(entry, words):
    with pytest.raises(SpecError) as refused:
        ClusterSpec(**TIME, export_env=[entry])
    assert refused.value.field == "export_env" and refused.value.value == entry
    assert words in str(refused.value)


def test_export_env_is_a_setting_everywhere_a_setting_is(tmp_path):
    environ = {"JUPYTER_SLURM_RAY_EXPORT_ENV": "FOO_SETTING, MYAPP_*"}
    spec, sources = resolve_spec(environ=environ)
    assert spec.export_env == ("FOO_SETTING", "MYAPP_*")
    assert sources["export_env"] == "env JUPYTER_SLURM_RAY_EXPORT_ENV"
    spec, sources = resolve_spec(config=SlurmRay(export_env=["FOO_SETTING"]), environ={})
    assert (spec.export_env, sources["export_env"]) == (
        ("FOO_SETTING",),
        "config SlurmRay.export_env",
    )
    with pytest.raises(TraitError, match="each cluster has its own token"):
        SlurmRay(export_env=["RAY_AUTH_TOKEN"])
    profiles = tmp_path / "profiles.toml"
    profiles.write_text('[profiles.app]\nexport_env = ["MYAPP_*"]\n')
    spec, sources = resolve_spec(profile="app", config=SlurmRay(profiles_file=str(profiles)))
    assert (spec.export_env, sources["export_env"]) == (("MYAPP_*",), "profile app")
    arguments = spec_arguments(parse("up -t 10 --export-env FOO_SETTING,MYAPP_*"))
    assert ClusterSpec.from_mapping(arguments).export_env == ("FOO_SETTING", "MYAPP_*")
    spec = ClusterSpec.from_mapping({"time": "10", "export-env": ["FOO_SETTING"]})  # REST
    assert ClusterSpec.from_mapping(spec.to_dict()) == spec


async def test_script_lists_exactly_what_goes(transport, monkeypatch, tmp_path):
    # This process's environment is a login session's with secrets in it, whoever runs the
    # test: only PATH (the probe runs sh and python3 through it) is kept of the real one.
    for name in os.environ.keys() - {"PATH"}:
        monkeypatch.delenv(name)
    for name, value in {
        **LOGIN_SESSION,
        **SECRETS,
        "FOO_SETTING": "on",
        "MYAPP_HOME": "/a",
    }.items():
        monkeypatch.setenv(name, value)
    spec = ClusterSpec(**TIME, job_dir_root=str(tmp_path / "jobs"), export_env=["FOO_SETTING"])
    script = await SlurmRayCluster(spec, transport).script_async()
    (line,) = [line for line in script.splitlines() if line.startswith("#SBATCH --export=")]
    exported = line.removeprefix("#SBATCH --export=").split(",")
    # the default list's names (who: USER and LOGNAME), and what export_env names; no secret,
    # nor the session's other variables (SHELL, MAIL, TERM, XDG_*, EDITOR, …)
    assert exported == ["FOO_SETTING", "HOME", "LANG", "LC_ALL", "LOGNAME", "PATH", "USER"]


# -- extra_sbatch: what would undo the cluster's guarantees ---------------------------------------
@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ("--requeue", "a second Ray cluster"),
        ("--requ", "--requ abbreviates --requeue, which is refused"),
        ("--export=ALL", "an allow-list (script() shows it): name more variables in export_env"),
        ("--export-file=/tmp/env", "an allow-list: name variables in export_env"),
        ("--get-user-env", "your whole login environment"),
        ("--get-user-env=10L", "your whole login environment"),
        ("--uid=0", "the job runs as you"),
        ("--gid=0", "your groups"),
        ("--clusters=other", "on this cluster only"),
        ("--cluster=other", "on this cluster only"),
        ("--quiet", "the job's id"),
        ("--container=/img", "use the container setting"),
        ("--output=/tmp/x.out", "in its own job dir (%slurm_ray logs shows it)"),
        ("--error=/home/bob/x", "could be another user's"),
        ("--chdir=/tmp", "the job runs in its job dir"),
        ("--signal=USR1@60", "use the walltime_warning setting"),
        ("--comment=x", "it marks the job as this package's"),
        ("--job-name=x", "use the name setting"),
    ],
)
def test_extra_sbatch_refuses_what_would_undo_the_clusters_guarantees(entry, words):
    with pytest.raises(SpecError) as refused:
        ClusterSpec(**TIME, extra_sbatch=[entry])
    assert refused.value.field == "extra_sbatch" and words in str(refused.value)
    with pytest.raises(SpecError) as refused:  # a worker group's too, named as such
        ClusterSpec(**TIME, worker_groups={"gpu": {"extra_sbatch": [entry]}})
    assert refused.value.field == "worker_groups.gpu.extra_sbatch"
    assert words in str(refused.value)


def test_extra_sbatch_still_takes_the_options_that_keep_them():
    entries = ("--no-requeue", "--no-kill", "--mail-type=END", "--hold", "--gres=gpu:1")
    assert ClusterSpec(**TIME, extra_sbatch=list(entries)).extra_sbatch == entries
