"""Sphinx configuration of the documentation site (``scripts/build-docs`` builds it).

Pages are MyST Markdown; the tutorial is the quickstart notebook with the outputs of a run on
the testbed (``docs/tutorial/quickstart.ipynb``, rendered, never executed here). The reference
pages' tables come from the code (``docs/_ext/jsr_reference.py``), and every link inside the
built site is checked without the network (``docs/_ext/jsr_linkcheck.py``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path[:0] = [str(ROOT), str(DOCS / "_ext")]  # this checkout's package, then the extensions

project = "jupyter_slurm_ray"
author = "jupyter_slurm_ray developers"
copyright = f"2026, {author}"
# the version's one place (pyproject.toml reads it there too)
release = json.loads((ROOT / "labextension" / "package.json").read_text())["version"]
version = release

extensions = ["myst_nb", "jsr_reference", "jsr_linkcheck"]
root_doc = "index"
exclude_patterns = ["_build", "**.ipynb_checkpoints"]
nitpicky = True

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# The tutorial's outputs are those of a run on the testbed, kept in the notebook: never run.
nb_execution_mode = "off"
# A widget's saved state would need require.js and the widget manager from a CDN: its text
# stands for it (the site loads nothing from the network; jsr_linkcheck checks that).
nb_ipywidgets_js: dict[str, dict[str, str]] = {}
nb_mime_priority_overrides = [("html", "application/vnd.jupyter.widget-view+json", None)]

html_theme = "pydata_sphinx_theme"
html_title = f"jupyter_slurm_ray {release}"
html_static_path = ["_static"]
html_css_files = ["custom.css"]
smartquotes = False  # "--partition" stays two hyphens
html_theme_options = {
    "navigation_with_keys": False,
    "header_links_before_dropdown": 5,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version"],
}
html_sidebars = {"changelog": [], "contributing": []}
html_show_sourcelink = False
