"""Screenshots of the built site: its front page, a how-to page and the settings reference.

``python docs/_ext/screenshots.py SITE DIR`` (``scripts/build-docs --screenshots DIR``) opens
each page of the HTML site in SITE from disk in Debian's Chromium (Playwright) and writes
``docs-front.png``, ``docs-howto.png`` and ``docs-settings.png`` into DIR. A request of a
page for anything but a file of the site is refused and fails the run: the site loads nothing
from the network.
"""

from __future__ import annotations

import sys
from pathlib import Path

from playwright.sync_api import Route, sync_playwright

PAGES = {
    "docs-front.png": "index.html",
    "docs-howto.png": "how-to/connect-modes.html",
    "docs-settings.png": "reference/settings.html#cluster-settings",
}
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def main(site: Path, out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    refused: list[str] = []

    def only_files(route: Route) -> None:
        if route.request.url.startswith("file://"):
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort()

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS
        )
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 1000})
            page.route("**/*", only_files)
            for name, path in PAGES.items():
                file, _, fragment = path.partition("#")
                url = (site / file).resolve().as_uri() + (f"#{fragment}" if fragment else "")
                page.goto(url, wait_until="load")
                page.screenshot(path=out / name)
        finally:
            browser.close()
    if refused:
        print("the site asked the network for: " + ", ".join(refused), file=sys.stderr)
        return 1
    print(f"[build-docs] screenshots: {', '.join(str(out / name) for name in PAGES)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
