"""The documentation site's checks that need no Sphinx: every setting and option has a
description for the generated reference, the tutorial is the quickstart notebook as it is, and
the offline link check finds what leads nowhere. (``scripts/build-docs`` builds the site.)"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

from jupyter_slurm_ray.spec.checks import single_line

ROOT = Path(__file__).resolve().parents[2]


def docs_module(name: str) -> ModuleType:
    """One of the docs build's modules (``docs/_ext/NAME.py``), imported without Sphinx."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "docs" / "_ext" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_every_setting_and_option_has_a_description():
    assert docs_module("jsr_reference").missing_descriptions() == []


def test_the_reference_shows_every_cluster_setting_and_its_variable():
    reference = docs_module("jsr_reference")
    shown = {setting.name: setting for setting in reference.cluster_settings()}
    assert shown["partition"].env == "JUPYTER_SLURM_RAY_PARTITION"
    assert "%slurm_ray up -p/--partition" in shown["partition"].ways
    assert shown["name"].env is None  # chosen per cluster, not configured
    own = {setting.name for setting in reference.own_settings()}
    assert {"login_host", "poll_interval", "command_prefix"} <= own
    assert not own & set(shown)
    adapt = {setting.name: setting.default for setting in reference.adapt_settings()}
    assert adapt == {"adapt_idle_timeout": "60.0", "adapt_max_pending": "2"}


def test_a_setting_without_a_description_is_named_as_missing(monkeypatch):
    from jupyter_slurm_ray import spec
    from jupyter_slurm_ray.ui import magic_args  # noqa: F401  (imported with the real spec: it
    # reads every setting's help when first imported, which this test must not be)

    @dataclasses.dataclass(frozen=True)
    class Undescribed:
        colour: str = dataclasses.field(
            default="blue", metadata={"check": single_line, "kind": "text", "help": " "}
        )

    monkeypatch.setattr(spec, "ClusterSpec", Undescribed)
    assert docs_module("jsr_reference").missing_descriptions() == ["ClusterSpec colour"]


def test_the_tutorial_is_the_quickstart_notebook_with_the_outputs_of_a_run():
    ran = json.loads((ROOT / "docs" / "tutorial" / "quickstart.ipynb").read_text())
    source = json.loads((ROOT / "notebooks" / "quickstart.ipynb").read_text())
    cells = [(cell["cell_type"], "".join(cell["source"])) for cell in ran["cells"]]
    assert cells == [(cell["cell_type"], "".join(cell["source"])) for cell in source["cells"]], (
        "notebooks/quickstart.ipynb changed: run it again, "
        "scripts/quickstart --save docs/tutorial/quickstart.ipynb"
    )
    code = [cell for cell in ran["cells"] if cell["cell_type"] == "code"]
    assert all(cell["execution_count"] for cell in code)
    assert not [o for cell in code for o in cell["outputs"] if o["output_type"] == "error"]
    assert "STOPPED" in "".join(code[-1]["outputs"][0]["text"])  # it ran to the end


def test_the_link_check_names_each_link_that_leads_nowhere(tmp_path):
    site = tmp_path / "html"
    (site / "how-to").mkdir(parents=True)
    (site / "index.html").write_text(
        '<a href="how-to/page.html#steps">ok</a> <a href="how-to/page.html#nothing">anchor</a>'
        ' <a href="missing.html">page</a> <a href="#top" id="top">self</a>'
        ' <a href="https://example.org/">away</a>'
        ' <script src="https://cdn.example.org/x.js"></script>'
        ' <link rel="canonical" href="https://example.org/index.html">'
    )
    (site / "how-to" / "page.html").write_text(
        '<h2 id="steps">Steps</h2><img src="../_images/a.png"><a href="../index.html">up</a>'
    )
    (site / "_images").mkdir()
    (site / "_images" / "a.png").write_bytes(b"")
    assert docs_module("jsr_linkcheck").problems(site) == [
        "index.html: how-to/page.html#nothing: no id 'nothing' in how-to/page.html",
        "index.html: missing.html names missing.html, which does not exist",
        "index.html: <script src> loads https://cdn.example.org/x.js from the network",
    ]
