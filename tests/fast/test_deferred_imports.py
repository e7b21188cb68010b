"""The job's Ray processes do not pay for imports they do not use (bootstrap/sitepath): checked
in a fresh interpreter with the same PYTHONPATH the bootstrap gives them. Nor does a kernel
that imports ray to connect, nor any process of a venv with the .pth line scripts/setup
writes (client/deferral.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import jupyter_slurm_ray
from jupyter_slurm_ray.client.deferral import pth_line

from ..helpers.deferral import UNDEFERRED

SITE_PATH = Path(jupyter_slurm_ray.__file__).parent / "bootstrap" / "sitepath"

PROBE = """
import json, sys
import ray
seen = {"lark_after_import_ray": "lark" in sys.modules,
        "deferred": getattr(sys.modules.get("rfc3987_syntax"), "__deferred__", False)}
import jsonschema
checker = jsonschema.FormatChecker()
seen["iri_ok"] = checker.conforms("http://example.org/\\u00e4", "iri")
seen["iri_bad"] = checker.conforms("http://exa mple.org", "iri")
seen["lark_after_use"] = "lark" in sys.modules
print(json.dumps(seen))
"""


def probe(pythonpath: str, first: str = "") -> dict:
    env = {**os.environ, "PYTHONPATH": pythonpath}
    done = subprocess.run(
        [sys.executable, "-c", first + textwrap.dedent(PROBE)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_ray_in_the_jobs_processes_does_not_build_rfc3987_grammars():
    seen = probe(str(SITE_PATH))
    assert seen["deferred"] and not seen["lark_after_import_ray"]
    # deferred, not removed: the format check still works, the module loads on first use
    assert seen["iri_ok"] is True and seen["iri_bad"] is False and seen["lark_after_use"]


def test_without_the_deferral_the_cost_is_there_so_the_tests_here_mean_something():
    seen = probe("", UNDEFERRED)
    assert not seen["deferred"] and seen["lark_after_import_ray"]


def test_a_kernel_defers_them_before_it_imports_ray_to_connect():
    first = (
        "from jupyter_slurm_ray.client.connect import import_ray\n"
        "import_ray()  # what a kernel does while its job waits\n"
    )
    seen = probe("", UNDEFERRED + first)
    assert seen["deferred"] and not seen["lark_after_import_ray"]
    assert seen["iri_ok"] is True and seen["iri_bad"] is False and seen["lark_after_use"]


def test_the_venvs_pth_line_defers_them_in_any_process_and_is_silent_once_its_file_is_gone(
    tmp_path,
):
    site_dir, gone = tmp_path / "site", tmp_path / "gone"
    site_dir.mkdir()
    gone.mkdir()
    (site_dir / "jupyter_slurm_ray_deferred.pth").write_text(pth_line())
    (gone / "jupyter_slurm_ray_deferred.pth").write_text(pth_line(tmp_path / "moved.py"))
    seen = probe("", UNDEFERRED + f"import site\nsite.addsitedir({str(site_dir)!r})\n")
    assert seen["deferred"] and not seen["lark_after_import_ray"]
    assert seen["iri_ok"] is True and seen["iri_bad"] is False and seen["lark_after_use"]
    add_gone = f"import site\nsite.addsitedir({str(gone)!r})\n"
    done = subprocess.run(
        [sys.executable, "-c", UNDEFERRED + add_gone + "print('jsr_deferred' in sys.modules)"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert (done.stdout.strip(), done.stderr) == ("False", "")


def test_a_sitecustomize_it_shadows_still_runs(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import builtins\nbuiltins.SHADOWED_RAN = True\n")
    env = {**os.environ, "PYTHONPATH": f"{SITE_PATH}{os.pathsep}{other}"}
    done = subprocess.run(
        [sys.executable, "-c", "import builtins; print(getattr(builtins, 'SHADOWED_RAN', False))"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    assert done.stdout.strip() == "True"


def test_two_copies_on_the_path_run_once_and_the_sitecustomize_they_shadow_runs_once(tmp_path):
    """A cluster started from a process of another cluster: its Ray processes have both
    clusters' copies of the site path on PYTHONPATH (before: RecursionError in sitecustomize)."""
    copies = [tmp_path / "this", tmp_path / "outer"]
    for copy in copies:  # the sources, as the job dir gets them (a job's bytecode may be 0700)
        shutil.copytree(SITE_PATH, copy, ignore=shutil.ignore_patterns("__pycache__"))
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text(
        "import builtins\nbuiltins.SHADOWED_RAN = getattr(builtins, 'SHADOWED_RAN', 0) + 1\n"
    )
    probe = (
        "import builtins, sys; "
        "print(getattr(builtins, 'SHADOWED_RAN', 0), "
        "sum(type(f).__name__ == '_DeferredImports' for f in sys.meta_path))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in [*copies, other])}
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True
    )
    assert "Error in sitecustomize" not in done.stderr, done.stderr
    assert done.stdout.split() == ["1", "1"]  # the shadowed one ran once; one deferral installed
