"""``ray.init`` wrapped in a process the package is loaded into (client/rayinit.py), on a
stand-in ``ray`` module: the real one is exercised in tests/test_magics.py."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator

import pytest

from jupyter_slurm_ray.client import interrupts, rayinit
from jupyter_slurm_ray.client.rayinit import NoClusterError
from jupyter_slurm_ray.config import SlurmRay, effective_setting
from jupyter_slurm_ray.errors import SpecError


class FakeRay(types.ModuleType):
    def __init__(self) -> None:
        super().__init__("ray")
        self.calls: list[tuple[object, dict]] = []
        self.initialized = False

        def init(address=None, **kwargs):
            self.calls.append((address, kwargs))
            self.initialized = True
            return f"local Ray at {address}"

        self.init = init
        self.is_initialized = lambda: self.initialized


@pytest.fixture
def ray(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeRay]:
    fake = FakeRay()
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(rayinit, "_state", rayinit._State())
    rayinit.guard_ray_init(lambda: False)
    yield fake


def test_with_no_cluster_ray_init_raises_one_line_and_starts_nothing(ray):
    for address in (None, "auto"):
        with pytest.raises(NoClusterError) as raised:
            ray.init(address)
        assert "%slurm_ray up" in str(raised.value) and "\n" not in str(raised.value)
        assert raised.value._render_traceback_() == [f"NoClusterError: {raised.value}"]
    assert ray.calls == []


def test_an_address_of_the_users_own_or_the_opt_in_reaches_ray(ray, monkeypatch):
    assert ray.init("ray://elsewhere:10001") == "local Ray at ray://elsewhere:10001"
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.9:6379")
    ray.init()
    monkeypatch.delenv("RAY_ADDRESS")
    rayinit.guard_ray_init(lambda: True)
    ray.init()
    assert [address for address, _ in ray.calls] == ["ray://elsewhere:10001", None, None]


def test_connected_ray_init_returns_the_clusters_context_until_it_is_gone(ray, caplog):
    with rayinit.own_init():
        context = ray.init("ray://127.0.0.1:4000")  # the package's own call goes through
    rayinit.note_connected(context, "demo", client=True)
    assert ray.init() is context and ray.init("auto", ignore_reinit_error=True) is context
    ray.init(num_cpus=4)
    assert "ignored: num_cpus" in caplog.text and "demo" in caplog.text
    assert len(ray.calls) == 1
    ray.initialized = False  # ray.shutdown() by the user
    with pytest.raises(NoClusterError):
        ray.init()
    ray.initialized = True
    rayinit.note_disconnected()
    with pytest.raises(NoClusterError):
        ray.init()


def test_the_guard_wraps_once(ray):
    wrapped = ray.init
    rayinit.guard_ray_init()
    assert ray.init is wrapped


def test_ray_imported_later_is_wrapped_when_it_is_imported(monkeypatch, tmp_path):
    package = tmp_path / "ray"
    package.mkdir()
    (package / "__init__.py").write_text(
        "calls = []\ndef init(address=None, **kwargs):\n    calls.append(address)\n"
        "def is_initialized():\n    return False\n"
    )
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.setattr(rayinit, "_state", rayinit._State())
    rayinit.guard_ray_init(lambda: False)
    assert any(isinstance(f, rayinit._WrapOnImport) for f in sys.meta_path)
    import ray  # the stand-in, found by the real finder

    try:
        with pytest.raises(NoClusterError):
            ray.init()
        assert ray.calls == []
        assert not any(isinstance(f, rayinit._WrapOnImport) for f in sys.meta_path)
    finally:
        sys.modules.pop("ray", None)


def test_an_interrupted_wait_cancels_the_tasks_it_waited_for(capsys):
    class Ref:
        def __init__(self, name: str) -> None:
            self.name = name

    fake = types.ModuleType("ray")
    cancelled: list[str] = []

    forced: list[str] = []

    def get(refs, timeout=None):
        raise KeyboardInterrupt  # the notebook's ■ while waiting

    def wait(refs, num_returns=1, timeout=None):
        if timeout is None:
            raise KeyboardInterrupt
        return [r for r in refs if r.name != "b"], [r for r in refs if r.name == "b"]

    def cancel(ref, *, recursive=True, force=False):
        if ref.name == "actor":
            raise TypeError("an actor task")
        (forced if force else cancelled).append(ref.name)

    fake.ObjectRef = Ref  # type: ignore[attr-defined]
    fake.get, fake.wait, fake.cancel = get, wait, cancel  # type: ignore[attr-defined]
    interrupts.wrap_waits(fake)
    with pytest.raises(KeyboardInterrupt):
        fake.get([Ref("a"), Ref("b"), Ref("actor"), "not a ref"])
    assert cancelled == ["a", "b"] and forced == ["b"]  # b still ran after the grace
    assert capsys.readouterr().err.strip() == (
        "interrupted: cancelled 2 Ray tasks this cell was waiting for "
        "(1 could not be cancelled: actor tasks or ended ones)"
    )
    with pytest.raises(KeyboardInterrupt):
        fake.wait(Ref("c"))
    assert cancelled[-1] == "c"
    wrapped = fake.get
    interrupts.wrap_waits(fake)
    assert fake.get is wrapped


@pytest.mark.parametrize(("text", "allowed"), [("1", True), ("yes", True), ("0", False)])
def test_the_opt_in_comes_from_its_variable_too(text, allowed):
    value, source = effective_setting(
        "allow_local_ray", SlurmRay(), {"JUPYTER_SLURM_RAY_ALLOW_LOCAL_RAY": text}
    )
    assert (value, source) == (allowed, "env JUPYTER_SLURM_RAY_ALLOW_LOCAL_RAY")


def test_an_opt_in_that_is_not_a_yes_or_no_names_its_variable():
    with pytest.raises(SpecError) as refused:
        effective_setting(
            "allow_local_ray", SlurmRay(), {"JUPYTER_SLURM_RAY_ALLOW_LOCAL_RAY": "maybe"}
        )
    assert "JUPYTER_SLURM_RAY_ALLOW_LOCAL_RAY" in str(refused.value)
