"""Every link inside the built HTML site leads somewhere, checked without the network.

Once the HTML builder has written the site, each page's ``href`` and ``src`` that names a
file of the site must name one that exists, and its ``#fragment`` an ``id`` on that page; a
page may link to other sites, but loads nothing from them (no script, style sheet, image or
frame from a URL with a host), so that the site reads the same behind a firewall. Each
problem is a warning: ``sphinx-build -W`` (``scripts/build-docs``) fails on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

#: (tag, attribute) pairs whose URL the browser loads with the page rather than follows.
LOADED = {("script", "src"), ("link", "href"), ("img", "src"), ("iframe", "src")}
#: <link rel=…> kinds that only name a URL (the browser loads none of them by itself).
NAMING_ONLY = {"canonical", "alternate", "author", "license", "help", "search", "index"}


@dataclass
class Page:
    ids: set[str] = field(default_factory=set)
    links: list[tuple[str, str, str]] = field(default_factory=list)  # (tag, attribute, url)


class _Reader(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.page = Page()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name: value or "" for name, value in attrs}
        for name in ("id", "name") if tag in ("a", "span", "div", "section") else ("id",):
            if values.get(name):
                self.page.ids.add(values[name])
        if tag == "link" and set(values.get("rel", "").split()) <= NAMING_ONLY:
            return
        for attribute in ("href", "src"):
            if attribute in values:
                self.page.links.append((tag, attribute, values[attribute]))


def read_page(path: Path) -> Page:
    reader = _Reader()
    reader.feed(path.read_text(encoding="utf-8"))
    return reader.page


def problems(site: Path) -> list[str]:
    """What is wrong with the links of the HTML site in ``site``: one line each."""
    pages = {  # the theme's _static holds templates, not pages
        path: read_page(path)
        for path in sorted(site.rglob("*.html"))
        if "_static" not in path.relative_to(site).parts
    }
    found = []
    for path, page in pages.items():
        where = path.relative_to(site)
        for tag, attribute, url in page.links:
            parts = urlsplit(url)
            if parts.scheme in ("mailto", "data", "javascript"):
                continue
            if parts.scheme or parts.netloc:
                if (tag, attribute) in LOADED:
                    found.append(f"{where}: <{tag} {attribute}> loads {url} from the network")
                continue
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                found.append(f"{where}: {url} names {_shown(target, site)}, which does not exist")
                continue
            fragment = unquote(parts.fragment)
            if fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else read_page(target).ids
                if fragment not in ids:
                    found.append(f"{where}: {url}: no id {fragment!r} in {_shown(target, site)}")
    return found


def _shown(target: Path, site: Path) -> str:
    try:
        return str(target.relative_to(site.resolve()))
    except ValueError:
        return f"{target} (outside the site)"


def setup(app: Any) -> dict[str, Any]:
    from sphinx.util import logging

    logger = logging.getLogger(__name__)

    def check(app: Any, exception: BaseException | None) -> None:
        if exception is not None or app.builder.format != "html":
            return
        for problem in problems(Path(app.outdir)):
            logger.warning(problem, type="jsr", subtype="link")

    app.connect("build-finished", check)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
