"""Configuration: SlurmRay traits, profiles, env overrides, and the precedence of resolve_spec."""

from __future__ import annotations

from pathlib import Path

import pytest
from traitlets import TraitError
from traitlets.config import Config
from traitlets.config.loader import PyFileConfigLoader

from jupyter_slurm_ray.config import (
    SPEC_SETTINGS,
    SlurmRay,
    effective_setting,
    load_profiles,
    make_transport,
    profiles_path,
    resolve_spec,
)
from jupyter_slurm_ray.errors import SpecError
from jupyter_slurm_ray.spec import FIELD_NAMES
from jupyter_slurm_ray.transport import LocalTransport, SSHTransport

PROFILES = """
[profiles.gpu-small]
description = "one GPU node for an hour"
nodes = 1
gpus_per_node = 1
time = "1:00:00"

[profiles.wide]
nodes = 3
cpus-per-node = 2
"""


@pytest.fixture
def profiles(tmp_path: Path) -> Path:
    path = tmp_path / "profiles.toml"
    path.write_text(PROFILES)
    return path


def test_every_cluster_setting_but_the_name_is_a_configurable_trait():
    traits = set(SlurmRay.class_trait_names(config=True))
    assert set(SPEC_SETTINGS) == set(FIELD_NAMES) - {"name"}
    assert set(SPEC_SETTINGS) <= traits
    assert {"default_profile", "profiles_file", "login_host", "command_prefix"} <= traits


def test_unset_settings_are_none_so_the_spec_defaults_show_through():
    spec, sources = resolve_spec(config=SlurmRay(), environ={})
    assert spec.nodes == 1 and spec.python is None
    assert set(sources.values()) == {"default"}


def test_precedence_is_argument_then_profile_then_env_then_config(profiles: Path):
    config = SlurmRay(
        time="2:00:00", nodes=2, partition="debug", account="acct", profiles_file=str(profiles)
    )
    environ = {"JUPYTER_SLURM_RAY_NODES": "5", "JUPYTER_SLURM_RAY_PARTITION": "short"}
    spec, sources = resolve_spec(
        {"time": "30"}, profile="gpu-small", config=config, environ=environ
    )
    assert (spec.time, sources["time"]) == ("00:30:00", "argument")
    assert (spec.nodes, sources["nodes"]) == (1, "profile gpu-small")
    assert (spec.partition, sources["partition"]) == ("short", "env JUPYTER_SLURM_RAY_PARTITION")
    assert (spec.account, sources["account"]) == ("acct", "config SlurmRay.account")
    assert (spec.qos, sources["qos"]) == (None, "default")


def test_default_profile_applies_when_none_is_named(profiles: Path):
    config = SlurmRay(profiles_file=str(profiles), default_profile="wide")
    spec, sources = resolve_spec(config=config, environ={})
    assert (spec.nodes, spec.cpus_per_node) == (3, 2)
    assert sources["cpus_per_node"] == "profile wide"


def test_env_can_choose_the_profiles_file_and_default_profile(profiles: Path):
    environ = {
        "JUPYTER_SLURM_RAY_PROFILES_FILE": str(profiles),
        "JUPYTER_SLURM_RAY_DEFAULT_PROFILE": "gpu-small",
    }
    spec, sources = resolve_spec(environ=environ)
    assert spec.gpus_per_node == 1 and sources["gpus_per_node"] == "profile gpu-small"


def test_env_values_are_parsed_per_setting():
    environ = {
        "JUPYTER_SLURM_RAY_SETUP": "module load ray\nsource /venv/bin/activate",
        "JUPYTER_SLURM_RAY_EXTRA_SBATCH": "--mail-type=END '--begin=now+1'",
        "JUPYTER_SLURM_RAY_ENV": '{"OMP_NUM_THREADS": "1"}',
        "JUPYTER_SLURM_RAY_EXCLUSIVE": "yes",
        "JUPYTER_SLURM_RAY_PORT_RANGE": "30000-30999",
        "JUPYTER_SLURM_RAY_MEM_PER_NODE": "2G",
    }
    spec, _ = resolve_spec(environ=environ)
    assert spec.setup == ("module load ray", "source /venv/bin/activate")
    assert spec.extra_sbatch == ("--mail-type=END", "--begin=now+1")
    assert spec.env == (("OMP_NUM_THREADS", "1"),)
    assert spec.exclusive is True
    assert spec.port_range == (30000, 30999)
    assert spec.mem_per_node == 2048


def test_a_bad_env_value_names_the_variable():
    with pytest.raises(SpecError, match="env JUPYTER_SLURM_RAY_NODES"):
        resolve_spec(environ={"JUPYTER_SLURM_RAY_NODES": "0"})
    with pytest.raises(SpecError, match="JUPYTER_SLURM_RAY_ENV"):
        resolve_spec(environ={"JUPYTER_SLURM_RAY_ENV": "[1, 2]"})


def test_a_bad_config_value_is_refused_when_set_with_the_allowed_values():
    config = SlurmRay()
    with pytest.raises(TraitError, match=r"time: '25:99' is not allowed; a Slurm walltime"):
        config.time = "25:99"
    with pytest.raises(TraitError, match="nodes"):
        SlurmRay(nodes=0)
    assert config.time is None


def test_settings_come_from_an_ipython_config_file(tmp_path: Path):
    (tmp_path / "ipython_config.py").write_text(
        "c = get_config()\n"
        "c.SlurmRay.time = '2:00:00'\n"
        "c.SlurmRay.setup = ['module load ray']\n"
        "c.SlurmRay.command_prefix = ['sudo', '-u', 'me', '--']\n"
    )
    loaded = PyFileConfigLoader("ipython_config.py", path=str(tmp_path)).load_config()
    config = SlurmRay(config=loaded)
    spec, sources = resolve_spec(config=config, environ={})
    assert spec.time == "02:00:00" and sources["time"] == "config SlurmRay.time"
    assert spec.setup == ("module load ray",)
    assert isinstance(make_transport(config, environ={}), LocalTransport)


def test_a_parent_config_reaches_the_configurable():
    class Parent(SlurmRay):  # stands in for an app whose config holds a SlurmRay section
        pass

    parent = Parent(config=Config({"SlurmRay": {"partition": "short"}}))
    assert SlurmRay(parent=parent).partition == "short"


def test_profiles_file_defaults_to_the_jupyter_config_dir(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(tmp_path))
    assert profiles_path(SlurmRay(), environ={}) == tmp_path / "slurm_ray_profiles.toml"


def test_profiles_keep_their_description(profiles: Path):
    loaded = load_profiles(profiles)
    assert sorted(loaded) == ["gpu-small", "wide"]
    assert loaded["gpu-small"].description == "one GPU node for an hour"
    assert "description" not in loaded["gpu-small"].settings


def test_an_unknown_profile_names_the_file_and_the_profiles_it_has(profiles: Path):
    config = SlurmRay(profiles_file=str(profiles))
    with pytest.raises(SpecError) as caught:
        resolve_spec(profile="gpu-huge", config=config, environ={})
    message = str(caught.value)
    assert "gpu-huge" in message and str(profiles) in message and "gpu-small, wide" in message
    assert "\n" not in message


def test_an_unknown_profile_without_a_file_says_the_file_is_missing(tmp_path: Path):
    config = SlurmRay(profiles_file=str(tmp_path / "nope.toml"))
    with pytest.raises(SpecError, match="does not exist"):
        resolve_spec(profile="gpu-small", config=config, environ={})


def test_a_malformed_profiles_file_is_one_line_naming_the_file(tmp_path: Path):
    path = tmp_path / "bad.toml"
    path.write_text("[profiles.gpu]\nnodes = = 2\n")
    with pytest.raises(SpecError) as caught:
        resolve_spec(profile="gpu", config=SlurmRay(profiles_file=str(path)), environ={})
    message = str(caught.value)
    assert str(path) in message and "line 2" in message and "\n" not in message


def test_a_profile_with_an_unknown_setting_names_profile_and_setting(tmp_path: Path):
    path = tmp_path / "p.toml"
    path.write_text("[profiles.gpu]\ngpus = 2\n")
    with pytest.raises(SpecError, match=r"profile gpu in .*p\.toml: gpus"):
        load_profiles(path)


def test_a_bad_profile_value_names_the_profile(profiles: Path, tmp_path: Path):
    path = tmp_path / "p.toml"
    path.write_text("[profiles.gpu]\nnodes = 0\n")
    with pytest.raises(SpecError, match=r"set by profile gpu"):
        resolve_spec(profile="gpu", config=SlurmRay(profiles_file=str(path)), environ={})


def test_local_transport_runs_through_the_command_prefix():
    config = SlurmRay(command_prefix=["runuser", "-u", "alice", "--"])
    transport = make_transport(config, environ={})
    assert isinstance(transport, LocalTransport)
    assert transport.command_prefix == ("runuser", "-u", "alice", "--")
    from_env = make_transport(environ={"JUPYTER_SLURM_RAY_COMMAND_PREFIX": "sudo -u bob --"})
    assert from_env.target == "local (sudo -u bob --)"


def test_a_login_host_means_ssh_with_the_given_key_and_known_hosts():
    config = SlurmRay(
        login_host="login.example.org",
        login_user="me",
        login_port=2222,
        ssh_key="/keys/me",
        known_hosts="/keys/known_hosts",
    )
    transport = make_transport(config, environ={})
    assert isinstance(transport, SSHTransport)
    assert transport.target == "ssh://me@login.example.org:2222"
    assert (transport.client_keys, transport.known_hosts) == (["/keys/me"], "/keys/known_hosts")


def test_effective_setting_names_its_source():
    config = SlurmRay(poll_interval=2.0)
    assert effective_setting("poll_interval", config, {}) == (2.0, "config SlurmRay.poll_interval")
    environ = {"JUPYTER_SLURM_RAY_POLL_INTERVAL": "0.5"}
    assert effective_setting("poll_interval", config, environ) == (
        0.5,
        "env JUPYTER_SLURM_RAY_POLL_INTERVAL",
    )
    assert effective_setting("login_host", None, {}) == (None, "default")


@pytest.mark.parametrize(
    "name", ["connect_timeout", "poll_interval", "steady_poll_interval", "submit_timeout"]
)
def test_the_package_seconds_must_be_positive_from_config_and_environment(name: str):
    with pytest.raises(TraitError, match=rf"SlurmRay.{name} = 0.0: a positive number"):
        SlurmRay(**{name: 0.0})
    environ = {f"JUPYTER_SLURM_RAY_{name.upper()}": "-3"}
    with pytest.raises(SpecError, match=rf"{name}: '-3' is not allowed.*JUPYTER_SLURM_RAY_"):
        effective_setting(name, None, environ)


def test_the_login_port_must_be_a_port():
    with pytest.raises(TraitError, match="login_port = 70000: a port from 1 to 65535"):
        SlurmRay(login_port=70000)
    assert SlurmRay(login_port=2222).login_port == 2222


# ----------------------------------------------------------------------------- former names


def test_the_former_trait_idle_timeout_warns_and_sets_owner_timeout():
    with pytest.warns(
        DeprecationWarning, match=r"SlurmRay.idle_timeout is now named SlurmRay.owner"
    ):
        config = SlurmRay(config=Config({"SlurmRay": {"idle_timeout": 60}}))
    assert config.owner_timeout == 60
    spec, sources = resolve_spec(config=config, environ={})
    assert (spec.owner_timeout, sources["owner_timeout"]) == (60, "config SlurmRay.owner_timeout")
    config.owner_timeout = 70  # the setting's own name, set later, wins
    assert resolve_spec(config=config, environ={})[0].owner_timeout == 70


def test_both_names_of_the_lease_setting_in_one_config_are_refused_naming_both():
    both = Config({"SlurmRay": {"idle_timeout": 60, "owner_timeout": 70}})
    with pytest.raises(TraitError, match=r"SlurmRay.idle_timeout = 60 and SlurmRay.owner_timeout"):
        SlurmRay(config=both)


def test_a_bad_value_under_the_former_trait_name_is_refused_naming_it():
    config = SlurmRay()
    with pytest.raises(TraitError, match=r"^idle_timeout: 3.0 is not allowed; a number of seconds"):
        config.idle_timeout = 3
    assert config.owner_timeout is None and config.idle_timeout is None


def test_the_former_name_in_the_environment_or_a_profile_warns_and_sets_owner_timeout(
    tmp_path: Path,
):
    with pytest.warns(DeprecationWarning, match="idle_timeout is now named owner_timeout"):
        spec, sources = resolve_spec(environ={"JUPYTER_SLURM_RAY_IDLE_TIMEOUT": "45"})
    assert spec.owner_timeout == 45
    assert sources["owner_timeout"] == "env JUPYTER_SLURM_RAY_IDLE_TIMEOUT"
    path = tmp_path / "p.toml"
    path.write_text("[profiles.old]\nidle-timeout = 90\n")
    config = SlurmRay(profiles_file=str(path))
    with pytest.warns(DeprecationWarning, match="idle_timeout is now named owner_timeout"):
        spec, sources = resolve_spec(profile="old", config=config, environ={})
    assert (spec.owner_timeout, sources["owner_timeout"]) == (90, "profile old")


def test_both_names_in_the_environment_or_a_profile_are_refused_naming_both(tmp_path: Path):
    environ = {"JUPYTER_SLURM_RAY_IDLE_TIMEOUT": "45", "JUPYTER_SLURM_RAY_OWNER_TIMEOUT": "50"}
    with pytest.raises(SpecError, match=r"IDLE_TIMEOUT.*JUPYTER_SLURM_RAY_OWNER_TIMEOUT"):
        resolve_spec(environ=environ)
    path = tmp_path / "p.toml"
    path.write_text("[profiles.both]\nidle_timeout = 90\nowner_timeout = 95\n")
    config = SlurmRay(profiles_file=str(path))
    with pytest.raises(SpecError, match=r"^idle_timeout: 90 is not allowed; .*owner_timeout"):
        resolve_spec(profile="both", config=config, environ={})
