"""Configuration: :class:`ProfilerConfig` and its nested models.

The fields, their sources and precedence are in docs/configuration.md; which of them a
window's MLflow params hold, in docs/metrics.md. Every invalid value raises
:class:`~neuron_mlflow.errors.ConfigError` naming the field, the value and what is allowed.

Example:
    >>> from neuron_mlflow import ProfilerConfig, Schedule
    >>> cfg = ProfilerConfig(backend="cpu", schedule=Schedule(warmup=2, active=5))
    >>> cfg.schedule.active, cfg.metric_prefix, cfg.top_k
    (5, 'profile', 20)
"""

from __future__ import annotations

import contextvars
import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from neuron_mlflow.errors import ConfigError

BackendName = Literal["auto", "neuron", "cuda", "cpu"]
"""Names accepted by ``ProfilerConfig.backend``."""
BACKEND_NAMES = ("cpu", "cuda", "neuron")
"""Backend names a window is captured with (``capture.backends.*.name``)."""

CONFIG_FILE_ENV = "NEURON_MLFLOW_CONFIG"
"""Environment variable naming a YAML file with ``ProfilerConfig`` fields."""

ENV_PREFIX = "NEURON_MLFLOW_"

_UNITS = {
    "": 1,
    "B": 1,
    **{f"{prefix}B": 1000 ** (power + 1) for power, prefix in enumerate("KMGT")},
    **{f"{prefix}IB": 1024 ** (power + 1) for power, prefix in enumerate("KMGT")},
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def flatten(document: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested ``model_dump(mode="json")`` output as ``{"a.b": "value"}``, every leaf a string.

    Example:
        >>> flatten({"schedule": {"active": 3}, "top_k": 20})
        {'schedule.active': '3', 'top_k': '20'}
    """
    out: dict[str, str] = {}
    for key, value in document.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = str(value)
    return out


def parse_size(value: Any) -> int | None:
    """A byte count from an int or a string such as ``"500MB"``, ``"2 GiB"``, ``"1048576"``.

    ``None``, ``""`` and ``"none"`` mean no limit (``None``). Decimal units are powers of
    1000 (KB, MB, GB, TB), binary ones powers of 1024 (KiB, MiB, GiB, TiB).

    Raises:
        ValueError: the value is not a size; the message names it and the accepted forms.

    Example:
        >>> parse_size("500MB"), parse_size("1 GiB"), parse_size(4096)
        (500000000, 1073741824, 4096)
    """
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    if isinstance(value, str):
        if value.strip().lower() in {"", "none"}:
            return None
        match = _SIZE.match(value)
        if match and match.group(2).upper() in _UNITS:
            return int(float(match.group(1)) * _UNITS[match.group(2).upper()])
    raise ValueError(
        f"{value!r} is not a size in bytes: write a whole number of bytes (1048576) or a number"
        " with a unit (500MB, 2GiB; KB/MB/GB/TB are powers of 1000, KiB/MiB/GiB/TiB of 1024)"
    )


def _fields_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    for part in loc:
        field = model.model_fields.get(str(part))
        annotation = getattr(field, "annotation", None)
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return sorted(model.model_fields)


def config_error(model: type[BaseModel], exc: ValidationError) -> ConfigError:
    """pydantic's ``ValidationError`` of ``model`` as a :class:`ConfigError`: each line names
    the field (dotted path), the value received and what is allowed."""
    lines = [f"invalid {model.__name__}:"]
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        if err["type"] == "extra_forbidden":
            allowed = ", ".join(_fields_at(model, tuple(err["loc"][:-1]))) or "none"
            got = err["input"]
            lines.append(f"  {loc}: unknown field (got {got!r}); allowed fields: {allowed}")
        else:
            lines.append(f"  {loc}: got {err['input']!r}; {err['msg']}")
    return ConfigError("\n".join(lines), errors=exc.errors())


_VALIDATING = contextvars.ContextVar("neuron_mlflow_validating", default=False)


def _validate_readably(model: BaseModel, init: Any, data: dict[str, Any]) -> None:
    """Run pydantic's ``__init__``; the outermost model turns errors into ``ConfigError``
    (nested ones re-raise, so that it names every bad field with its full dotted path)."""
    if _VALIDATING.get():
        init(**data)
        return
    token = _VALIDATING.set(True)
    try:
        init(**data)
    except ValidationError as exc:
        raise config_error(type(model), exc) from None
    finally:
        _VALIDATING.reset(token)


class _StrictModel(BaseModel):
    """Base of the nested models: unknown fields are errors, messages are readable."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def __init__(self, **data: Any) -> None:
        _validate_readably(self, super().__init__, data)


def config_file_problem(path: str | Path, named_by: str = CONFIG_FILE_ENV) -> str | None:
    """Why ``path`` cannot be the YAML file of ``ProfilerConfig`` fields (one line naming
    ``named_by``, the variable or an option such as ``--config``); None when it is a file."""
    where = Path(path)
    if where.is_file():
        return None
    what = "a folder, not a file" if where.is_dir() else "a file that does not exist"
    if named_by == CONFIG_FILE_ENV:
        fix = "set it to a YAML file of ProfilerConfig fields, or unset it"
    else:
        fix = "give a YAML file of ProfilerConfig fields"
    return f"{named_by} names {what}: {str(path)!r}; {fix}"


_PREFIX_PATTERN = r"^[A-Za-z0-9_.\-]+(/[A-Za-z0-9_.\-]+)*$"


class Schedule(_StrictModel):
    """When to profile, in steps; the same meaning as ``torch.profiler.schedule``.

    The first ``skip_first`` steps are ignored; then each cycle of ``wait + warmup + active``
    steps waits, warms the profiler up (recording is discarded) and records ``active`` steps,
    which form one *window*. ``repeat`` cycles are run (``0``: until the end of the job).

    Example:
        >>> s = Schedule(wait=1, warmup=1, active=2)
        >>> s.cycle_steps
        4
        >>> Schedule(active=0)
        Traceback (most recent call last):
        ...
        neuron_mlflow.errors.ConfigError: invalid Schedule:
          active: got 0; Input should be greater than or equal to 1
    """

    skip_first: int = Field(0, ge=0, description="steps ignored before the first cycle (steps)")
    wait: int = Field(0, ge=0, description="idle steps at the start of each cycle (steps)")
    warmup: int = Field(
        1, ge=0, description="steps the profiler runs without recording before a window (steps)"
    )
    active: int = Field(3, ge=1, description="recorded steps per window (steps)")
    repeat: int = Field(1, ge=0, description="number of cycles (windows); 0 means no limit")

    @property
    def cycle_steps(self) -> int:
        """Steps in one cycle: ``wait + warmup + active``."""
        return self.wait + self.warmup + self.active


NeuronMode = Literal["device", "runtime", "cpu_util", "host_memory"]
"""Neuron profile modes (``ProfileMode`` members ``DEVICE``, ``RUNTIME``, ...)."""

_CORE_LIST = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")


class NeuronOptions(_StrictModel):
    """Options of the Neuron backend (``ProfilerConfig.neuron``), passed to ``NeuronConfig``
    (which of them reach it: docs/neuron.md).

    Example:
        >>> NeuronOptions(capture_enabled_for_nc="0,1,2-5").capture_enabled_for_nc
        '0,1,2-5'
        >>> NeuronOptions().modes
        ('device', 'runtime')
        >>> NeuronOptions(capture_enabled_for_nc="3-1")
        Traceback (most recent call last):
        ...
        neuron_mlflow.errors.ConfigError: invalid NeuronOptions:
          capture_enabled_for_nc: got '3-1'; Value error, range '3-1' runs backwards: write low-high
    """

    modes: tuple[NeuronMode, ...] = Field(
        ("device", "runtime"), min_length=1, description="what to capture (profile modes)"
    )
    capture_enabled_for_nc: str | None = Field(
        None, description="NeuronCores to capture: indices and ranges, e.g. '0,1,2-5' (all)"
    )
    correlate_device_time: bool = Field(
        True, description="propagate device time into key_averages() (the seed's setting)"
    )
    precache_node_info: bool = Field(
        True, description="let the SDK cache node information at profiler start (documented)"
    )
    max_events_per_nc: int | None = Field(
        None, ge=1, description="ring buffer per NeuronCore (events)"
    )
    neff_cache_dir: Path | None = Field(None, description="NEFF cache copied into the profile")
    explorer_summary: Literal["auto", "always", "never"] = Field(
        "auto",
        description="run `neuron-explorer view --output-format summary-json` after each window:"
        " auto (when neuron-explorer is on PATH), always (warn when it is missing), never",
    )
    system_metrics: bool | None = Field(
        None,
        description="sample neuron-monitor during the whole job and log system/neuron/..."
        " metrics; None: when the backend is Neuron and neuron-monitor is on PATH",
    )
    monitor_period_s: float = Field(
        5.0, gt=0, le=3600, description="neuron-monitor report period (seconds)"
    )

    @field_validator("modes")
    @classmethod
    def _unique_modes(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(value))

    @field_validator("capture_enabled_for_nc")
    @classmethod
    def _core_list(cls, value: str | None) -> str | None:
        if value is None:
            return None
        compact = value.replace(" ", "")
        if not _CORE_LIST.match(compact):
            raise ValueError(
                "expected NeuronCore indices and ranges separated by commas, e.g. '0,1,2-5' "
                "(no empty parts, letters or signs)"
            )
        for part in compact.split(","):
            low, _, high = part.partition("-")
            if high and int(high) < int(low):
                raise ValueError(f"range {part!r} runs backwards: write low-high")
        return compact


class SlowSteps(_StrictModel):
    """Take a window when steps slow down (the rule: docs/on-demand.md).

    Example:
        >>> SlowSteps().factor, SlowSteps().min_steps
        (1.5, 5)
        >>> try:
        ...     SlowSteps(min_steps=300)
        ... except ValueError as err:
        ...     print(str(err).splitlines()[1][:60])
          (root): got {'min_steps': 300}; Value error, min_steps=300
    """

    factor: float = Field(1.5, gt=1.0, le=1000, description="slow = median above factor x baseline")
    baseline_steps: int = Field(
        200, ge=2, le=100_000, description="steps of the running baseline median (steps)"
    )
    min_steps: int = Field(5, ge=1, description="recent steps whose median is compared (steps)")
    max_windows: int = Field(3, ge=0, description="triggered windows per job at most (count)")
    cooldown_steps: int = Field(
        1000, ge=0, description="steps between the starts of two triggered windows (steps)"
    )

    @model_validator(mode="after")
    def _recent_below_baseline(self) -> SlowSteps:
        if self.min_steps >= self.baseline_steps:
            raise ValueError(
                f"min_steps={self.min_steps} must be below baseline_steps="
                f"{self.baseline_steps} (the recent steps are compared with a longer baseline)"
            )
        return self


class ProfilerConfig(BaseSettings):
    """Everything that shapes a profiling window and where its results go.

    Args:
        backend: ``auto`` (neuron, else cuda, else cpu), ``neuron``, ``cuda`` or ``cpu``.
        schedule: when to profile, see :class:`Schedule`.
        record_shapes, with_stack, profile_memory, with_flops: passed to ``torch.profiler``.
        top_k: number of operators (by device time, else CPU time) logged as MLflow metrics.
        metric_prefix: ``P`` in every metric name ``P/...``.
        local_dir: the local spool: every window is written here before upload.
        keep_local: keep a window's trace files in the spool after MLflow confirmed its upload.
        local_max_bytes: cap on the spool's uploaded trace files (bytes, or ``"500MB"``).
        upload_traces: upload the trace files too (summaries are always uploaded).
        experiment_name: MLflow experiment of a run that neuron-mlflow creates.
        run_name: name of a run that neuron-mlflow creates.
        neuron: Neuron backend options, see :class:`NeuronOptions`.
        strict: re-raise failures of neuron-mlflow's own code instead of warning (for tests).
        upload_timeout_s: how long ``wait()`` and a process's exit wait for the uploads.
        poll_s: how often capture requests are read (docs/on-demand.md); ``0``: off.
        trigger: :class:`SlowSteps`: take a window when steps slow down; ``None``: off.
        capture_signal: the signal that asks for a window (``SIGUSR2``); ``None``: off.
        max_request_steps: the most steps (recorded or warm-up) a request may ask for.

    Every field in detail: docs/configuration.md.

    Raises:
        ConfigError: a value is invalid; the message names field, value and what is allowed.

    Example:
        >>> import os
        >>> os.environ["NEURON_MLFLOW_SCHEDULE__ACTIVE"] = "5"
        >>> ProfilerConfig().schedule.active
        5
        >>> del os.environ["NEURON_MLFLOW_SCHEDULE__ACTIVE"]
        >>> ProfilerConfig(top_k=-1)
        Traceback (most recent call last):
        ...
        neuron_mlflow.errors.ConfigError: invalid ProfilerConfig:
          top_k: got -1; Input should be greater than or equal to 0
    """

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
        validate_default=True,
    )

    backend: BackendName = Field("auto", description="profiling backend")
    schedule: Schedule = Field(default_factory=Schedule, description="when to profile (steps)")
    record_shapes: bool = Field(False, description="record operator input shapes")
    with_stack: bool = Field(False, description="record Python stacks (costly)")
    profile_memory: bool = Field(False, description="record tensor allocations (bytes)")
    with_flops: bool = Field(False, description="estimate FLOPs of matmul/conv (flops)")
    top_k: int = Field(20, ge=0, description="operators logged as metrics (count)")
    metric_prefix: str = Field(
        "profile", pattern=_PREFIX_PATTERN, description="prefix P of every metric name P/..."
    )
    local_dir: Path = Field(
        Path("./neuron_mlflow_traces"), description="local spool directory (path)"
    )
    keep_local: bool = Field(
        False, description="keep trace files in the spool after a confirmed upload"
    )
    local_max_bytes: int | None = Field(
        None, ge=0, description="cap on the spool's uploaded trace files (bytes); None: no cap"
    )
    upload_traces: bool = Field(True, description="upload trace files as artifacts")
    experiment_name: str | None = Field(None, description="experiment for runs we create")
    run_name: str | None = Field(None, description="name of runs we create")
    neuron: NeuronOptions = Field(default_factory=NeuronOptions, description="Neuron options")
    strict: bool = Field(False, description="re-raise our own failures instead of warning")
    upload_timeout_s: float = Field(
        60.0, ge=0, le=86400, description="how long wait() waits for the uploads (seconds)"
    )
    poll_s: float = Field(
        10.0, ge=0, le=3600,
        description="how often a background thread reads capture requests and writes the "
        "heartbeat (seconds); 0: off",
    )  # fmt: skip
    trigger: SlowSteps | None = Field(
        None, description="take a window when steps slow down (SlowSteps); None: off"
    )
    capture_signal: str | None = Field(
        "SIGUSR2",
        description="signal that asks for a window (installed only where the job has no "
        "handler of its own); None: off",
    )
    max_request_steps: int = Field(
        50, ge=1, le=100_000, description="most steps a capture request may ask for (steps)"
    )

    def __init__(self, **values: Any) -> None:
        _validate_readably(self, super().__init__, values)

    @field_validator("metric_prefix")
    @classmethod
    def _no_dot_segments(cls, value: str) -> str:
        if any(part in {".", ".."} for part in value.split("/")):
            raise ValueError("path segments '.' and '..' are not allowed")
        return value

    @field_validator("capture_signal")
    @classmethod
    def _signal_name(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        import signal

        name = value.upper() if value.upper().startswith("SIG") else f"SIG{value.upper()}"
        if not isinstance(getattr(signal, name, None), signal.Signals) or name in {
            "SIGKILL", "SIGSTOP", "SIGTERM", "SIGINT",
        }:  # fmt: skip
            raise ValueError("expected a signal name such as 'SIGUSR2' or 'SIGUSR1' (or None)")
        return name

    @field_validator("local_max_bytes", mode="before")
    @classmethod
    def _size(cls, value: Any) -> int | None:
        return parse_size(value)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Keyword arguments, then environment, then the YAML file in NEURON_MLFLOW_CONFIG."""
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        yaml_path = os.environ.get(CONFIG_FILE_ENV)
        if yaml_path:
            problem = config_file_problem(yaml_path)
            if problem is not None:
                raise ConfigError(problem)
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=yaml_path))
        return tuple(sources)

    def with_overrides(self, **overrides: Any) -> ProfilerConfig:
        """Return a validated copy with ``overrides`` (``ProfilerConfig`` fields) applied.

        Example:
            >>> ProfilerConfig(backend="cpu").with_overrides(top_k=5).top_k
            5
        """
        if not overrides:
            return self
        data = self.model_dump()
        for key, value in overrides.items():
            data[key] = value.model_dump() if isinstance(value, BaseModel) else value
        return ProfilerConfig(**data)

    def flat_params(self) -> dict[str, str]:
        """The config flattened to dotted keys and string values, for MLflow params.

        Example:
            >>> ProfilerConfig(backend="cpu").flat_params()["schedule.active"]
            '3'
        """
        return flatten(self.model_dump(mode="json"))

    def applicable_params(self, backend: str) -> dict[str, str]:
        """Like :meth:`flat_params`, only the fields that apply to ``backend``'s windows
        (``"cpu"``, ``"cuda"``, ``"neuron"``): ``neuron.*`` only to ``"neuron"``, unless set
        away from its default.

        Raises:
            ConfigError: ``backend`` is not a backend name (the message names the value).

        Example:
            >>> cfg = ProfilerConfig(backend="cpu")
            >>> [k for k in cfg.applicable_params("cpu") if k.startswith("neuron.")]
            []
            >>> "neuron.modes" in cfg.applicable_params("neuron")
            True
        """
        if backend not in BACKEND_NAMES:
            raise ConfigError(
                f"applicable_params: unknown backend {backend!r}: expected the backend a window "
                f"was captured with, one of {', '.join(map(repr, BACKEND_NAMES))}"
            )
        defaults = flatten(type(self).model_construct().model_dump(mode="json"))
        return {
            key: value
            for key, value in self.flat_params().items()
            if defaults.get(key) != value or backend == "neuron" or not key.startswith("neuron.")
        }
