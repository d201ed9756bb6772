"""Params that apply: a run's ``P/config/*`` params list what shaped that window's backend.

``ProfilerConfig.applicable_params(backend)`` keeps ``neuron.*`` fields for Neuron windows only,
plus every field set away from its default. ``keep_local`` / ``local_max_bytes`` (spool
clean-up) are read from keywords and from ``NEURON_MLFLOW_*`` like every other field.
"""

from __future__ import annotations

import pytest
from mlflow import MlflowClient

import neuron_mlflow as nm
from neuron_mlflow.errors import ConfigError
from tests.helpers import inputs, rmsnorm_naive


def test_a_cpu_config_has_no_neuron_params() -> None:
    params = nm.ProfilerConfig(backend="cpu").applicable_params("cpu")
    assert [key for key in params if key.startswith("neuron")] == []
    assert params["schedule.active"] == "3" and params["backend"] == "cpu"


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_neuron_fields_apply_only_to_neuron_windows(backend: str) -> None:
    config = nm.ProfilerConfig()
    assert not any(key.startswith("neuron.") for key in config.applicable_params(backend))
    neuron = config.applicable_params("neuron")
    assert neuron["neuron.modes"] == "['device', 'runtime']"
    assert set(neuron) == set(config.flat_params())


def test_a_field_set_away_from_its_default_is_always_a_param() -> None:
    config = nm.ProfilerConfig(neuron=nm.NeuronOptions(capture_enabled_for_nc="0-3"), top_k=5)
    params = config.applicable_params("cpu")
    assert params["neuron.capture_enabled_for_nc"] == "0-3"
    assert params["top_k"] == "5"
    assert "neuron.modes" not in params


def test_an_unknown_backend_name_is_named_in_the_error() -> None:
    with pytest.raises(ConfigError, match=r"'tpu'.*'cpu', 'cuda', 'neuron'"):
        nm.ProfilerConfig().applicable_params("tpu")


def test_keep_local_and_local_max_bytes_from_keywords_and_environment(monkeypatch) -> None:
    config = nm.ProfilerConfig()
    assert config.keep_local is False and config.local_max_bytes is None
    assert nm.ProfilerConfig(local_max_bytes="2GiB").local_max_bytes == 2 * 1024**3
    monkeypatch.setenv("NEURON_MLFLOW_KEEP_LOCAL", "true")
    monkeypatch.setenv("NEURON_MLFLOW_LOCAL_MAX_BYTES", "500MB")
    config = nm.ProfilerConfig()
    assert config.keep_local is True and config.local_max_bytes == 500_000_000


@pytest.mark.parametrize("bad", ["lots", "-5", "5 parsecs", "-1"])
def test_a_bad_size_is_named_in_the_error(bad: str) -> None:
    with pytest.raises(ConfigError, match="local_max_bytes"):
        nm.ProfilerConfig(local_max_bytes=int(bad) if bad == "-1" else bad)


def test_a_cpu_run_logs_no_neuron_params(tmp_path) -> None:
    """The run's params, read back from MLflow, name no Neuron field (the whole config stays in
    the window's config.json)."""
    profiled = nm.profile(
        backend="cpu", schedule=nm.Schedule(warmup=0, active=2), local_dir=tmp_path / "spool"
    )(rmsnorm_naive)
    x, w = inputs()
    for _ in range(2):
        profiled(x, w)
    run_id = profiled.profiler.run_id
    assert run_id is not None
    params = MlflowClient().get_run(run_id).data.params
    assert "profile/config/schedule.active" in params
    neuron = sorted(key for key in params if "neuron" in key.split("/")[-1])
    assert neuron == [], f"a CPU run logged Neuron params: {neuron}"
