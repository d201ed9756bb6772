"""Real headless Chromium for the report tests (Playwright, Debian's /usr/bin/chromium).

The tests skip only when Chromium is missing and ``NEURON_MLFLOW_REQUIRE_SYSTEM_TOOLS`` is not
set (``.ci/run`` sets it, so in CI they fail instead).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def launch() -> Iterator[Any]:
    """Yield a Playwright browser on the system Chromium (skip or fail when it is missing)."""
    if not CHROMIUM.exists():
        if os.environ.get("NEURON_MLFLOW_REQUIRE_SYSTEM_TOOLS"):
            pytest.fail(f"{CHROMIUM} is missing (NEURON_MLFLOW_REQUIRE_SYSTEM_TOOLS is set)")
        pytest.skip(f"{CHROMIUM} is missing: apt-get install -y chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            yield browser
        finally:
            browser.close()


class Console:
    """Console errors and failed requests of a page, by the URL of the frame they came from."""

    def __init__(self, page: Any) -> None:
        self.errors: list[tuple[str, str]] = []
        self.requests: list[str] = []
        page.on(
            "console",
            lambda m: (
                self.errors.append((m.location.get("url", ""), m.text))
                if m.type == "error"
                else None
            ),
        )
        page.on("pageerror", lambda e: self.errors.append(("page", str(e))))
        page.on("request", lambda r: self.requests.append(r.url))

    def from_reports(self) -> list[str]:
        """Errors raised inside report frames (``blob:``/``about:srcdoc``) or uncaught."""
        return [
            text
            for url, text in self.errors
            if url.startswith(("blob:", "about:")) or url in ("", "page")
        ]


def sandboxed(page: Any, html_text: str, width: int = 1300, height: int = 900) -> Any:
    """Show ``html_text`` as MLflow's artifact viewer does: in an ``<iframe>`` with
    ``sandbox="allow-scripts"`` (opaque origin: no storage, no pop-ups); return its frame."""
    page.set_content(
        f'<iframe id="view" sandbox="allow-scripts" style="width:{width}px;height:{height}px;'
        'border:0"></iframe>'
    )
    page.eval_on_selector("#view", "(f, text) => { f.srcdoc = text; }", html_text)
    handle = page.wait_for_selector("#view")
    frame = handle.content_frame()
    frame.wait_for_load_state()
    return frame
