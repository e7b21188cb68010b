"""The Lab sidebar in the browser tests: opening it, and its cards (an ended cluster's card is
folded under the sidebar's "Recent: N ended" group, which is opened to reach it)."""

from __future__ import annotations

import contextlib
from typing import Any

from playwright.sync_api import expect


def open_sidebar(page: Any, attempts: int = 3) -> None:
    """Show the "Slurm Ray" sidebar. Clicking its tab toggles it, and the layout restorer may
    open it between a look at the tab and the click (the click then closed it): look again."""
    tab = page.locator('.lm-TabBar-tab[data-id="jp-SlurmRay-sidebar"]')
    sidebar = page.locator("#jp-SlurmRay-sidebar")
    for _ in range(attempts):
        if sidebar.is_visible():
            return
        tab.click()
        with contextlib.suppress(AssertionError):
            expect(sidebar).to_be_visible(timeout=3000)
            return
    expect(sidebar).to_be_visible()


def card(page: Any, cluster_id: str) -> Any:
    """The cluster's card, wherever it is in the sidebar (possibly folded)."""
    return page.locator(f'.jp-SlurmRay-cluster[data-cluster-id="{cluster_id}"]')


def open_recent(page: Any) -> None:
    """Open the group of ended clusters, if there is one and it is closed: it stays open for
    the page's later listings, so a cluster that ends later lands in the open group too."""
    folded = page.locator(".jp-SlurmRay-recent details:not([open]) > summary")
    if folded.count():
        folded.first.click()


def click_on_card(page: Any, cluster_id: str, button: str, attempts: int = 3) -> None:
    """Click a card's button; its cluster may end meanwhile (its card then moves under the
    group, closed the first time), so the group is opened and the click tried again."""
    for attempt in range(attempts):
        open_recent(page)
        try:
            card(page, cluster_id).get_by_role("button", name=button).click(timeout=10_000)
            return
        except Exception:  # hidden under the group, closed when the card moved there
            if attempt == attempts - 1:
                raise
