"""The decorator and context manager, end to end into a real MLflow SQLite store."""

from __future__ import annotations

import gzip
import json
import warnings
from pathlib import Path

import mlflow
import pytest
import torch
from mlflow import MlflowClient
from torch.profiler import record_function

import neuron_mlflow as nm
from neuron_mlflow.sinks.spool import Spool
from tests.helpers import (
    artifact_files,
    download_json,
    inputs,
    metric_history,
    metrics,
    rmsnorm_fused,
    rmsnorm_naive,
    wait_handled,
)

CORE = {"cpu_time_us", "wall_time_us", "op_calls", "steps"}
SPREAD = {f"{time}_{stat}" for time in ("cpu_time_us", "wall_time_us") for stat in ("p50", "iqr")}


def _run_naive(experiment: str, **kwargs):
    x, w = inputs()
    profiled = nm.profile(
        schedule=nm.Schedule(warmup=3, active=5),
        backend="cpu",
        name="naive",
        experiment_name=experiment,
        top_k=50,
        **kwargs,
    )(rmsnorm_naive)
    results = [profiled(x, w) for _ in range(8)]
    return profiled, results, (x, w)


def test_naive_rmsnorm_window_lands_in_mlflow_with_the_metric_contract(tmp_path) -> None:
    profiled, results, (x, w) = _run_naive("decorator-contract")
    prof = profiled.profiler
    assert torch.equal(results[-1], rmsnorm_naive(x, w))
    assert prof.run_id is not None and prof.summary is not None

    got = metrics(prof.run_id)
    prefix = "profile/naive/"
    assert {k for k in got if k.count("/") == 2} == {prefix + name for name in CORE | SPREAD}
    assert got[prefix + "steps"] == 5
    assert got[prefix + "op_calls"] == 6
    assert not any(k.endswith("device_time_us") or "device" in k for k in got), "CPU: no device"
    assert got[prefix + "op/aten.mul/calls"] == 3
    for op in ("aten.mul", "aten.mean", "aten.add", "aten.rsqrt"):
        assert got[prefix + f"op/{op}/self_cpu_us"] > 0
    per_op_cpu = sum(v for k, v in got.items() if k.endswith("/self_cpu_us"))
    assert per_op_cpu == pytest.approx(got[prefix + "cpu_time_us"], rel=1e-6)
    assert got[prefix + "wall_time_us"] > 0
    # the metric step is the index of the window's last step (calls 3-7 are profiled)
    assert metric_history(prof.run_id, prefix + "op_calls") == [(7, 6.0)]
    assert prof.summary.op_calls == 6 and prof.summary.steps == 5

    run = MlflowClient().get_run(prof.run_id)
    assert run.data.tags["neuron_mlflow.backend"] == "cpu"
    assert run.data.tags["neuron_mlflow.torch_version"] == torch.__version__
    assert run.data.tags["neuron_mlflow.rank"] == "0"
    assert run.data.tags["neuron_mlflow.world_size"] == "1"
    assert {"neuron_mlflow.host", "neuron_mlflow.version", "neuron_mlflow.device"} <= set(
        run.data.tags
    )
    assert run.data.params["profile/naive/config/schedule.active"] == "5"
    assert run.data.params["profile/naive/config/backend"] == "cpu"
    experiment = MlflowClient().get_experiment(run.info.experiment_id)
    assert experiment.name == "decorator-contract"


def test_window_artifacts_hold_summaries_and_the_trace(tmp_path) -> None:
    profiled, _, _ = _run_naive("decorator-artifacts")
    run_id = profiled.profiler.run_id
    folder = "profile/naive/step_000003-000007"
    files = artifact_files(run_id)
    for name in ("summary.md", "summary.json", "ops.csv", "op_keys.json"):
        assert f"{folder}/{name}" in files
    traces = [f for f in files if f.startswith(f"{folder}/traces/rank_0/")]
    assert len(traces) == 1 and traces[0].endswith(".pt.trace.json.gz")

    local = Path(MlflowClient().download_artifacts(run_id, folder, str(tmp_path)))
    trace = json.loads(gzip.decompress((local / traces[0].split(folder + "/")[1]).read_bytes()))
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"aten::mul", "aten::rsqrt"} <= names
    summary = download_json(run_id, f"{folder}/summary.json", tmp_path / "s")
    assert summary["summary"]["op_calls"] == 6
    assert summary["window"] == {"index": 0, "first": 3, "last": 7, "partial": False}
    assert summary["config"]["schedule"]["active"] == 5
    assert summary["environment"]["neuron_mlflow.backend"] == "cpu"
    keys = json.loads((local / "op_keys.json").read_text())
    assert keys["aten.mul"] == "aten::mul"
    table = (local / "summary.md").read_text()
    assert "| Name | Calls | Self CPU | CPU % |" in table
    assert "| aten::mul | 3 |" in table
    assert (local / "ops.csv").read_text().splitlines()[0].startswith("name,key,calls")


def test_fused_rmsnorm_is_one_op_call() -> None:
    x, w = inputs()
    profiled = nm.profile(backend="cpu", name="fused", schedule=nm.Schedule(warmup=1, active=3))(
        rmsnorm_fused
    )
    for _ in range(4):
        profiled(x, w)
    assert metrics(profiled.profiler.run_id)["profile/fused/op_calls"] == 1


def test_work_between_calls_is_not_attributed_to_the_function() -> None:
    w = torch.randn(64)
    profiled = nm.profile(backend="cpu", schedule=nm.Schedule(warmup=0, active=2))(rmsnorm_naive)
    for _ in range(2):
        x = torch.randn(8, 64)  # made by the caller, between calls
        profiled(x, w)
    got = metrics(profiled.profiler.run_id)
    assert got["profile/op_calls"] == 6
    assert not any("aten.randn" in key for key in got)


def test_bare_decorator_reads_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("NEURON_MLFLOW_BACKEND", "cpu")
    monkeypatch.setenv("NEURON_MLFLOW_SCHEDULE__WARMUP", "0")
    monkeypatch.setenv("NEURON_MLFLOW_SCHEDULE__ACTIVE", "2")
    monkeypatch.setenv("NEURON_MLFLOW_METRIC_PREFIX", "bench")

    @nm.profile
    def add_one(t: torch.Tensor, *, by: int = 1) -> torch.Tensor:
        """Add."""
        return t + by

    assert add_one.__name__ == "add_one" and add_one.__doc__ == "Add."
    assert torch.equal(add_one(torch.zeros(2), by=3), torch.full((2,), 3.0))
    add_one(torch.zeros(2))
    assert metrics(add_one.profiler.run_id)["bench/steps"] == 2


def test_methods_can_be_decorated() -> None:
    class Model:
        scale = 2.0

        @nm.profile(backend="cpu", schedule=nm.Schedule(warmup=0, active=1))
        def forward(self, t: torch.Tensor) -> torch.Tensor:
            return t * self.scale

    out = Model().forward(torch.ones(2))
    assert torch.equal(out, torch.full((2,), 2.0))
    assert Model.forward.profiler.summary.op_calls == 1


def test_context_manager_repeat_gives_two_windows_in_one_run() -> None:
    x, w = inputs()
    config = nm.ProfilerConfig(
        backend="cpu", schedule=nm.Schedule(wait=1, warmup=1, active=2, repeat=2)
    )
    with nm.profile(config=config, experiment_name="ctx-repeat") as prof:
        for _ in range(10):
            rmsnorm_naive(x, w)
            prof.step()
    assert prof.wait(timeout_s=60) is True  # both windows uploaded: nothing left to wait for
    records = prof.session.records
    assert [r.status for r in records] == ["done", "done"]
    assert metric_history(prof.run_id, "profile/steps") == [(3, 2.0), (7, 2.0)]
    folders = {f.split("/")[1] for f in artifact_files(prof.run_id)}
    assert folders == {"step_000002-000003", "step_000006-000007"}
    assert prof.summary.steps == 2


def test_active_run_takes_the_window() -> None:
    with mlflow.start_run() as run:
        profiled = nm.profile(backend="cpu", schedule=nm.Schedule(warmup=0, active=1))(
            rmsnorm_fused
        )
        profiled(*inputs())
    assert profiled.profiler.run_id == run.info.run_id
    assert metrics(run.info.run_id)["profile/op_calls"] == 1


def test_explicit_run_id_is_used_without_an_active_run() -> None:
    client = MlflowClient()
    run = client.create_run("0")
    profiled = nm.profile(
        backend="cpu", run_id=run.info.run_id, schedule=nm.Schedule(warmup=0, active=1)
    )(rmsnorm_fused)
    profiled(*inputs())
    assert profiled.profiler.run_id == run.info.run_id
    assert metrics(run.info.run_id)["profile/steps"] == 1


def test_more_than_1000_metrics_in_one_window() -> None:
    def many_ops() -> None:
        for i in range(600):
            with record_function(f"region_{i:03d}"):
                pass

    profiled = nm.profile(backend="cpu", top_k=1000, schedule=nm.Schedule(warmup=0, active=1))(
        many_ops
    )
    profiled()
    got = metrics(profiled.profiler.run_id)
    # the 4 headline metrics, the per-step median and spread of the 2 times, 2 per op
    assert len(got) == 4 + 2 * 2 + 600 * 2
    assert got["profile/op/region_599/calls"] == 1


def test_top_k_limits_per_op_metrics() -> None:
    profiled = nm.profile(backend="cpu", top_k=2, schedule=nm.Schedule(warmup=0, active=1))(
        rmsnorm_naive
    )
    profiled(*inputs())
    got = metrics(profiled.profiler.run_id)
    assert len({k.split("/")[2] for k in got if "/op/" in k}) == 2


def test_upload_traces_false_keeps_traces_local_only(tmp_path) -> None:
    profiled = nm.profile(
        backend="cpu", upload_traces=False, schedule=nm.Schedule(warmup=0, active=1)
    )(rmsnorm_fused)
    profiled(*inputs())
    files = artifact_files(profiled.profiler.run_id)
    assert "profile/step_000000-000000/summary.json" in files
    assert not any("/traces/" in f for f in files)
    (record,) = list(Spool(tmp_path / "neuron_mlflow_traces").windows("done"))
    assert list((record.artifacts_dir / "traces" / "rank_0").glob("*.pt.trace.json.gz"))


def test_exception_mid_window_reraised_unchanged_and_capture_kept(tmp_path) -> None:
    class Boom(RuntimeError):
        pass

    boom = Boom("step 2 failed")
    calls = []

    @nm.profile(backend="cpu", schedule=nm.Schedule(warmup=1, active=4), strict=False)
    def step(x: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        y = x * 2
        if len(calls) == 3:
            raise boom
        return y

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step(torch.ones(2))
        step(torch.ones(2))
        with pytest.raises(Boom) as info:
            step(torch.ones(2))
    assert info.value is boom
    wait_handled(tmp_path / "neuron_mlflow_traces")  # summarised by the worker process
    (record,) = list(Spool(tmp_path / "neuron_mlflow_traces").windows())
    assert record.status == "incomplete"
    assert "Boom: step 2 failed" in record.manifest["error"]
    assert record.manifest["window"]["partial"] is True
    assert record.artifact_path == "profile/step_000001-000002"  # the failing step included
    assert (record.artifacts_dir / "summary.json").is_file()
    assert list((record.artifacts_dir / "traces" / "rank_0").glob("*.pt.trace.json.gz"))
    assert any(str(record.path) in str(w.message) for w in caught)
    assert step.profiler.run_id is None, "an incomplete window is not uploaded"
    # the function keeps working after the failure
    assert torch.equal(step(torch.ones(2)), torch.full((2,), 2.0))


def test_exception_outside_a_window_just_propagates() -> None:
    @nm.profile(backend="cpu", schedule=nm.Schedule(wait=5, warmup=0, active=1))
    def fails() -> None:
        raise KeyError("nope")

    with pytest.raises(KeyError, match="nope"):
        fails()
    assert list(Spool("neuron_mlflow_traces").windows()) == []


def test_context_manager_exception_keeps_capture_and_reraises(tmp_path) -> None:
    with (
        pytest.raises(ZeroDivisionError),
        nm.profile(backend="cpu", strict=False, schedule=nm.Schedule(warmup=0, active=3)) as prof,
    ):
        torch.ones(2) * 2
        prof.step()
        1 / 0  # noqa: B018
    (record,) = list(Spool(tmp_path / "neuron_mlflow_traces").windows("incomplete"))
    assert record.manifest["window"]["last"] == 1


def test_context_manager_closed_early_logs_a_partial_window() -> None:
    with nm.profile(backend="cpu", schedule=nm.Schedule(warmup=0, active=5)) as prof:
        for _ in range(2):
            torch.ones(2) * 2
            prof.step()
    got = metrics(prof.run_id)
    assert got["profile/steps"] == 2
    assert prof.summary.partial is True


def test_bad_arguments_are_rejected_up_front() -> None:
    with pytest.raises(nm.ConfigError, match="backend: got 'tpu'"):
        nm.profile(backend="tpu")
    with pytest.raises(nm.ConfigError, match="invalid profile name 'a/b'"):
        nm.profile(name="a/b")
    with pytest.raises(TypeError, match="takes a function or keyword arguments only"):
        nm.profile(3)  # type: ignore[call-overload]


def test_unavailable_backends_say_what_is_missing() -> None:
    if not torch.cuda.is_available():
        with pytest.raises(nm.BackendUnavailableError, match="backend='cuda' needs"):
            nm.profile(backend="cuda")
    with pytest.raises(nm.BackendUnavailableError, match="backend='neuron'"):
        nm.profile(backend="neuron")
