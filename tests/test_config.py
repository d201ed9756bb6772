"""ProfilerConfig: defaults, environment, YAML file, and every validation error."""

from __future__ import annotations

from pathlib import Path

import pytest

import neuron_mlflow as nm
from neuron_mlflow import ConfigError, ProfilerConfig, Schedule


def test_defaults_match_the_documented_contract() -> None:
    cfg = ProfilerConfig(strict=False)
    assert cfg.backend == "auto"
    assert cfg.schedule == Schedule(skip_first=0, wait=0, warmup=1, active=3, repeat=1)
    assert (cfg.record_shapes, cfg.with_stack, cfg.profile_memory, cfg.with_flops) == (
        False,
        False,
        False,
        False,
    )
    assert cfg.top_k == 20
    assert cfg.metric_prefix == "profile"
    assert cfg.local_dir == Path("neuron_mlflow_traces")
    assert cfg.upload_traces is True
    assert cfg.experiment_name is None and cfg.run_name is None
    assert cfg.neuron == nm.NeuronOptions()


def test_environment_variables_set_fields_and_nested_fields(monkeypatch) -> None:
    monkeypatch.setenv("NEURON_MLFLOW_BACKEND", "cpu")
    monkeypatch.setenv("NEURON_MLFLOW_SCHEDULE__ACTIVE", "5")
    monkeypatch.setenv("NEURON_MLFLOW_TOP_K", "7")
    monkeypatch.setenv("NEURON_MLFLOW_EXPERIMENT_NAME", "from-env")
    cfg = ProfilerConfig()
    assert (cfg.backend, cfg.schedule.active, cfg.top_k) == ("cpu", 5, 7)
    assert cfg.experiment_name == "from-env"
    assert cfg.schedule.warmup == 1  # untouched nested fields keep their defaults


def test_yaml_file_named_by_env_with_env_taking_precedence(tmp_path, monkeypatch) -> None:
    path = tmp_path / "profiling.yaml"
    path.write_text("backend: cpu\ntop_k: 3\nschedule:\n  warmup: 2\n  active: 4\n")
    monkeypatch.setenv("NEURON_MLFLOW_CONFIG", str(path))
    monkeypatch.setenv("NEURON_MLFLOW_TOP_K", "9")
    cfg = ProfilerConfig()
    assert (cfg.backend, cfg.top_k, cfg.schedule.warmup, cfg.schedule.active) == ("cpu", 9, 2, 4)
    # keyword arguments beat both
    assert ProfilerConfig(top_k=1).top_k == 1


def test_missing_yaml_file_is_named(monkeypatch) -> None:
    monkeypatch.setenv("NEURON_MLFLOW_CONFIG", "/nowhere/profiling.yaml")
    with pytest.raises(ConfigError, match=r"NEURON_MLFLOW_CONFIG.*'/nowhere/profiling.yaml'"):
        ProfilerConfig()


def test_a_config_file_problem_names_where_the_path_came_from(tmp_path, monkeypatch) -> None:
    from neuron_mlflow.config import config_file_problem

    monkeypatch.setenv("NEURON_MLFLOW_CONFIG", str(tmp_path))
    with pytest.raises(ConfigError, match=r"NEURON_MLFLOW_CONFIG names a folder, not a file"):
        ProfilerConfig()
    missing = config_file_problem("p.yaml", "--config")
    assert missing is not None and missing.startswith("--config names a file that does not")
    assert "unset" not in missing  # an option is not unset: the advice is the variable's
    (tmp_path / "p.yaml").write_text("top_k: 3\n")
    assert config_file_problem(tmp_path / "p.yaml", "--config") is None


def test_invalid_yaml_value_is_reported_with_its_field(tmp_path, monkeypatch) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("schedule:\n  repeat: -2\n")
    monkeypatch.setenv("NEURON_MLFLOW_CONFIG", str(path))
    with pytest.raises(ConfigError, match=r"schedule\.repeat: got -2"):
        ProfilerConfig()


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        (
            {"backend": "tpu"},
            "backend: got 'tpu'; Input should be 'auto', 'neuron', 'cuda' or 'cpu'",
        ),
        (
            {"schedule": {"active": 0}},
            "schedule.active: got 0; Input should be greater than or equal to 1",
        ),
        (
            {"schedule": {"wait": -1}},
            "schedule.wait: got -1; Input should be greater than or equal to 0",
        ),
        (
            {"schedule": {"warmup": -3}},
            "schedule.warmup: got -3; Input should be greater than or equal to 0",
        ),
        (
            {"schedule": {"skip_first": -1}},
            "schedule.skip_first: got -1; Input should be greater than or equal to 0",
        ),
        (
            {"schedule": {"repeat": -1}},
            "schedule.repeat: got -1; Input should be greater than or equal to 0",
        ),
        ({"top_k": -1}, "top_k: got -1; Input should be greater than or equal to 0"),
        ({"top_k": "many"}, "top_k: got 'many'; Input should be a valid integer"),
        ({"record_shapes": "maybe"}, "record_shapes: got 'maybe'; Input should be a valid boolean"),
        ({"metric_prefix": ""}, "metric_prefix: got ''; String should match pattern"),
        ({"metric_prefix": "a//b"}, "metric_prefix: got 'a//b'; String should match pattern"),
        ({"metric_prefix": "a b"}, "metric_prefix: got 'a b'; String should match pattern"),
        ({"metric_prefix": "x/../y"}, "metric_prefix: got 'x/../y'; Value error, path segments"),
        (
            {"nonsense": 1},
            "nonsense: unknown field (got 1); allowed fields: backend, capture_signal, "
            "experiment_name",
        ),
        (
            {"schedule": {"activ": 2}},
            "schedule.activ: unknown field (got 2); allowed fields: active, repeat",
        ),
        (
            {"neuron": {"mode": ["device"]}},
            "neuron.mode: unknown field (got ['device']); allowed fields: capture_enabled_for_nc",
        ),
    ],
)
def test_every_invalid_value_names_field_value_and_what_is_allowed(kwargs, expected) -> None:
    with pytest.raises(ConfigError) as info:
        ProfilerConfig(**kwargs)
    assert expected in str(info.value)
    assert isinstance(info.value, ValueError)
    assert info.value.errors, "the structured pydantic errors are kept"


def test_bad_environment_value_is_reported(monkeypatch) -> None:
    monkeypatch.setenv("NEURON_MLFLOW_SCHEDULE__ACTIVE", "0")
    with pytest.raises(ConfigError, match=r"schedule\.active: got '0'"):
        ProfilerConfig()


def test_schedule_direct_construction_errors_are_readable() -> None:
    with pytest.raises(ConfigError, match=r"invalid Schedule:\n  active: got 0"):
        Schedule(active=0)


def test_several_errors_are_all_reported() -> None:
    with pytest.raises(ConfigError) as info:
        ProfilerConfig(backend="tpu", top_k=-5)
    message = str(info.value)
    assert "backend: got 'tpu'" in message and "top_k: got -5" in message


def test_with_overrides_validates_and_replaces_nested_models() -> None:
    base = ProfilerConfig(backend="cpu", schedule=Schedule(wait=4, active=2))
    cfg = base.with_overrides(schedule=Schedule(active=6), top_k=2)
    assert cfg.schedule == Schedule(active=6) and cfg.top_k == 2 and cfg.backend == "cpu"
    with pytest.raises(ConfigError, match="top_k: got -1"):
        base.with_overrides(top_k=-1)


def test_flat_params_are_dotted_strings() -> None:
    params = ProfilerConfig(backend="cpu", schedule=Schedule(active=4)).flat_params()
    assert params["backend"] == "cpu"
    assert params["schedule.active"] == "4"
    assert params["local_dir"] == "neuron_mlflow_traces"


@pytest.mark.parametrize(
    ("cores", "expected"),
    [
        ("3-1", "range '3-1' runs backwards: write low-high"),
        ("a", "expected NeuronCore indices and ranges separated by commas"),
        ("1,,2", "expected NeuronCore indices and ranges"),
        ("", "expected NeuronCore indices and ranges"),
        ("-1", "expected NeuronCore indices and ranges"),
        ("1-", "expected NeuronCore indices and ranges"),
    ],
)
def test_neuron_core_list_errors(cores: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        ProfilerConfig(neuron={"capture_enabled_for_nc": cores})
    assert f"neuron.capture_enabled_for_nc: got {cores!r}" in str(info.value)
    assert expected in str(info.value)


def test_neuron_options_defaults_env_and_mode_errors(monkeypatch) -> None:
    options = ProfilerConfig().neuron
    assert options.modes == ("device", "runtime")
    assert options.correlate_device_time is True
    assert options.capture_enabled_for_nc is None and options.max_events_per_nc is None
    assert nm.NeuronOptions(capture_enabled_for_nc="0, 1, 2-5").capture_enabled_for_nc == "0,1,2-5"
    monkeypatch.setenv("NEURON_MLFLOW_NEURON__CAPTURE_ENABLED_FOR_NC", "0-3")
    monkeypatch.setenv("NEURON_MLFLOW_NEURON__MODES", '["runtime", "cpu_util"]')
    cfg = ProfilerConfig()
    assert cfg.neuron.capture_enabled_for_nc == "0-3"
    assert cfg.neuron.modes == ("runtime", "cpu_util")
    with pytest.raises(ConfigError, match=r"neuron\.modes\.0: got 'gpu'; Input should be 'device'"):
        ProfilerConfig(neuron={"modes": ["gpu"]})
    with pytest.raises(ConfigError, match=r"neuron\.max_events_per_nc: got 0"):
        ProfilerConfig(neuron={"max_events_per_nc": 0})
