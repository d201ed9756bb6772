"""The README's "See it in the UI", followed step by step in a real browser.

The main job runs as the README's first command runs it (the embedded store ``./mlflow.db``
in its working folder); then the README's own ``mlflow ui`` command serves that store and
headless Chromium opens the runs-list URL the README gives. It finds the runs list (not
MLflow 3's GenAI overview) with the named parent run, adds the columns the README names and
reads the result there, expands the parent, opens a variant's ``report.html`` and the
parent's ``comparison.html`` through the Artifacts tab. The screenshots ``docs/ui-runs.png``,
``docs/ui-report.png`` and ``docs/ui-comparison.png`` come from this test (written there when
``NEURON_MLFLOW_UPDATE_SCREENSHOTS=1``).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mlflow import MlflowClient

from tests.conftest import free_port
from tests.helpers import ROOT, run_python
from tests.summary.browser import Console, launch

UPDATE_SCREENSHOTS = os.environ.get("NEURON_MLFLOW_UPDATE_SCREENSHOTS") == "1"  # read before
# the autouse fixture clears NEURON_MLFLOW_* for each test
COLUMNS = ("speedup", "result")  # the README names them; the recipe logs them on the parent


def readme_ui_section() -> tuple[list[str], str]:
    """The README's ``mlflow ui`` command (as argv) and its runs-list URL template."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    at = readme.find("## See it in the UI")
    assert at >= 0, "README.md has no 'See it in the UI' section"
    section = readme[at : readme.find("\n## ", at + 1)]
    command = re.search(r"^(\S*mlflow ui --backend-store-uri \S+)\s*$", section, re.M)
    url = re.search(r"(http://127\.0\.0\.1:5000/#/experiments/<id>/runs)", section)
    assert command and url, "the section gives the command and the runs-list URL"
    for column in COLUMNS:
        assert f"`{column}`" in section, f"the section names the {column} column"
    return shlex.split(command.group(1)), url.group(1)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The main job into ``./mlflow.db``, then the README's ``mlflow ui`` on a free port."""
    work = tmp_path_factory.mktemp("first-hour")
    args = ["--rows", "64", "--hidden", "256", "--warmup", "1", "--active", "2"]
    run_python([str(ROOT / "recipes/rmsnorm.py"), *args, "--backend", "cpu"], "", cwd=work)
    argv, url = readme_ui_section()
    assert Path(argv[0]).name == "mlflow", argv
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "NEURON_MLFLOW"))}
    log = (work / "ui.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", *argv[1:], "--host", "127.0.0.1", "--port", str(port)],
        cwd=work,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"mlflow ui did not start; see {work / 'ui.log'}") from None
                time.sleep(0.5)
        client = MlflowClient(uri)
        experiment = client.get_experiment_by_name("rmsnorm").experiment_id
        yield {
            "client": client,
            "experiment": experiment,
            "url": url.replace("5000", str(port)).replace("<id>", experiment),
            "shots": work,
        }
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


@pytest.fixture(scope="module")
def browser():
    yield from launch()


def _shot(page: Any, served: dict[str, Any], name: str) -> None:
    path = served["shots"] / name
    page.screenshot(path=str(path))
    if UPDATE_SCREENSHOTS:
        shutil.copyfile(path, ROOT / "docs" / name)


def _close_assistant(page: Any) -> None:
    close = page.get_by_role("button", name="Close", exact=True)
    if close.count() and close.first.is_visible():
        close.first.click()


@pytest.mark.slow
def test_the_readme_ui_section_leads_to_the_result_the_report_and_the_comparison(
    served, browser
) -> None:
    client = served["client"]
    (parent,) = [
        r
        for r in client.search_runs([served["experiment"]])
        if "mlflow.parentRunId" not in r.data.tags
    ]
    name = parent.info.run_name
    assert re.fullmatch(r"rmsnorm naive\|rms_norm\|compiled \d{4}-\d\d-\d\d \d\d:\d\d", name)
    page = browser.new_page(viewport={"width": 1600, "height": 900})
    console = Console(page)

    # 1. the URL opens the runs list itself, with the named parent run
    page.goto(served["url"])
    page.wait_for_selector(f"text={name}", timeout=90_000)
    assert page.get_by_text("Training runs", exact=True).is_visible()
    _close_assistant(page)

    # 2. Columns: add the README's columns; the result is in the parent's row (`speedup` is
    # logged with a decided winner only)
    columns = [c for c in COLUMNS if c != "speedup" or "speedup" in parent.data.metrics]
    if "speedup" not in columns:
        assert parent.data.tags["result"].startswith("no winner: ")
    page.get_by_role("button", name="Columns").click()
    search = page.get_by_placeholder("Search columns")
    for column in columns:
        search.fill(column)
        exact = re.compile(rf"^\s*{re.escape(column)}\s*$")  # `result`, not `result_detail`
        page.locator("[role=dialog] .du-bois-light-tree-treenode", has_text=exact).last.click()
    page.keyboard.press("Escape")
    headers = page.eval_on_selector_all("[role=columnheader]", "els => els.map(e => e.innerText)")
    assert set(columns) <= set(headers), headers
    row = page.locator("[role=row]", has_text=name).first  # the grid splits a row in parts
    index = row.get_attribute("row-index")
    row_text = " ".join(page.locator(f"[role=row][row-index='{index}']").all_inner_texts())
    assert parent.data.tags["result"] in row_text
    if "speedup" in columns:
        assert f"{parent.data.metrics['speedup']:g}" in row_text

    # 3. expand the parent: one child run per variant
    row.locator("button[data-component-id*='runnamecellrenderer']").click()
    for variant in ("naive", "rms_norm", "compiled"):
        page.get_by_role("link", name=variant, exact=True).wait_for()
    page.wait_for_timeout(500)
    _shot(page, served, "ui-runs.png")

    # 4. a variant's run -> Artifacts -> profile/step_.../report.html
    page.get_by_role("link", name="naive", exact=True).click()
    page.get_by_role("tab", name="Artifacts").click()
    page.get_by_text("profile", exact=True).click()
    page.get_by_text(re.compile(r"^step_\d{6}-\d{6}$")).first.click()
    page.get_by_text("report.html", exact=True).click()
    frame = page.wait_for_selector("iframe[sandbox]", timeout=60_000).content_frame()
    frame.wait_for_function("window.nmReport && window.nmReport.ready", timeout=30_000)
    assert "Profile window steps" in frame.inner_text("h1")
    page.wait_for_timeout(500)
    _shot(page, served, "ui-report.png")

    # 5. back to the runs list -> the parent run -> Artifacts -> comparison.html
    page.goto(served["url"])
    page.get_by_role("link", name=name, exact=True).click()
    page.get_by_role("tab", name="Artifacts").click()
    page.get_by_text("comparison.html", exact=True).click()
    frame = page.wait_for_selector("iframe[sandbox]", timeout=60_000).content_frame()
    frame.wait_for_function("window.nmComparison && window.nmComparison.ready", timeout=30_000)
    page.wait_for_timeout(500)
    _shot(page, served, "ui-comparison.png")
    assert console.from_reports() == []
