"""Each use case once (``usecases.py``): the magic, the CLI, the panel and the REST API refuse
the same things in the same words, because they call the same function; and no front door
stitches a use case of its own (the site check, the submit, the walltime, the scaling, the
record's deletion are the use cases' alone)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import jupyter_slurm_ray
from jupyter_slurm_ray.registry import Registry
from jupyter_slurm_ray.ui.cli import main

from ..helpers.ipyshell import *  # noqa: F403  (the fixtures ipython_shell and magic)
from ..helpers.ipyshell import one_line_error
from .test_walltime_and_queue import record

PACKAGE = Path(jupyter_slurm_ray.__file__).parent
FRONT_DOORS = sorted([*PACKAGE.glob("ui/*.py"), *PACKAGE.glob("server/*.py")])
# what only usecases.py calls: the site check, the submit, the walltime, scaling, deletion
STITCHES = {
    "check_with_slurm", "up_async", "extend_async", "extend_walltime", "scale_or_ask_async",
    "scale_or_ask",
}  # fmt: skip
# ... and these, called on a cluster or a registry (``commands.extend`` is not one)
STITCHES_ON = {"up": "cluster", "extend": "cluster", "delete": "registry"}


def _receiver(node: ast.expr) -> str:
    """``cluster`` for ``cluster.x``; ``registry`` for ``session.registry().x``."""
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _called(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name):
            names.add(func.id)
        elif isinstance(func, ast.Attribute) and _receiver(func.value) != "usecases":
            on = STITCHES_ON.get(func.attr)
            if on is None or _receiver(func.value) == on:
                names.add(func.attr)
    return names


def test_no_front_door_stitches_a_use_case_of_its_own() -> None:
    stitched = {
        path.relative_to(PACKAGE).as_posix(): sorted(_called(path) & STITCHES)
        for path in FRONT_DOORS
    }
    assert {path: names for path, names in stitched.items() if names} == {}


def test_an_ended_cluster_is_not_extended_by_any_front_door(magic, slurm, site, capsys) -> None:
    """The magic and the CLI asked Slurm to extend an ended job (its record still said READY)
    before; the REST API refused. Now all three refuse in the same words, and Slurm is asked
    only what the job's state is."""
    record(Registry(), slurm, "walled")
    slurm.end("7")
    _, err, error = magic.run("%slurm_ray extend walled +30")
    said = "walled-0000 is STOPPED: only an active cluster can be extended"
    assert said in one_line_error(err) and error is not None
    assert main(["extend", "walled", "+30"]) == 1
    assert said in capsys.readouterr().err
    assert not [call for call in slurm.calls if call[:2] == ("scontrol", "update")]


def test_an_active_clusters_record_is_kept_by_every_front_door(magic, slurm, site, capsys):
    record(Registry(), slurm, "busy")
    _, err, error = magic.run("%slurm_ray forget busy")
    said = "busy-0000 is READY: stop it before forgetting it (down)"
    assert said in one_line_error(err) and error is not None
    assert main(["forget", "busy"]) == 1
    assert said in capsys.readouterr().err
    assert Registry().load("busy-0000") is not None


async def test_the_rest_api_refuses_the_same_forget_in_the_same_words(
    jp_fetch, server_manager, slurm, site
) -> None:
    registry = Registry(site["JUPYTER_SLURM_RAY_STATE_DIR"])
    cluster_id = record(registry, slurm, "busy")
    response = await jp_fetch(
        "slurm-ray", "api", "clusters", cluster_id, method="DELETE", params={"forget": "true"},
        raise_error=False,
    )  # fmt: skip
    answer = json.loads(response.body)
    assert response.code == 409
    assert answer["message"].endswith("busy-0000 is READY: stop it before forgetting it (down)")
    assert registry.load(cluster_id) is not None


def test_the_stitch_finder_finds_the_stitches_where_they_are() -> None:
    """The test above reads real calls: in usecases.py it finds every stitch the front doors
    must not make."""
    found = _called(PACKAGE / "usecases.py")
    assert {"check_with_slurm", "up_async", "extend_async", "scale_or_ask_async"} <= found
    assert "delete" in found  # registry.delete


def test_an_interrupt_during_the_site_check_says_nothing_was_submitted(
    magic, slurm, site, monkeypatch
) -> None:
    """Ctrl-C while ``submit`` still checks the site cancels it (``run_sync``): nothing is
    written or queued, and the magic says so rather than "keeps going"."""

    def interrupted(coro, timeout=None):
        coro.close()
        raise KeyboardInterrupt

    monkeypatch.setattr("jupyter_slurm_ray.ui.magics.run_sync", interrupted)
    out, _, _ = magic.run("%slurm_ray up --name halted -t 10")
    assert "interrupted: nothing of halted was submitted" in out
    assert slurm.jobs == {} and Registry().all() == []
