"""Device-level analysis with the fake `neuron-explorer` on PATH (tests/neuron_tools/).

The fake prints a summary in the documented shape (one `n_<hex>` id per device profile, a
flat dict of `Summary` field names, `*_percent` on a 0-1 scale). Windows come from the
torch_neuronx double, with device time in key_averages() only.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

from neuron_mlflow.capture.backends import neuron_explorer, neuron_peaks
from neuron_mlflow.capture.backends.neuron_analysis import analyze_window
from neuron_mlflow.summary.ops import RawOp, build_summary
from tests.helpers import ROOT, artifact_files, run_python

DOUBLE = ROOT / "tests" / "neuron_double"
TOOLS = ROOT / "tests" / "neuron_tools"
WINDOW = "profile/step_000001-000002"


def _path(with_tools: bool) -> str:
    parts = [str(Path(sys.executable).parent), "/usr/bin", "/bin"]
    return os.pathsep.join([str(TOOLS), *parts] if with_tools else parts)


def _job(tmp_path: Path, tracking_uri: str, with_tools: bool, **env: str) -> str:
    out = run_python(
        [str(ROOT / "tests" / "neuron_job.py"), str(tmp_path / "spool")],
        tracking_uri,
        PYTHONPATH=f"{DOUBLE}{os.pathsep}{ROOT}",
        PATH=_path(with_tools),
        NEURON_DOUBLE_DEVICE_TIME="key_averages",
        **env,
    )
    return next(line.split("=", 1)[1] for line in out.splitlines() if line.startswith("RUN_ID="))


def _text(run_id: str, tmp_path: Path, name: str) -> str:
    local = MlflowClient().download_artifacts(run_id, f"{WINDOW}/{name}", str(tmp_path))
    return Path(local).read_text()


def test_explorer_numbers_mfu_and_the_verdict_land_in_mlflow(tmp_path, tracking_uri) -> None:
    run_id = _job(tmp_path, tracking_uri, with_tools=True)
    run = MlflowClient().get_run(run_id)
    metrics, tags = run.data.metrics, run.data.tags
    # one device profile per NeuronCore (2): times and bytes summed, shares time-weighted,
    # 0-1 percentages scaled to 0-100
    assert metrics["profile/neuron/total_time_us"] == pytest.approx(2 * 2100.0)
    assert metrics["profile/neuron/tensor_engine_active_pct"] == pytest.approx(18.0)
    assert metrics["profile/neuron/mbu_pct"] == pytest.approx(61.0)
    assert metrics["profile/neuron/dma_active_pct"] == pytest.approx(55.0)
    assert metrics["profile/neuron/hbm_bytes"] == pytest.approx(2 * 4.3e9)
    # every numeric leaf, as written
    assert metrics["profile/neuron/summary/n_0000/mbu_estimated_percent"] == pytest.approx(0.61)
    assert metrics["profile/neuron/summary/n_0001/neuroncore_cycle_count"] == 2520000
    assert metrics["profile/mfu_pct"] == pytest.approx(12.0)  # Explorer's own estimate
    # no FLOPs from torch: achieved TFLOP/s from Explorer's hardware FLOPs over its time
    assert metrics["profile/achieved_tflops"] == pytest.approx(5.0e10 / 0.0021 / 1e12)
    assert 50 < metrics["profile/device_busy_pct"] <= 100
    assert tags["neuron_mlflow.verdict/profile"] == "memory-bound"
    assert f"{WINDOW}/neuron_summary.json" in artifact_files(run_id)
    uploaded = json.loads(_text(run_id, tmp_path, "neuron_summary.json"))
    assert list(uploaded) == ["n_0000", "n_0001"]
    assert uploaded["n_0000"]["mbu_estimated_percent"] == 0.61
    summary_md = _text(run_id, tmp_path, "summary.md")
    assert "- Verdict: memory-bound (memory share 61.0 % > compute share 34.0 %" in summary_md
    assert "- Top operators: aten::mul: " in summary_md
    report = _text(run_id, tmp_path, "report.html")
    assert "Verdict: memory-bound" in report
    document = json.loads(_text(run_id, tmp_path, "summary.json"))
    assert document["summary"]["extra"]["verdict"]["window"] == "memory-bound"


def test_without_explorer_nothing_fails_and_the_summary_says_why(tmp_path, tracking_uri) -> None:
    run_id = _job(tmp_path, tracking_uri, with_tools=False)
    run = MlflowClient().get_run(run_id)
    assert not any("/neuron/" in key or "mfu" in key for key in run.data.metrics)
    assert f"{WINDOW}/neuron_summary.json" not in artifact_files(run_id)
    assert run.data.metrics["profile/device_time_us"] > 0
    summary_md = _text(run_id, tmp_path, "summary.md")
    assert "neuron-explorer is not on PATH on this host" in summary_md
    assert "- Verdict: " in summary_md  # from the device busy share alone


def test_a_failing_explorer_keeps_the_window(tmp_path, tracking_uri) -> None:
    run_id = _job(tmp_path, tracking_uri, with_tools=True, FAKE_EXPLORER_FAIL="1")
    run = MlflowClient().get_run(run_id)
    assert run.data.metrics["profile/device_time_us"] > 0
    assert not any("/neuron/" in key for key in run.data.metrics)
    assert "neuron-explorer failed" in _text(run_id, tmp_path, "summary.md")


def test_explorer_summary_never_does_not_run_it(tmp_path, monkeypatch) -> None:
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("PATH", _path(with_tools=True))
    monkeypatch.setenv("FAKE_EXPLORER_LOG", str(log))
    summary = build_summary([RawOp("aten::mul", 3, 6.0, 6.0, 900.0, 900.0)], 3, 1, 2e3, "NEURON")
    analysis = analyze_window("P", summary, 90.0, tmp_path, tmp_path, mode="never")
    assert not log.exists() and analysis.metrics == {}
    assert "off (neuron.explorer_summary='never')" in analysis.summary.extra["device_notes"][0]


def test_summary_json_is_read_generically() -> None:
    several = {
        "n_1": {"total_time": 0.001, "mfu_estimated_percent": 10.0, "hbm_read_bytes": 5},
        "n_2": {"total_time": 0.003, "mfu_estimated_percent": 30.0, "new_field": {"x": 1}},
    }
    head = neuron_explorer.headline(several)  # 0-100 scale (a value above 1)
    assert head["total_time_us"] == pytest.approx(4000.0)
    assert head["mfu_pct"] == pytest.approx(25.0)  # weighted by total_time
    assert head["hbm_bytes"] == 5
    metrics = neuron_explorer.explorer_metrics("P", several)
    assert metrics["P/neuron/summary/n_2/new_field/x"] == 1.0
    assert metrics["P/neuron/summary/n_1/hbm_read_bytes"] == 5.0


def test_mfu_from_flops_and_the_documented_peak(monkeypatch) -> None:
    monkeypatch.setenv("NEURON_RT_NUM_CORES", "2")
    monkeypatch.delenv("NEURON_LOGICAL_NC_CONFIG", raising=False)
    raw = [RawOp("aten::mm", 1, 5.0, 5.0, 900.0, 900.0, flops=3.3e10)]
    summary = build_summary(raw, 1, 1, 1000.0, device_label="NEURON")  # 33 TFLOP/s achieved
    analysis = analyze_window("P", summary, 95.0, None, None, "never", "trn2.48xlarge")
    peak = neuron_peaks.PEAKS["trn2"].core_tflops() * 2  # 2 cores at LNC=2: 333.5 TFLOPS
    assert analysis.metrics["P/mfu_pct"] == pytest.approx(100 * 33.0 / peak)
    assert analysis.summary.extra["verdict"]["ops"] == {"aten::mm": "compute-bound"}
    assert neuron_peaks.PEAKS["trn1"].core_tflops() == pytest.approx(95.0)
