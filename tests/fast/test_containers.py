"""Containers: the argv each runtime gets, the binds (GPU devices outside /dev too), the checks
of the `container` settings, and the bootstrap's fast failures. Pure (no runtime runs)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from jupyter_slurm_ray.errors import SpecError
from jupyter_slurm_ray.job.script import bootstrap_settings
from jupyter_slurm_ray.spec import ClusterSpec
from jupyter_slurm_ray.ui.magic_args import parse, spec_arguments

from ..helpers.bootstrap import bootstrap_module

container = bootstrap_module("container")
jsr_base = bootstrap_module("jsr_base")
BootstrapError, Config = jsr_base.BootstrapError, jsr_base.Config

JOB = "/home/alice/.jupyter-slurm-ray/jobs/c-1"


def test_apptainer_exec_binds_each_path_and_adds_nv_only_for_gpus() -> None:
    runtime = container.Apptainer("/usr/bin/apptainer")
    argv = runtime.argv("/images/ray.sif", [JOB, "/tmp"], False, ["ray", "start", "--head"])
    assert argv == [
        "/usr/bin/apptainer", "exec", "--bind", JOB, "--bind", "/tmp",
        "/images/ray.sif", "ray", "start", "--head",
    ]  # fmt: skip
    with_gpu = runtime.argv("docker://rayproject/ray:2.60.0", [JOB], True, ["ray"])
    assert with_gpu[:3] == ["/usr/bin/apptainer", "exec", "--nv"]
    assert with_gpu[-2:] == ["docker://rayproject/ray:2.60.0", "ray"]


def test_singularity_is_apptainer_with_its_own_command() -> None:
    argv = container.Singularity("/opt/bin/singularity").argv("/i.sif", ["/tmp"], True, ["x"])
    assert argv == ["/opt/bin/singularity", "exec", "--nv", "--bind", "/tmp", "/i.sif", "x"]


def test_charliecloud_binds_home_with_home_and_shares_tmp(monkeypatch) -> None:
    monkeypatch.setenv("HOME", "/home/alice")
    monkeypatch.setenv("USER", "alice")
    runtime = container.Charliecloud("/usr/bin/ch-run")
    argv = runtime.argv("/img", [JOB, "/tmp", "/var/gpus"], True, ["ray", "start"])
    assert argv == [
        "/usr/bin/ch-run", "--set-env", "--home", "--bind=/var/gpus", "/img", "--", "ray", "start",
    ]  # fmt: skip


def test_charliecloud_binds_a_job_dir_outside_home(monkeypatch) -> None:
    monkeypatch.setenv("HOME", "/users/alice")  # not /home/$USER: --home would move it
    monkeypatch.setenv("USER", "alice")
    argv = container.Charliecloud("ch-run").argv("/img", ["/users/alice/jobs/c"], False, ["ray"])
    assert argv == ["ch-run", "--set-env", "--bind=/users/alice/jobs/c", "/img", "--", "ray"]


def test_argv_keeps_odd_words_as_single_arguments() -> None:
    """Nothing goes through a shell: a word with spaces or quotes stays one argument."""
    word = '--resources={"a b": 1}; rm -rf ~'
    argv = container.Apptainer("apptainer").argv("/i.sif", ["/tmp"], False, ["ray", word])
    assert argv[-1] == word
    done = subprocess.run(["printf", "%s\\n", *argv[-2:]], capture_output=True, text=True)
    assert done.stdout.splitlines() == ["ray", word]


def test_adding_a_runtime_is_one_class() -> None:
    class Podman(container.Runtime):
        name, command = "podman", "podman"

        def argv(self, image, binds, gpus, command):
            return [self.executable, "run", *[f"-v={b}:{b}" for b in binds], image, *command]

    assert set(container.RUNTIMES) == {"apptainer", "singularity", "charliecloud"}
    assert Podman("podman").argv("img", ["/tmp"], False, ["ray"]) == [
        "podman", "run", "-v=/tmp:/tmp", "img", "ray",
    ]  # fmt: skip


def test_binds_that_a_runtime_cannot_express_are_refused() -> None:
    for path in ("/a,b", "/a:b", "/a b", "relative"):
        with pytest.raises(BootstrapError, match="cannot bind"):
            container.check_bind(path)
    assert container.check_bind(JOB) == JOB


def test_gpu_device_dirs_come_from_gres_conf_outside_dev(tmp_path: Path) -> None:
    (tmp_path / "gres.conf").write_text(
        "Name=gpu File=/var/lib/fake/gpu[0-1]\nName=gpu Type=a100 File=/dev/nvidia0\n"
        "NodeName=n[1-2] Name=gpu file=/opt/dev/gpu0\n"
    )
    dirs = container.gpu_device_dirs(str(tmp_path / "slurm.conf"))
    assert dirs == ["/opt/dev", "/var/lib/fake"]
    assert container.gpu_device_dirs(str(tmp_path / "none" / "slurm.conf")) == []


def test_no_container_no_prefix(tmp_path: Path) -> None:
    assert container.ray_command_prefix(Config(cluster_id="c"), tmp_path, True) == []


def test_prefix_finds_the_runtime_and_checks_the_image(tmp_path: Path, monkeypatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ch-run").write_text("#!/bin/sh\n")
    (bin_dir / "ch-run").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("HOME", "/nonexistent")
    config = Config(cluster_id="c", container=str(tmp_path), container_runtime="auto")
    prefix = container.ray_command_prefix(config, tmp_path / "job", False, env={})
    assert prefix == [
        str(bin_dir / "ch-run"), "--set-env", f"--bind={tmp_path / 'job'}", str(tmp_path), "--",
    ]  # fmt: skip
    missing = Config(cluster_id="c", container=str(tmp_path / "nope"), container_runtime="auto")
    with pytest.raises(BootstrapError, match=r"^container: the image .*nope does not exist"):
        container.ray_command_prefix(missing, tmp_path, False, env={})
    apptainer = Config(cluster_id="c", container=str(tmp_path), container_runtime="apptainer")
    with pytest.raises(BootstrapError, match=r"^container_runtime apptainer: no `apptainer`"):
        container.ray_command_prefix(apptainer, tmp_path, False, env={})
    unknown = Config(cluster_id="c", container=str(tmp_path), container_runtime="docker")
    with pytest.raises(BootstrapError, match="container_runtime must be one of"):
        container.ray_command_prefix(unknown, tmp_path, False, env={})


def test_version_probe_reports_a_missing_ray_with_the_output(tmp_path: Path) -> None:
    fake = tmp_path / "runtime"
    fake.write_text('#!/bin/sh\nshift 2\nPATH=/nonexistent exec /bin/sh "$@"\n')  # IMAGE sh
    fake.chmod(0o755)
    with pytest.raises(BootstrapError, match="Ray does not run in the image") as info:
        container.container_versions([str(fake), "image"], dict(os.environ))
    assert any("no ray command" in line for line in info.value.log)


def test_settings_are_checked_with_the_field_named() -> None:
    spec = ClusterSpec(container="/images/ray.sif", container_runtime="apptainer")
    assert (spec.container, spec.container_runtime) == ("/images/ray.sif", "apptainer")
    assert ClusterSpec().container_runtime == "auto"
    for bad in ("-v /x", "/a b", "/a,b", "", "x\ny"):
        with pytest.raises(SpecError, match=r"^container: "):
            ClusterSpec(container=bad)
    with pytest.raises(SpecError, match=r"^container_runtime: .*'charliecloud'"):
        ClusterSpec(container_runtime="docker")


def test_settings_reach_the_bootstrap_and_the_magic_options() -> None:
    spec = ClusterSpec(container="/img", container_runtime="charliecloud")
    settings = bootstrap_settings(spec, "c-1")
    assert (settings["container"], settings["container_runtime"]) == ("/img", "charliecloud")
    config = Config(cluster_id="c-1")
    assert (config.container, config.container_runtime) == (None, "auto")
    args = parse("up --container /img --container-runtime apptainer")
    assert spec_arguments(args)["container"] == "/img"
    assert spec_arguments(args)["container_runtime"] == "apptainer"
