"""Neuron device time per window: from the framework trace, or from key_averages() only.

The torch_neuronx double gives every launching CPU operator 100 us of device time (and writes
what it put where into a ledger: ``NEURON_DOUBLE_LEDGER``), through trace.json
(``NEURON_DOUBLE_DEVICE_TIME=trace``) or only through the profiler's events and
``key_averages()`` (``key_averages``, with ``correlate_device_time=True``, the documented
case: device rows in ``self_device_time_total``, ``Self NEURON`` columns). With ``--between``
the job also runs unprofiled ``torch.ones(8) * 3`` between calls (device time too), which
must not count.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from mlflow import MlflowClient

from tests.helpers import ROOT, run_python

DOUBLE = ROOT / "tests" / "neuron_double"
WINDOW = "profile/step_000001-000002"
US_PER_OP = 100.0


def _run(tmp_path: Path, tracking_uri: str, *args: str, **env: str) -> tuple[str, list[str]]:
    out = run_python(
        [str(ROOT / "tests" / "neuron_job.py"), str(tmp_path / "spool"), *args],
        tracking_uri,
        PYTHONPATH=f"{DOUBLE}{os.pathsep}{ROOT}",
        **env,
    )
    lines = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return lines["RUN_ID"], json.loads(lines["OPTIONS"])


def _summary(run_id: str, tmp_path: Path, name: str) -> str:
    local = MlflowClient().download_artifacts(run_id, f"{WINDOW}/{name}", str(tmp_path))
    return Path(local).read_text()


@pytest.mark.parametrize("source", ["key_averages", "trace"])
def test_device_time_per_step_is_what_the_double_put_on_the_calls(
    tmp_path, tracking_uri, source
) -> None:
    ledger = tmp_path / "ledger.jsonl"
    run_id, options = _run(
        tmp_path,
        tracking_uri,
        "--between",
        NEURON_DOUBLE_DEVICE_TIME=source,
        NEURON_DOUBLE_LEDGER=str(ledger),
    )
    put = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert any(not entry["marked"] for entry in put), "the double also ran work between calls"
    run = MlflowClient().get_run(run_id)
    metrics, tags = run.data.metrics, run.data.tags
    assert tags["neuron_mlflow.device_time_source"] == source
    assert "correlate_device_time" in options and "precache_node_info" in options
    # x*x, *inv, *w: three muls per call; the unprofiled `* 3` between calls is left out
    assert metrics["profile/op/aten.mul/self_device_us"] == pytest.approx(3 * US_PER_OP)
    assert metrics["profile/op/aten.rsqrt/self_device_us"] == pytest.approx(US_PER_OP)
    assert "profile/op/aten.ones/calls" not in metrics
    per_op = {k: v for k, v in metrics.items() if k.endswith("/self_device_us")}
    # what the double put on the window's own (marked) steps: no more, no less, each once
    steps = metrics["profile/steps"]
    marked = sum(entry["us"] for entry in put if entry["marked"])
    assert metrics["profile/device_time_us"] == pytest.approx(marked / steps)
    assert metrics["profile/device_time_us"] == pytest.approx(sum(per_op.values()))
    assert 0 < metrics["profile/device_busy_pct"] <= 100
    table = _summary(run_id, tmp_path, "summary.md")
    assert "| Name | Calls | Self CPU | Self NEURON | NEURON % |" in table
    assert "Self NEURON time total" in table


def test_key_averages_rows_are_shaped_like_the_sdk(tmp_path) -> None:
    """The double's documented case as torch's own table shows it (the seed's columns)."""
    code = (
        "import torch, torch_neuronx\n"
        "from torch_neuronx.profiling import NeuronConfig, ProfileMode\n"
        "from torch.profiler import profile, ProfilerActivity\n"
        f"cfg = NeuronConfig(modes=[ProfileMode.DEVICE], profile_output_dir={str(tmp_path)!r},"
        " correlate_device_time=True)\n"
        "with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1],"
        " experimental_config=cfg) as prof:\n"
        "    _ = torch.ones(4) * 2\n"
        "print(prof.key_averages().table(sort_by='self_device_time_total'))\n"
        "rows = [r for r in prof.key_averages() if r.key == 'aten::mul']\n"
        "import json\n"
        "print('DEVICE_ROWS=' + json.dumps([sorted(str(r.device_type) for r in rows),"
        " sorted(r.self_device_time_total for r in rows)]))\n"
    )
    out = run_python(
        ["-c", code],
        "sqlite:///unused.db",
        PYTHONPATH=f"{DOUBLE}{os.pathsep}{ROOT}",
        NEURON_DOUBLE_DEVICE_TIME="key_averages",
    )
    assert "Self NEURON" in out and "Self NEURON time total" in out
    line = next(line for line in out.splitlines() if line.startswith("DEVICE_ROWS="))
    device_types, self_device_us = json.loads(line.split("=", 1)[1])
    assert device_types == ["DeviceType.CPU", "DeviceType.NEURON"]
    assert self_device_us == pytest.approx([US_PER_OP, US_PER_OP])


def test_an_sdk_without_correlate_device_time_is_told_once_and_tagged(
    tmp_path, tracking_uri
) -> None:
    run_id, options = _run(
        tmp_path,
        tracking_uri,
        NEURON_DOUBLE_REJECT="correlate_device_time",
        NEURON_DOUBLE_DEVICE_TIME="key_averages",
    )
    assert "correlate_device_time" not in options and "precache_node_info" in options
    run = MlflowClient().get_run(run_id)
    assert run.data.tags["neuron_mlflow.neuron.correlate_device_time"] == "unsupported"
    assert run.data.tags["neuron_mlflow.device_time_source"] == "none"
    assert "does not accept correlate_device_time" in _summary(run_id, tmp_path, "summary.md")


def test_an_explicit_option_the_sdk_rejects_fails_loudly(tmp_path, tracking_uri) -> None:
    with pytest.raises(AssertionError, match="correlate_device_time"):
        _run(
            tmp_path,
            tracking_uri,
            "--neuron",
            "correlate_device_time=true",
            NEURON_DOUBLE_REJECT="correlate_device_time",
        )


def test_the_per_rank_framework_trace_name_is_read(tmp_path, tracking_uri) -> None:
    run_id, _ = _run(
        tmp_path,
        tracking_uri,
        NEURON_DOUBLE_TRACE_NAME="rank",
        NEURON_DOUBLE_DEVICE_TIME="trace",
        RANK="0",
    )
    run = MlflowClient().get_run(run_id)
    assert run.data.tags["neuron_mlflow.device_time_source"] == "trace"
    assert run.data.metrics["profile/op/aten.rsqrt/self_device_us"] == pytest.approx(US_PER_OP)
