"""report.html of a window from each real trace: opens without errors in a sandboxed frame
(as MLflow's artifact viewer shows it), draws every lane, and stays under its size budget."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from neuron_mlflow.summary.report import BUDGET_BYTES, render_report
from neuron_mlflow.summary.tables import format_us
from neuron_mlflow.trace.summarize import summarize_trace
from neuron_mlflow.trace.timeline import build_timeline
from tests.summary.browser import Console, launch, sandboxed

ROOT = Path(__file__).resolve().parents[2]
TRACES = sorted(
    {
        p.name: p
        for d in (ROOT / "tests/data/traces", ROOT.parent / "shared/traces")
        if d.is_dir()
        for p in d.glob("*.json.gz")
    }.values()
)


@pytest.fixture(scope="module")
def browser():
    yield from launch()


def _report(path: Path, budget: int = BUDGET_BYTES) -> tuple[str, dict, object]:
    result = summarize_trace(path)
    timeline = build_timeline(path).to_dict()
    header = {"backend": "ingest", "device": result.summary.device_label, "window": "steps 0-1"}
    return render_report(result.summary, header, timeline, budget), timeline, result.summary


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name.split(".")[0])
def test_real_trace_report_opens_and_draws_every_lane(browser, path: Path) -> None:
    text, timeline, summary = _report(path)
    assert len(text.encode()) < BUDGET_BYTES
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    console = Console(page)
    frame = sandboxed(page, text)
    frame.wait_for_function("window.nmReport && window.nmReport.ready")
    drawn = frame.evaluate("window.nmReport.drawn")
    lanes = {lane["name"] for lane in timeline["lanes"]}
    assert set(drawn) == lanes and all(drawn[name] > 0 for name in lanes)
    rows = frame.eval_on_selector_all(
        ".op-row", "rows => rows.map(r => [r.dataset.name, r.children[2].textContent])"
    )
    device = summary.device_time_us is not None
    expected = [
        [op.name, format_us((op.self_device_us if device else op.self_cpu_us) or 0.0)]
        for op in summary.ops
    ]
    assert rows == expected
    assert console.from_reports() == []
    assert [u for u in console.requests if not u.startswith(("about:", "data:"))] == []
    page.close()


def test_over_budget_keeps_the_longest_bars_and_says_how_many_it_left_out(browser) -> None:
    path = next(p for p in TRACES if p.name.startswith("cuda_sampled"))
    text, timeline, _ = _report(path, budget=200_000)
    assert len(text.encode()) <= 200_000
    data = json.loads(
        text.split('id="nm-data">', 1)[1].split("</script>", 1)[0].replace("\\u003c", "<")
    )["timeline"]
    kept = data["events"]["dur_us"]
    assert 0 < len(kept) < len(timeline["events"]["dur_us"])
    assert min(kept) >= max(timeline["events"]["dur_us"][len(kept) :])  # the longest stay
    assert data["left_out"] == data["total_events"] - len(kept)
    page = browser.new_page()
    console = Console(page)
    frame = sandboxed(page, text)
    frame.wait_for_function("window.nmReport && window.nmReport.ready")
    note = frame.text_content("#nm-left-out")
    assert f"{data['left_out']:,} shorter ones left out" in note
    assert console.from_reports() == []
    page.close()


def test_hover_shows_shapes_and_the_launching_operator_click_selects(browser) -> None:
    path = next(p for p in TRACES if p.name.startswith("rocm_mi250"))
    text, timeline, _ = _report(path)
    ev, names, shapes = timeline["events"], timeline["names"], timeline["shapes"]
    shaped = max(
        (i for i in range(len(ev["dur_us"])) if ev["kind"][i] == 0 and ev["shape"][i] >= 0),
        key=lambda i: ev["dur_us"][i],
    )
    kernel = max(
        (i for i in range(len(ev["dur_us"])) if ev["kind"][i] == 1 and ev["launcher"][i] >= 0),
        key=lambda i: ev["dur_us"][i],
    )
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    console = Console(page)
    frame = sandboxed(page, text)
    frame.wait_for_function("window.nmReport && window.nmReport.ready")
    canvas = frame.locator("#nm-canvas")

    def hover(name: str) -> str:
        spot = frame.evaluate("name => window.nmReport.locate(name)", name)
        canvas.hover(position={"x": spot["x"], "y": spot["y"]})
        frame.wait_for_selector("#nm-tip", state="visible")
        return frame.text_content("#nm-tip")

    tip = hover(names[ev["name"][shaped]])
    assert f"input shapes: {shapes[ev['shape'][shaped]]}" in tip and "self time" in tip
    tip = hover(names[ev["name"][kernel]])
    assert f"launched by {names[ev['launcher'][kernel]]}" in tip and "(device)" in tip
    launcher = names[ev["launcher"][kernel]]
    frame.locator(f'.op-row[data-name="{launcher}"] .name').click()  # select from the table
    selection = frame.text_content("#nm-selection")
    assert selection.startswith(f"Selected {launcher}: ") and "device event(s)" in selection
    assert frame.locator(".op-row.selected").count() == 1
    assert console.from_reports() == []
    page.close()
