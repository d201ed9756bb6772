"""report.html and comparison.html in the MLflow UI, in a real browser against a real server.

The RMSNorm recipe runs against a real ``mlflow server`` (SQLite, local artifact root); the
test opens the artifact pages as a user would and checks, inside MLflow's sandboxed
``<iframe>``: no console errors; the lanes; the top-operator bars against ``summary.json``;
hover; wheel zoom. It also takes the README's screenshots (``docs/report.png``,
``docs/comparison.png``: written there when ``NEURON_MLFLOW_UPDATE_SCREENSHOTS=1``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from mlflow import MlflowClient

from neuron_mlflow.summary.tables import format_us
from neuron_mlflow.trace.step_samples import lowest_rank_trace
from neuron_mlflow.trace.timeline import build_timeline
from tests.helpers import ROOT, parent_and_children, run_python
from tests.summary.browser import Console, launch

EXPERIMENT = "rmsnorm-report"
VARIANTS = ("naive", "rms_norm", "compiled")
UPDATE_SCREENSHOTS = os.environ.get("NEURON_MLFLOW_UPDATE_SCREENSHOTS") == "1"  # read before
# the autouse fixture clears NEURON_MLFLOW_* for each test


@pytest.fixture(scope="module")
def browser():
    yield from launch()


@pytest.fixture(scope="module")
def recipe(mlflow_server: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The RMSNorm recipe, run as a user runs it, into the real server."""
    work = tmp_path_factory.mktemp("recipe")
    args = ["--rows", "64", "--hidden", "256", "--warmup", "1", "--active", "2"]
    run_python(
        [str(ROOT / "recipes/rmsnorm.py"), *args, "--backend", "cpu", "--experiment", EXPERIMENT],
        mlflow_server,
        cwd=work,
    )
    client = MlflowClient(mlflow_server)
    parent, children = parent_and_children(client, EXPERIMENT)
    experiment = client.get_experiment_by_name(EXPERIMENT).experiment_id
    return {
        "uri": mlflow_server,
        "client": client,
        "experiment": experiment,
        "parent": parent,
        "children": children,
        "work": work,
    }


def _window(client: MlflowClient, run_id: str) -> str:
    """The run's last window (the recipe logs several)."""
    windows = sorted(a.path for a in client.list_artifacts(run_id, "profile") if a.is_dir)
    return windows[-1]


def _open(browser: Any, recipe: dict[str, Any], run_id: str, path: str, ready: str):
    page = browser.new_page(viewport={"width": 1700, "height": 1300})
    console = Console(page)
    page.goto(
        f"{recipe['uri']}/#/experiments/{recipe['experiment']}/runs/{run_id}/artifacts/{path}"
    )
    frame_element = page.wait_for_selector("iframe[sandbox]", timeout=90_000)
    assert frame_element.get_attribute("sandbox") == "allow-scripts"
    frame = frame_element.content_frame()
    frame.wait_for_function(f"window.{ready} && window.{ready}.ready", timeout=30_000)
    return page, frame, console


def _close_side_panels(page: Any) -> None:
    """Close MLflow's assistant panel, if the UI shows one, for the screenshots."""
    for name in ("Close", "close"):
        button = page.get_by_role("button", name=name)
        if button.count():
            with contextlib.suppress(Exception):  # only cosmetic
                button.first.click(timeout=2_000)
            return


def _screenshot(page: Any, name: str, tmp: Path) -> None:
    _close_side_panels(page)
    page.wait_for_timeout(300)
    target = tmp / name
    page.screenshot(path=str(target))
    if UPDATE_SCREENSHOTS:
        shutil.copy(target, ROOT / "docs" / name)


@pytest.mark.slow
def test_report_in_the_mlflow_ui(browser, recipe, tmp_path: Path) -> None:
    client, run_id = recipe["client"], recipe["children"]["naive"]
    window = _window(client, run_id)
    files = {a.path.rsplit("/", 1)[-1] for a in client.list_artifacts(run_id, window)}
    assert {"report.html", "summary.json", "traces"} <= files
    local = Path(client.download_artifacts(run_id, window, tempfile.mkdtemp()))
    summary = json.loads((local / "summary.json").read_text())["summary"]
    lanes = [lane["name"] for lane in build_timeline(lowest_rank_trace(local / "traces")).lanes]
    page, frame, console = _open(browser, recipe, run_id, f"{window}/report.html", "nmReport")

    drawn = frame.evaluate("window.nmReport.drawn")  # every lane drawn, with bars
    assert list(drawn) == lanes and all(drawn[lane] > 0 for lane in lanes)
    assert any(lane.startswith("CPU") for lane in lanes)
    rows = frame.eval_on_selector_all(
        ".op-row",
        "rows => rows.map(r => [r.dataset.name, parseFloat(r.dataset.value),"
        " r.children[2].textContent, r.children[3].textContent])",
    )
    expected = [
        [op["name"], op["self_cpu_us"], format_us(op["self_cpu_us"]), f"{op['calls']:g}"]
        for op in summary["ops"]
    ]
    assert rows == expected  # the same operators and values as summary.json, in its order
    assert {r[0] for r in rows} >= {"aten::mul", "aten::mean", "aten::add", "aten::rsqrt"}

    canvas = frame.locator("#nm-canvas")
    spot = frame.evaluate("window.nmReport.locate('aten::mul')")
    canvas.hover(position={"x": spot["x"], "y": spot["y"]})
    frame.wait_for_selector("#nm-tip", state="visible")
    tip = frame.text_content("#nm-tip")
    assert "aten::mul" in tip and "duration" in tip and "self time" in tip

    before = frame.evaluate("window.nmReport.view")
    shown = frame.text_content("#nm-range")
    page.mouse.wheel(0, -600)  # the pointer is over the canvas: zoom in
    frame.wait_for_function(
        f"window.nmReport.view.t1 - window.nmReport.view.t0 < {before['t1'] - before['t0']}"
    )
    assert frame.text_content("#nm-range") != shown

    canvas.click(position={"x": spot["x"], "y": spot["y"]})  # select: all its calls
    assert "Selected aten::mul" in frame.text_content("#nm-selection")
    assert console.from_reports() == []
    frame.evaluate("window.nmReport.select('aten::mul')")  # unselect for the picture
    _screenshot(page, "report.png", tmp_path)
    page.close()


@pytest.mark.slow
def test_comparison_in_the_mlflow_ui(browser, recipe, tmp_path: Path) -> None:
    client, parent, children = recipe["client"], recipe["parent"], recipe["children"]
    assert set(children) == set(VARIANTS)
    files = {a.path for a in client.list_artifacts(parent)}
    assert {"comparison.html", "comparison.md"} <= files
    markdown = Path(client.download_artifacts(parent, "comparison.md", tempfile.mkdtemp()))
    text = markdown.read_text()
    assert (
        text.startswith("Result: ") and "\n| variant | device time (us) | self CPU (us) |" in text
    )
    page, frame, console = _open(browser, recipe, parent, "comparison.html", "nmComparison")

    totals = frame.eval_on_selector_all(
        "#nm-totals .cmp-bar", "bars => bars.map(b => b.dataset.run)"
    )
    assert totals == list(VARIANTS) * 3  # on CPU: self CPU time, wall time, op calls
    # the bars show the comparison's values (10th-percentile step of every window's steps):
    # what `neuron-mlflow compare` prints for the same runs
    compared = json.loads(
        run_python(
            ["-m", "neuron_mlflow.cli", "compare", *(children[v] for v in VARIANTS), "--format",
             "json"],
            recipe["uri"],
        )
    )  # fmt: skip
    for variant in VARIANTS:
        run = children[variant]
        ops = {row["op"]: row["values"][run] for row in compared["ops"]}
        bars = frame.eval_on_selector_all(
            f'#nm-op-chart .cmp-bar[data-run="{variant}"][data-value]',
            "bars => bars.map(b => [b.dataset.title, parseFloat(b.dataset.value)])",
        )
        assert bars and all(ops[name] == pytest.approx(value) for name, value in bars)

    bar = frame.locator('#nm-op-chart .cmp-bar[data-run="naive"] .track').first
    bar.hover()
    frame.wait_for_selector("#nm-tip", state="visible")
    assert "naive" in frame.text_content("#nm-tip")
    before = frame.evaluate("window.nmComparison.view")
    page.mouse.wheel(0, -600)
    frame.wait_for_function(f"window.nmComparison.view.hi < {before['hi']}")
    assert console.from_reports() == []
    frame.click("#nm-reset")
    _screenshot(page, "comparison.png", tmp_path)
    page.close()
