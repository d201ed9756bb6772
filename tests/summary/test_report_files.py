"""report.html lands in every window folder, live and ingested, and never fails a window."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import mlflow
import pytest
from mlflow import MlflowClient

import neuron_mlflow as nm
from neuron_mlflow.engine.pipeline import write_files
from neuron_mlflow.errors import NeuronMlflowWarning
from neuron_mlflow.sinks.spool import Spool, WindowRecord
from neuron_mlflow.summary.ops import RawOp, build_summary
from neuron_mlflow.summary.report import BUDGET_BYTES
from tests.helpers import artifact_files, inputs, rmsnorm_naive

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"


def _data(page: str) -> dict:
    block = page.split('id="nm-data">', 1)[1].split("</script>", 1)[0]
    return json.loads(block.replace("\\u003c", "<"))


def test_live_window_gets_a_report_with_its_timeline(tmp_path: Path) -> None:
    x, w = inputs()
    mlflow.set_experiment("report-live")
    with mlflow.start_run() as run:  # the run is known when the report is written
        profiled = nm.profile(
            backend="cpu", name="naive", schedule=nm.Schedule(warmup=1, active=3)
        )(rmsnorm_naive)
        for _ in range(4):
            profiled(x, w)
        profiled.profiler.session.wait(60)
    run_id = run.info.run_id
    assert profiled.profiler.run_id == run_id
    folder = "profile/naive/step_000001-000003"
    assert f"{folder}/report.html" in artifact_files(run_id)
    local = Path(MlflowClient().download_artifacts(run_id, f"{folder}/report.html", str(tmp_path)))
    page = local.read_text()
    assert len(page.encode()) < BUDGET_BYTES
    data = _data(page)["timeline"]
    assert data["lanes"][0]["name"].startswith("CPU")
    assert {"aten::mul", "aten::rsqrt"} <= set(data["names"])
    assert len(data["steps"]) == 3  # one ProfilerStep per profiled call
    for label in ("backend", "window", "window id", "torch", "neuron-mlflow"):
        assert f"<b>{label}</b>" in page
    assert "steps 1-3" in page and folder in page and f"<b>run</b>{run_id}" in page


def test_ingested_window_gets_a_report(tmp_path: Path) -> None:
    from neuron_mlflow.cli import main

    trace = TRACES / "cuda_sampled_rank0.json.gz"
    assert main(["ingest", str(trace), "--experiment", "report-ingest"]) == 0
    client = MlflowClient()
    experiment = client.get_experiment_by_name("report-ingest")
    (run,) = client.search_runs([experiment.experiment_id])
    files = artifact_files(run.info.run_id)
    (report,) = [f for f in files if f.endswith("/report.html")]
    page = Path(client.download_artifacts(run.info.run_id, report, str(tmp_path))).read_text()
    lanes = [lane["name"] for lane in _data(page)["timeline"]["lanes"]]
    assert lanes[:2] == ["CPU thread 4037 (python3.8)", "CPU thread 23695 (python3.8)"]
    assert "GPU 0 stream 7" in lanes


def _window(
    tmp_path: Path, trace_text: str | None, report_dir: bool = False, strict: bool = False
) -> WindowRecord:
    """A window put in place and given its files (``report_dir``: a folder where its
    ``report.html`` goes, so that the report cannot be written)."""
    staged = tmp_path / "staged"
    (staged / "artifacts" / "traces" / "rank_0").mkdir(parents=True)
    if trace_text is not None:
        (staged / "artifacts" / "traces" / "rank_0" / "t.json").write_text(trace_text)
    if report_dir:
        (staged / "artifacts" / "report.html").mkdir()  # cannot be written as a file
    spool = Spool(tmp_path / "spool")
    record = spool.create_window(
        spool.new_session_dir(), "profile/step_000000-000001", summarised=False, staged=staged,
        prefix="profile", window={"index": 0, "first": 0, "last": 1},
    )  # fmt: skip
    summary = build_summary([RawOp("aten::mul", 2, 4.0, 4.0)], 2, 2, 10.0)
    write_files(record, summary, 20, {}, strict=strict)
    record.summarised({})
    return record


def test_unreadable_trace_gives_a_report_without_timeline(tmp_path: Path) -> None:
    record = _window(tmp_path, '{"traceEvents": [')
    page = (record.artifacts_dir / "report.html").read_text()
    assert "no timeline" in page and "aten::mul" in page
    assert record.status == "pending"


def test_a_failing_report_never_fails_the_window(tmp_path: Path) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        record = _window(tmp_path, "[]", report_dir=True)
    assert record.status == "pending" and record.manifest["summarised"] is True
    assert (record.artifacts_dir / "summary.md").is_file()
    assert any(issubclass(c.category, NeuronMlflowWarning) for c in caught)
    assert "report" in str(next(c.message for c in caught))


def test_strict_mode_raises_a_report_failure(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError):
        _window(tmp_path, "[]", report_dir=True, strict=True)
