"""The Neuron backend against the torch_neuronx test double, each run in its own process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

import neuron_mlflow as nm
from neuron_mlflow.cli import main
from neuron_mlflow.trace.summarize import summarize_trace
from tests.helpers import ROOT, artifact_files, run_python

DOUBLE = ROOT / "tests" / "neuron_double"
WINDOW = "profile/step_000001-000002"


def _run(tmp_path: Path, tracking_uri: str, *args: str, **env: str) -> tuple[str, list[str], str]:
    out = run_python(
        [str(ROOT / "tests" / "neuron_job.py"), str(tmp_path / "spool"), *args],
        tracking_uri,
        PYTHONPATH=f"{DOUBLE}{os.pathsep}{ROOT}",
        **env,
    )
    lines = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return lines["RUN_ID"], json.loads(lines["OPTIONS"]), lines["SYNCS"]


def test_device_events_in_trace_json_give_device_time(tmp_path, tracking_uri) -> None:
    run_id, options, syncs = _run(
        tmp_path,
        tracking_uri,
        "--cores",
        "0,1",
        NEURON_DOUBLE_DEVICE_EVENTS="1",
        XLA_IR_DEBUG="1",
    )
    run = MlflowClient().get_run(run_id)
    metrics, tags = run.data.metrics, run.data.tags
    assert tags["neuron_mlflow.device_time_source"] == "trace"
    assert tags["neuron_mlflow.backend"] == "neuron"
    assert tags["neuron_mlflow.torch_neuronx_version"] == "2.13.0.double"
    assert tags["neuron_mlflow.env.XLA_IR_DEBUG"] == "1"
    assert tags["neuron_mlflow.neuron.modes"] == "device,runtime"
    assert tags["neuron_mlflow.neuron.cores"] == "0,1"
    # the double gives every operator call in trace.json 100 us on the device
    per_op = {k: v for k, v in metrics.items() if k.endswith("/self_device_us")}
    assert metrics["profile/device_time_us"] == pytest.approx(sum(per_op.values()))
    assert metrics["profile/op/aten.mul/self_device_us"] == pytest.approx(300)  # 3 calls
    assert metrics["profile/op/aten.rsqrt/self_device_us"] == pytest.approx(100)
    assert metrics["profile/op/aten.mul/device_pct"] == pytest.approx(
        100 * 300 / metrics["profile/device_time_us"]
    )
    assert metrics["profile/op_calls"] == 6
    # the options the user set, plus modes, the output folder and the two documented defaults
    assert options == [
        "capture_enabled_for_nc",
        "correlate_device_time",
        "modes",
        "precache_node_info",
        "profile_output_dir",
    ]
    assert tags["neuron_mlflow.neuron.correlate_device_time"] == "true"
    assert int(syncs) >= 3


def test_neuron_output_tree_is_uploaded_unchanged(tmp_path, tracking_uri) -> None:
    run_id, _, _ = _run(tmp_path, tracking_uri)
    files = artifact_files(run_id)
    traces = [f for f in files if f.startswith(f"{WINDOW}/traces/rank_0/")]
    names = sorted(f.split("/")[-1] for f in traces)
    assert names == [
        "neff_0123abcd_vnc_0.neff",
        "ntrace.pb",
        "profile_nc_0_session_0.ntff",
        "profile_nc_1_session_0.ntff",
        "trace.json",
        "trace_info.pb",
    ]
    instance = {f.split("/")[4] for f in traces}
    assert len(instance) == 1 and instance.pop().startswith("i-0double000000000_pid_")
    assert all(len(f.split("/")) == 7 for f in traces), "<instance>_pid_<pid>/<timestamp>/file"


def test_without_device_time_no_device_metrics_are_logged(tmp_path, tracking_uri) -> None:
    run_id, _, _ = _run(tmp_path, tracking_uri)
    run = MlflowClient().get_run(run_id)
    assert run.data.tags["neuron_mlflow.device_time_source"] == "none"
    assert not any("device" in key for key in run.data.metrics)
    local = MlflowClient().download_artifacts(run_id, f"{WINDOW}/summary.md", str(tmp_path))
    assert "NEURON device time was not captured in this window" in Path(local).read_text()


def test_inspect_env_warning_and_device_mode_note(tmp_path) -> None:
    code = (
        "import logging, warnings; logging.basicConfig(level=logging.INFO);"
        "warnings.simplefilter('always');"
        "import neuron_mlflow as nm; nm.profile(backend='neuron')"
    )
    env = {
        **os.environ,
        "PYTHONPATH": f"{DOUBLE}{os.pathsep}{ROOT}",
        "NEURON_RT_INSPECT_ENABLE": "1",
    }
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "NEURON_RT_INSPECT_ENABLE=1 is set" in result.stderr
    assert "reserves device memory" in result.stderr


def test_placeholder_package_is_recognised(tmp_path) -> None:
    fake = tmp_path / "placeholder" / "torch_neuronx"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        'raise ImportError("WRONG PACKAGE. Please install the package from Neuron Repository")'
    )
    code = "import neuron_mlflow as nm; nm.profile(backend='neuron')"
    env = {**os.environ, "PYTHONPATH": f"{fake.parent}{os.pathsep}{ROOT}"}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert result.returncode != 0
    assert "BackendUnavailableError" in result.stderr
    assert "PyPI's placeholder package" in result.stderr
    assert "pip install torch-neuronx" in result.stderr


def test_missing_sdk_says_how_to_install() -> None:
    with pytest.raises(nm.BackendUnavailableError, match="needs the AWS Neuron SDK"):
        nm.profile(backend="neuron")


def test_trace_attribution_innermost_op_and_unknown_correlation(tmp_path) -> None:
    trace = {
        "traceEvents": [
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "aten::linear",
                "pid": 1,
                "tid": 1,
                "ts": 0,
                "dur": 50,
            },
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "aten::addmm",
                "pid": 1,
                "tid": 1,
                "ts": 5,
                "dur": 20,
            },
            {
                "ph": "X",
                "cat": "privateuse1_runtime",
                "name": "l",
                "pid": 1,
                "tid": 1,
                "ts": 6,
                "dur": 1,
                "args": {"correlation": 1},
            },
            {
                "ph": "X",
                "cat": "privateuse1_runtime",
                "name": "l",
                "pid": 1,
                "tid": 1,
                "ts": 30,
                "dur": 1,
                "args": {"correlation": 2},
            },
            {
                "ph": "X",
                "cat": "privateuse1_driver",
                "name": "gemm",
                "pid": 9,
                "tid": 0,
                "ts": 8,
                "dur": 70,
                "args": {"correlation": 1},
            },
            {
                "ph": "X",
                "cat": "privateuse1_driver",
                "name": "bias",
                "pid": 9,
                "tid": 0,
                "ts": 80,
                "dur": 5,
                "args": {"correlation": 2},
            },
            {
                "ph": "X",
                "cat": "privateuse1_driver",
                "name": "orphan",
                "pid": 9,
                "tid": 0,
                "ts": 90,
                "dur": 3,
                "args": {"correlation": 99},
            },
            {"ph": "M", "name": "process_name", "pid": 9, "args": {"name": "neuron"}},
        ]
    }
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace))
    result = summarize_trace(path)
    per_op = {op.name: op.self_device_us for op in result.summary.ops}
    assert per_op == {"aten::addmm": 70.0, "aten::linear": 5.0, "l": 0.0}  # "l": the calls
    calls = {op.name: (op.calls, op.self_cpu_us) for op in result.summary.ops}
    assert calls == {"aten::addmm": (1, 19.0), "aten::linear": (1, 29.0), "l": (2, 2.0)}
    assert result.kernels == {"gemm": 70.0, "bias": 5.0, "orphan": 3.0}
    assert result.unattributed_device_events == 1
    assert result.summary.device_label == "NEURON"


def test_download_fetches_the_tree_and_prints_neuron_explorer_commands(
    tmp_path, tracking_uri, capsys
) -> None:
    run_id, _, _ = _run(tmp_path, tracking_uri)
    dest = tmp_path / "fetched"
    assert main(["download", run_id, "--dest", str(dest)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"# window {WINDOW} of run {run_id}")
    (system,) = [line for line in out if line.startswith("neuron-explorer view -d ")]
    folder = Path(system.split(" -d ", 1)[1].split(" ")[0])
    assert (folder / "trace_info.pb").is_file() and (folder / "trace.json").is_file()
    assert folder.parent.name.startswith("i-0double000000000_pid_")
    assert system.endswith(f"--ingest-only --display-name {run_id}/step_000001-000002/rank_0")
    pairs = [line for line in out if line.startswith("neuron-explorer view -n ")]
    assert [line.split(" --ingest-only")[0] for line in pairs] == [
        f"neuron-explorer view -n {folder / 'neff_0123abcd_vnc_0.neff'} "
        f"-s {folder / f'profile_nc_{core}_session_0.ntff'}"
        for core in (0, 1)
    ]
    assert main(["download", run_id, "--window", "step_000001-000002", "--dest", str(dest)]) == 0
    capsys.readouterr()
    assert main(["download", run_id, "--window", "step_000009-000009", "--dest", str(dest)]) == 2
    assert "window 'step_000009-000009' was not found" in capsys.readouterr().err
    assert main(["download", "f" * 32, "--dest", str(dest)]) == 2
    assert "was not found" in capsys.readouterr().err


def test_auto_picks_neuron_when_the_sdk_and_a_device_are_there() -> None:
    code = (
        "from neuron_mlflow.capture.backends import resolve_backend;"
        "print(resolve_backend('auto').name)"
    )
    env = {**os.environ, "PYTHONPATH": f"{DOUBLE}{os.pathsep}{ROOT}"}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "neuron"
