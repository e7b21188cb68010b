"""Environment packs without a cluster: the key, the kind of environment, the packing commands,
the setting's validation, the job's command, and the bootstrap's unpack on a real tar file."""

from __future__ import annotations

import hashlib
import io
import os
import sys
import tarfile
import time
from pathlib import Path

import pytest

from jupyter_slurm_ray.errors import SpecError
from jupyter_slurm_ray.job import packs
from jupyter_slurm_ray.spec import ClusterSpec

from ..helpers.bootstrap import bootstrap_module

unpack = bootstrap_module("unpack")
BootstrapError = bootstrap_module("jsr_base").BootstrapError


def test_the_key_depends_on_what_is_installed_not_on_its_order() -> None:
    key = packs.pack_key("venv", "3.11.2", ["ray==2.60.0", "numpy==2.1.0"])
    assert key == packs.pack_key("venv", "3.11.2", ["numpy==2.1.0", "ray==2.60.0"])
    assert key != packs.pack_key("venv", "3.11.2", ["numpy==2.1.1", "ray==2.60.0"])
    assert key != packs.pack_key("venv", "3.12.0", ["numpy==2.1.0", "ray==2.60.0"])
    assert key != packs.pack_key("conda", "3.11.2", ["numpy==2.1.0", "ray==2.60.0"])
    assert len(key) == 16 and int(key, 16) >= 0


def test_installed_distributions_are_read_from_the_paths_given(tmp_path) -> None:
    info = tmp_path / "Marker_Pkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: Marker-Pkg\nVersion: 1.0\n")
    assert packs.installed_distributions([str(tmp_path)]) == ["marker-pkg==1.0"]


def test_the_kind_of_an_environment(tmp_path) -> None:
    venv, conda, pixi, system = (tmp_path / n for n in ("v", "c", "p/.pixi/envs/default", "s"))
    (venv).mkdir()
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (conda / "conda-meta").mkdir(parents=True)
    (pixi / "conda-meta").mkdir(parents=True)
    system.mkdir()
    assert packs.environment_kind(str(venv), "/usr") == "venv"
    assert packs.environment_kind(str(conda), "/usr") == "conda"
    assert packs.environment_kind(str(pixi), "/usr") == "pixi"
    with pytest.raises(SpecError, match="not a venv, conda or pixi environment"):
        packs.environment_kind(str(system), str(system))


def test_a_venv_with_system_site_packages_is_refused_before_packing(tmp_path) -> None:
    (tmp_path / "pyvenv.cfg").write_text("home = /usr/bin\ninclude-system-site-packages = true\n")
    with pytest.raises(SpecError, match="--system-site-packages"):
        packs.describe_environment(str(tmp_path), "/usr")


def test_each_kind_is_packed_by_its_own_tool() -> None:
    venv = packs.EnvironmentToPack("venv", "/e/v", "0" * 16)
    argv = packs.pack_argv(venv, "venv-pack", "/c/out.tar.gz")
    assert argv[:5] == ["venv-pack", "--prefix", "/e/v", "--output", "/c/out.tar.gz"]
    conda = packs.EnvironmentToPack("conda", "/e/c", "1" * 16)
    assert packs.pack_argv(conda, "conda-pack", "/o")[:3] == ["conda-pack", "--prefix", "/e/c"]
    pixi = packs.EnvironmentToPack("pixi", "/w/.pixi/envs/prod", "2" * 16)
    argv = packs.pack_argv(pixi, "pixi-pack", "/o.tar")
    assert argv[:3] == ["pixi-pack", "--environment", "prod"] and argv[-1] == "/w/pixi.toml"
    assert pixi.archive_name == "env-pixi-" + "2" * 16 + ".tar"
    assert venv.archive_name == "env-venv-" + "0" * 16 + ".tar.gz"


def test_a_missing_tool_says_how_to_get_it(monkeypatch) -> None:
    monkeypatch.setattr(packs.shutil, "which", lambda name: None)
    monkeypatch.setattr(sys, "executable", "/nowhere/bin/python")
    with pytest.raises(SpecError, match="conda install -c conda-forge conda-pack"):
        packs.find_tool(packs.EnvironmentToPack("conda", "/e/c", "1" * 16))


def test_the_setting_takes_kernel_or_pack() -> None:
    assert ClusterSpec().environment == "kernel"
    assert ClusterSpec(environment="pack").environment == "pack"
    with pytest.raises(SpecError, match="environment"):
        ClusterSpec(environment="conda")
    with pytest.raises(SpecError, match="Ray comes from the image"):
        ClusterSpec(environment="pack", container="/images/ray.sif")


def test_with_a_pack_the_job_names_it_and_the_bootstrap_runs_on_python3() -> None:
    spec = ClusterSpec(environment="pack")
    assert packs.bootstrap_python(spec) == "python3"
    assert packs.bootstrap_python(spec.replace(python="/opt/py/bin/python")) == "/opt/py/bin/python"
    assert packs.bootstrap_python(ClusterSpec()) is None
    pack = packs.PackOnCluster("/r/packs/a", "5" * 64)
    command = packs.bootstrap_command(["python3", "/j/bootstrap", "head", "/j"], pack)
    assert command == [
        "env",
        "JSR_ENV_PACK=/r/packs/a",
        f"JSR_ENV_PACK_SHA256={'5' * 64}",
        *["python3", "/j/bootstrap", "head", "/j"],
    ]


def _archive(path: Path, files: dict[str, str]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(text), 0o755
            tar.addfile(info, io.BytesIO(text.encode()))
    return path


@pytest.fixture
def node_tmp(tmp_path, monkeypatch) -> Path:
    """The bootstrap's /tmp/jsr-<uid> (``trust.user_temp_dir``) moved under tmp_path."""
    moved = tmp_path / "tmp" / f"jsr-{os.getuid()}"
    moved.mkdir(parents=True, mode=0o700)
    monkeypatch.setattr(unpack, "user_temp_dir", lambda node_wide=False: moved)
    return moved


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_unpacked_once_then_reused_and_put_first_on_path(tmp_path, node_tmp) -> None:
    archive = _archive(
        tmp_path / ("env-venv-" + "a" * 16 + ".tar.gz"),
        {"pyvenv.cfg": "home = /usr/bin\n", "bin/python": "", "lib/marker.py": "x = 1\n"},
    )
    digest = sha256_of(archive)
    events: list[tuple[str, dict]] = []
    environ = {
        "JSR_ENV_PACK": str(archive),
        "JSR_ENV_PACK_SHA256": digest,
        "PATH": "/usr/bin",
        "PYTHONHOME": "/x",
    }
    unpack.activate_pack(lambda name, **kw: events.append((name, kw)), tmp_path, environ)
    prefix = node_tmp / f"env-venv-{'a' * 16}-{digest[:16]}"  # named by its content too
    assert (prefix / "lib" / "marker.py").read_text() == "x = 1\n"
    assert (prefix / unpack.MARKER).read_text().split()[0] == digest
    assert environ["PATH"] == f"{prefix}/bin:/usr/bin" and environ["VIRTUAL_ENV"] == str(prefix)
    assert "PYTHONHOME" not in environ
    unpack.activate_pack(lambda name, **kw: events.append((name, kw)), tmp_path, environ)
    assert [kw["reused"] for _, kw in events] == [False, True]
    assert environ["PATH"] == f"{prefix}/bin:/usr/bin"  # not twice
    assert (tmp_path / "env-pack").read_text() == f"{archive}\n{digest}\n"  # for worker jobs
    worker_job = {"PATH": "/usr/bin"}  # a worker job's environment: no JSR_ENV_PACK
    unpack.activate_pack(lambda name, **kw: events.append((name, kw)), tmp_path, worker_job)
    assert worker_job["PATH"] == f"{prefix}/bin:/usr/bin"


def test_a_replaced_archive_is_refused_with_an_event_and_nothing_unpacked(tmp_path, node_tmp):
    archive = _archive(tmp_path / ("env-venv-" + "9" * 16 + ".tar.gz"), {"bin/python": ""})
    submitted = sha256_of(archive)
    _archive(archive, {"bin/python": "", "lib/evil.py": "import os\n"})  # replaced after up
    events: list[tuple[str, dict]] = []
    environ = {"JSR_ENV_PACK": str(archive), "JSR_ENV_PACK_SHA256": submitted}
    with pytest.raises(unpack.PackReplaced) as info:
        unpack.activate_pack(lambda name, **kw: events.append((name, kw)), tmp_path, environ)
    reason = info.value.reason
    assert f"the environment pack {archive} on " in reason and "was replaced after up" in reason
    assert submitted in reason and sha256_of(archive) in reason and f"rm {archive}" in reason
    assert events == [
        (
            "env_pack_replaced",
            {"archive": str(archive), "expected": submitted, "found": sha256_of(archive)},
        )
    ]
    assert not [p for p in node_tmp.iterdir() if not p.name.endswith(".lock")]  # nothing


def test_a_reused_unpacked_pack_must_have_the_same_content(tmp_path, node_tmp) -> None:
    """An archive of the same name but another content is unpacked beside, not taken for it."""
    archive = _archive(
        tmp_path / ("env-venv-" + "8" * 16 + ".tar.gz"), {"bin/python": "", "v": "1"}
    )
    first, _ = unpack.unpacked(archive, sha256_of(archive))
    _archive(archive, {"bin/python": "", "v": "2"})
    second, reused = unpack.unpacked(archive, sha256_of(archive))
    assert not reused and second != first
    assert (first / "v").read_text() == "1" and (second / "v").read_text() == "2"


def test_a_pack_without_its_hash_is_refused(tmp_path, node_tmp) -> None:
    archive = _archive(tmp_path / ("env-venv-" + "7" * 16 + ".tar.gz"), {"bin/python": ""})
    with pytest.raises(BootstrapError, match="without its content hash"):
        unpack.activate_pack(lambda *a, **k: None, tmp_path, {"JSR_ENV_PACK": str(archive)})
    (tmp_path / "env-pack").write_text(f"{archive}\n")  # a worker job's file, without it
    with pytest.raises(BootstrapError, match="without its content hash"):
        unpack.activate_pack(lambda *a, **k: None, tmp_path, {})


def test_an_archive_others_may_change_is_refused(tmp_path, node_tmp) -> None:
    archive = _archive(tmp_path / ("env-venv-" + "6" * 16 + ".tar.gz"), {"bin/python": ""})
    archive.chmod(0o666)
    with pytest.raises(BootstrapError, match=r"not safe to unpack: it is writable by other"):
        unpack.unpacked(archive, sha256_of(archive))
    archive.chmod(0o600)
    tmp_path.chmod(0o777)
    try:
        with pytest.raises(BootstrapError, match=r"directory .* is not safe to unpack from"):
            unpack.unpacked(archive, sha256_of(archive))
    finally:
        tmp_path.chmod(0o700)


def test_a_corrupt_archive_names_the_node_and_leaves_nothing(tmp_path, node_tmp) -> None:
    archive = tmp_path / ("env-venv-" + "b" * 16 + ".tar.gz")
    archive.write_text("not a tar file")
    with pytest.raises(BootstrapError, match="cannot unpack the environment pack") as info:
        unpack.unpacked(archive, sha256_of(archive))
    assert str(archive) in info.value.reason and info.value.log
    assert not list(node_tmp.glob("*env-venv-*[!k]"))  # no half-unpacked directory


def test_a_name_that_is_not_a_pack_is_refused(tmp_path, node_tmp) -> None:
    with pytest.raises(BootstrapError, match="does not name an environment pack"):
        unpack.unpacked(tmp_path / "env.tar.gz", "0" * 64)


def test_unpacked_packs_unused_for_long_are_pruned(tmp_path) -> None:
    old, recent = tmp_path / ("env-venv-" + "c" * 16), tmp_path / ("env-venv-" + "d" * 16)
    for target in (old, recent):
        target.mkdir()
        (target / unpack.MARKER).write_text("x\n")
    week_ago = time.time() - 8 * 86400
    os.utime(old / unpack.MARKER, (week_ago, week_ago))
    assert unpack.prune_unused(tmp_path, keep=recent) == [old]
    assert not old.exists() and recent.exists()


def test_the_setting_is_a_trait_and_a_magic_option() -> None:
    from jupyter_slurm_ray.config import SlurmRay
    from jupyter_slurm_ray.ui.magic_args import parse, spec_arguments

    assert "environment" in SlurmRay.class_traits()
    line = parse("up -N 2 -t 10 --environment pack")
    assert spec_arguments(line)["environment"] == "pack"


def _fake_tool(tmp_path: Path) -> tuple[str, Path]:
    """A packing tool that writes its --output argument and counts its runs."""
    runs = tmp_path / "runs"
    tool = tmp_path / "venv-pack"
    tool.write_text(
        "#!/bin/sh\n"
        f'echo run >> "{runs}"\n'
        'while [ "$1" != --output ]; do shift; done\n'
        'echo archive > "$2"\n'
    )
    tool.chmod(0o755)
    return str(tool), runs


async def test_shipping_here_packs_into_the_root_once_then_reuses(tmp_path, monkeypatch) -> None:
    from jupyter_slurm_ray.transport import LocalTransport

    tool, runs = _fake_tool(tmp_path)
    monkeypatch.setattr(packs, "find_tool", lambda env: tool)
    env = packs.EnvironmentToPack("venv", "/e/v", "e" * 16)
    root = str(tmp_path / "jobs")
    first = await packs.ship_pack(LocalTransport(), env, root)
    assert first == f"{root}/packs/env-venv-{'e' * 16}.tar.gz"
    assert Path(first).read_text() == "archive\n"
    assert await packs.ship_pack(LocalTransport(), env, root) == first
    assert runs.read_text() == "run\n"  # packed once
    assert [p.name for p in Path(first).parent.iterdir()] == [Path(first).name]  # no temp


async def test_shipping_elsewhere_sends_the_cached_archive(tmp_path, monkeypatch) -> None:
    from jupyter_slurm_ray.transport import LocalTransport

    tool, _ = _fake_tool(tmp_path)
    monkeypatch.setattr(packs, "find_tool", lambda env: tool)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    env = packs.EnvironmentToPack("venv", "/e/v", "f" * 16)
    elsewhere = LocalTransport(["env"])  # a command prefix: not this process's own files
    sent = await packs.ship_pack(elsewhere, env, str(tmp_path / "jobs"))
    cached = tmp_path / "cache" / "jupyter-slurm-ray" / "packs" / env.archive_name
    assert Path(sent).read_bytes() == cached.read_bytes() == b"archive\n"
    assert oct(Path(sent).stat().st_mode & 0o777) == "0o600"


async def test_the_job_gets_the_hash_of_the_copy_it_will_unpack(tmp_path, monkeypatch) -> None:
    """prepare_pack: the cluster side's archive when it has one (hashed there), else this
    side's, packed first; ship_pack then sends exactly that file."""
    from jupyter_slurm_ray.transport import LocalTransport

    tool, runs = _fake_tool(tmp_path)
    monkeypatch.setattr(packs, "find_tool", lambda env: tool)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    env = packs.EnvironmentToPack("venv", "/e/v", "c" * 16)
    root = str(tmp_path / "jobs")
    elsewhere = LocalTransport(["env"])
    before = await packs.prepare_pack(elsewhere, env, root)  # nothing there yet: packed here
    assert before.path == f"{root}/packs/{env.archive_name}" and not Path(before.path).exists()
    assert before.sha256 == hashlib.sha256(b"archive\n").hexdigest()
    await packs.ship_pack(elsewhere, env, root)
    Path(before.path).write_bytes(b"another archive\n")  # the cluster side's copy differs
    after = await packs.prepare_pack(elsewhere, env, root)
    assert after == packs.PackOnCluster(
        before.path, hashlib.sha256(b"another archive\n").hexdigest()
    )
    here = await packs.prepare_pack(LocalTransport(), env, root)  # hashed in this process
    assert here == after and runs.read_text() == "run\n"


async def test_a_pack_that_arrives_different_is_removed_and_refused(tmp_path, monkeypatch) -> None:
    from jupyter_slurm_ray.errors import SlurmRayError
    from jupyter_slurm_ray.transport import LocalTransport

    tool, _ = _fake_tool(tmp_path)
    monkeypatch.setattr(packs, "find_tool", lambda env: tool)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    env = packs.EnvironmentToPack("venv", "/e/v", "d" * 16)
    elsewhere = LocalTransport(["env"])

    async def torn(local: str, remote: str, progress=None) -> None:
        Path(remote).parent.mkdir(parents=True, exist_ok=True)
        Path(remote).write_bytes(Path(local).read_bytes()[:3])

    monkeypatch.setattr(elsewhere, "send_file", torn)
    with pytest.raises(SlurmRayError, match="arrived different") as error:
        await packs.ship_pack(elsewhere, env, str(tmp_path / "jobs"))
    assert not Path(packs.remote_archive(env, str(tmp_path / "jobs"))).exists()
    assert "run up again" in str(error.value)


def test_without_ipywidgets_the_progress_is_text(monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # a process without the UI's pieces
    monkeypatch.delitem(sys.modules, "jupyter_slurm_ray.ui.live", raising=False)
    report = packs.progress_display("sending pack.tar.gz", 10_000_000)
    report(10_000_000, 10_000_000)
    assert "sending pack.tar.gz: 10 / 10 MB" in capsys.readouterr().err
