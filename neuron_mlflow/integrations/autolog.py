"""``nm.autolog()``: every training loop of this process profiled, without code changes.

From the call on (MLflow's ``autolog`` convention), every Lightning ``Trainer`` gets a
:class:`~neuron_mlflow.integrations.lightning.NeuronProfilerCallback` and every
``transformers.Trainer`` an ``HfProfilerCallback``, unless it has one (``Trainer.__init__``
is wrapped by a post-import hook when the framework is imported, now or later), and any other
loop is profiled by the steps of the first optimizer stepped, the *clock* (torch's global
optimizer step hook), unless a Trainer's callback or an open ``nm.profile`` owns its steps.
``neuron-mlflow run``'s ``sitecustomize`` calls :func:`autolog_from_environment`. What a
step is, the run, the exit and the one warning when nothing was profiled: ``docs/autolog.md``.

Example:
    >>> import tempfile, torch
    >>> import neuron_mlflow as nm
    >>> nm.autolog(backend="cpu", local_dir=tempfile.mkdtemp(),
    ...            schedule=nm.Schedule(warmup=1, active=2))
    >>> model = torch.nn.Linear(4, 1)
    >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> for _ in range(5):
    ...     optimizer.zero_grad()
    ...     model(torch.randn(8, 4)).sum().backward()
    ...     optimizer.step()  # ends one step
    >>> nm.autolog(disable=True)  # the window in MLflow; the hook removed
    >>> summary = autolog_summary()
    >>> summary.steps
    2
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib
import importlib.util
import os
import sys
import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from neuron_mlflow.errors import NeuronMlflowWarning

if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec

    from neuron_mlflow.config import ProfilerConfig
    from neuron_mlflow.engine.attach import Attachment
    from neuron_mlflow.summary.ops import OpSummary

AUTOLOG_ENV = "NEURON_MLFLOW_AUTOLOG"
"""``1``: the ``sitecustomize`` of ``neuron-mlflow run`` applies autolog in this process."""

REPORTS_ENV = "NEURON_MLFLOW_RUN_REPORTS"
"""A folder where each autologged process of ``neuron-mlflow run`` that stepped an optimizer or
ran a Trainer leaves a file (``<pid>``) at exit: the verb says once, for the whole command,
when none did."""

STAGE = "train"
"""The loop's steps are training steps: metrics ``<metric_prefix>/train/...``, as the
Lightning and Hugging Face callbacks log theirs."""

NOTHING_PROFILED = (
    "no torch.optim optimizer stepped and no Lightning or Hugging Face Trainer ran, so "
    "autolog found no step and profiled nothing. autolog counts a loop's steps by "
    "optimizer.step(); for a loop without an optimizer (inference, evaluation, a "
    "hand-written update), mark its steps with nm.profile instead: decorate the step "
    "function with @nm.profile, or use `with nm.profile() as prof:` and call prof.step() "
    "after each step"
)
"""What the one warning says when autolog found nothing to profile."""


class _State:
    """Everything autolog holds in this process (one instance: :data:`_state`)."""

    def __init__(self) -> None:
        self.enabled = False
        self.explicit = False  # nm.autolog() was called (not only the environment)
        self.config: ProfilerConfig | None = None  # None: read from the environment on use
        self.finder: _PostImportFinder | None = None
        self.patches: list[tuple[Any, str, Any]] = []  # (owner, attribute, original)
        self.hook: Any = None  # the optimizer hook's handle
        self.owned = 0  # Trainer calls running: their callbacks own the steps
        self.loop: _Loop | None = None
        self.last_loop: _Loop | None = None
        # added by us, waited for at exit: held here, a Trainer kept in no variable may be gone
        self.callbacks: list[Any] = []
        self.optimizer_steps = 0  # every optimizer.step() outside a Trainer's training call
        self.clock_steps = 0
        self.trainers = 0  # Trainer training calls (fit, train) begun
        self.warned = False
        self.exit_hook = False


_state = _State()


def autolog(
    config: ProfilerConfig | None = None, *, disable: bool = False, **overrides: Any
) -> None:
    """Profile every training loop of this process from now on (see the module docstring).

    Args:
        config: base configuration; defaults to ``ProfilerConfig()`` (environment, YAML file).
        disable: ``True`` removes the optimizer hook and the Trainer patches; an open window
            is handed over (partial) and the process waits for its upload (bounded).
        **overrides: ``ProfilerConfig`` fields overriding ``config``.

    Raises:
        ConfigError: a bad configuration value (the message names it and what is allowed).
        BackendUnavailableError: the backend cannot run here.

    Calling it again applies the new configuration to the Trainers made and the loop steps
    taken from then on.
    """
    if disable:
        _disable()
        return
    from neuron_mlflow.capture.backends import resolve_backend
    from neuron_mlflow.config import ProfilerConfig

    base = config if config is not None else ProfilerConfig()
    effective = base.with_overrides(**overrides)
    resolve_backend(effective.backend, effective)  # fail now, not at the first step
    _end_loop(wait=False)  # a loop begun under the previous configuration
    if not _state.enabled:  # (again after a disable: counted afresh)
        _state.optimizer_steps = _state.clock_steps = _state.trainers = 0
        _state.warned = False
    _state.config = effective
    _state.explicit = True
    _enable()


def autolog_from_environment() -> None:
    """Autolog in this process, configured by the ``NEURON_MLFLOW_*`` variables (read when
    first needed): what ``neuron-mlflow run``'s ``sitecustomize`` calls. Imports nothing
    heavy until the program imports torch, Lightning or Transformers."""
    _state.config = None
    _enable()


def autolog_summary() -> OpSummary | None:
    """The last window's op summary of the loop profiled by the optimizer hook (waits,
    bounded, for the worker to summarise it), ``None`` before the first."""
    loop = _state.loop or _state.last_loop
    return loop.windows.summary if loop is not None else None


def autolog_run_id() -> str | None:
    """The MLflow run the optimizer hook's loop logs to (known after its first step)."""
    loop = _state.loop or _state.last_loop
    return loop.attach.run_id if loop is not None else None


# -- enabling and disabling -------------------------------------------------------------


def _enable() -> None:
    if not _state.exit_hook:
        atexit.register(_at_exit)
        _state.exit_hook = True
    if _state.enabled:
        return
    _state.enabled = True
    hooks: dict[str, Callable[[ModuleType], None]] = {
        "torch": _hook_torch,
        "lightning.pytorch": _patch_lightning,
        "transformers.trainer": _patch_transformers,
    }
    finder = _PostImportFinder(hooks)
    sys.meta_path.insert(0, finder)
    _state.finder = finder
    for name, hook in hooks.items():
        module = sys.modules.get(name)
        if module is not None:  # imported before autolog: patched now
            _run_hook(name, hook, module)


def _disable() -> None:
    """Remove the hook and the patches; hand the loop's window over; warn if nothing ran."""
    finder, _state.finder = _state.finder, None
    if finder is not None:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(finder)
    hook, _state.hook = _state.hook, None
    if hook is not None:
        with contextlib.suppress(Exception):
            hook.remove()
    for owner, name, original in reversed(_state.patches):
        with contextlib.suppress(Exception):
            setattr(owner, name, original)
    _state.patches.clear()
    was_enabled, _state.enabled = _state.enabled, False
    _end_loop(wait=True)
    if was_enabled:
        _warn_if_nothing_profiled()


def _run_hook(name: str, hook: Callable[[ModuleType], None], module: ModuleType) -> None:
    """Apply one framework's patch; a failure is a warning, never the user's error."""
    try:
        hook(module)
    except Exception as exc:
        _warn(
            f"neuron-mlflow autolog: could not attach to {name} ({type(exc).__name__}: "
            f"{exc}); it runs unprofiled"
        )


def _warn(message: str) -> None:
    with contextlib.suppress(Warning):  # `python -W error`: never an exception of ours
        warnings.warn(message, NeuronMlflowWarning, stacklevel=3)


def _config() -> ProfilerConfig:
    """The configuration: autolog's own, else read from the environment (once)."""
    if _state.config is None:
        from neuron_mlflow.config import ProfilerConfig

        _state.config = ProfilerConfig()
    return _state.config


# -- the post-import hook ------------------------------------------------------------------


class _PostImportFinder:
    """Runs a hook right after a watched module is imported (its code executed), whenever
    that happens; every other import goes by untouched (one dictionary look-up)."""

    def __init__(self, hooks: dict[str, Callable[[ModuleType], None]]) -> None:
        self.hooks = hooks
        self._finding: set[str] = set()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        hook = self.hooks.get(fullname)
        if hook is None or fullname in self._finding:
            return None
        self._finding.add(fullname)  # the other finders' answer, then our loader around it
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._finding.discard(fullname)
        if spec is None or not hasattr(spec.loader, "exec_module"):
            return spec
        hooked: Any = _HookedLoader(spec.loader, hook)  # (a Loader by its methods)
        spec.loader = hooked
        return spec


class _HookedLoader:
    """The module's own loader, then the hook; the module keeps its own loader."""

    def __init__(self, loader: Any, hook: Callable[[ModuleType], None]) -> None:
        self.loader = loader
        self.hook = hook

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        module: ModuleType | None = self.loader.create_module(spec)
        return module

    def exec_module(self, module: ModuleType) -> None:
        spec = module.__spec__
        if spec is not None:
            spec.loader = self.loader
        module.__loader__ = self.loader
        self.loader.exec_module(module)
        if _state.enabled:
            _run_hook(module.__name__, self.hook, module)


# -- Lightning and Transformers: a callback per Trainer -------------------------------------


def _patch(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
    original = owner.__dict__[name]
    setattr(owner, name, make(original))
    _state.patches.append((owner, name, original))


def _owning(original: Callable[..., Any]) -> Callable[..., Any]:
    """A Trainer's training call: its callback owns its optimizer steps meanwhile."""

    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        _state.owned += 1
        _state.trainers += 1  # (profiled by its callback: ours or the user's)
        try:
            return original(*args, **kwargs)
        finally:
            _state.owned -= 1

    return call


def _patch_lightning(module: ModuleType) -> None:
    trainer = module.Trainer

    def make_init(original: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(original)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            if _state.enabled:
                callbacks = _guarded(_lightning_callbacks, kwargs.get("callbacks"))
                if callbacks is not None:
                    kwargs["callbacks"] = callbacks
            original(self, *args, **kwargs)

        return __init__

    _patch(trainer, "__init__", make_init)
    _patch(trainer, "fit", _owning)
    logger = importlib.import_module("lightning.pytorch.loggers").MLFlowLogger
    _patch(logger, "__init__", _run_from_environment)


def _run_from_environment(original: Callable[..., None]) -> Callable[..., None]:
    """Lightning's ``MLFlowLogger`` ignores ``MLFLOW_RUN_ID`` (MLflow's own convention, which
    ``neuron-mlflow run`` sets): without a ``run_id`` of its own it logs into that run, so the
    loss curves and the windows share one run."""

    import inspect

    names = list(inspect.signature(original).parameters)
    positional = names.index("run_id") - 1 if "run_id" in names else 0  # (after self)

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        run_id = os.environ.get("MLFLOW_RUN_ID")
        if _state.enabled and run_id and kwargs.get("run_id") is None and len(args) < positional:
            kwargs["run_id"] = run_id
        original(self, *args, **kwargs)

    return __init__


def _lightning_callbacks(given: Any) -> list[Any] | None:
    """The Trainer's callbacks with ours added; ``None`` when it already has one."""
    from neuron_mlflow.integrations.lightning import NeuronProfilerCallback

    callbacks = [] if given is None else list(given) if isinstance(given, list | tuple) else [given]
    callback = _new_callback(NeuronProfilerCallback, callbacks)
    return None if callback is None else [*callbacks, callback]


def _patch_transformers(module: ModuleType) -> None:
    trainer = module.Trainer

    def make_init(original: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(original)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **kwargs)
            if _state.enabled:
                _guarded(_add_hf_callback, self)

        return __init__

    _patch(trainer, "__init__", make_init)
    _patch(trainer, "train", _owning)


def _add_hf_callback(trainer: Any) -> None:
    # by name: the Hugging Face front end is the only module importing transformers
    module = importlib.import_module("neuron_mlflow.integrations.transformers")
    callback = _new_callback(module.HfProfilerCallback, trainer.callback_handler.callbacks)
    if callback is not None:
        trainer.add_callback(callback)


def _new_callback(kind: type, present: list[Any]) -> Any:
    """A new ``kind`` callback (waited for at exit); ``None`` when ``present`` has one."""
    if any(isinstance(c, kind) for c in present):
        return None
    callback = kind(config=_config())
    _state.callbacks.append(callback)
    return callback


def _guarded(fn: Callable[..., Any], *args: Any) -> Any:
    """Our code inside a Trainer's ``__init__``."""
    try:
        return fn(*args)
    except Exception as exc:
        _failed(exc, "this Trainer")
        return None


def _failed(exc: Exception, what: str) -> None:
    """A failure of ours: raised in strict mode, else one warning (``what`` runs unprofiled)."""
    if _state.config is not None and _state.config.strict:
        raise exc
    _warn(f"neuron-mlflow autolog: {type(exc).__name__}: {exc}; {what} runs unprofiled")


# -- any other loop: the optimizer hook ------------------------------------------------------


def _hook_torch(module: ModuleType) -> None:
    if _state.hook is None:
        optimizer = importlib.import_module("torch.optim.optimizer")
        _state.hook = optimizer.register_optimizer_step_post_hook(_on_optimizer_step)


def _on_optimizer_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    """After every ``optimizer.step()`` of the process: the clock's ends one loop step."""
    state = _state
    if state.owned or not state.enabled:
        return
    state.optimizer_steps += 1
    decorator = sys.modules.get("neuron_mlflow.integrations.decorator")
    if decorator is not None and getattr(decorator, "_open_profilers", None):
        return  # an nm.profile of this process owns the steps
    loop = state.loop
    if loop is None:
        loop = state.loop = _new_loop()
        if loop is None:
            return
    loop.step(optimizer)


def _new_loop() -> _Loop | None:
    try:
        loop = _Loop(_config())
    except Exception as exc:  # loops cannot be profiled here (a bad configuration, say)
        hook, _state.hook = _state.hook, None
        if hook is not None:
            hook.remove()
        _failed(exc, "the training loop")
        return None
    # our exit hook runs before the engine's (atexit runs the last registered first)
    atexit.unregister(_at_exit)
    atexit.register(_at_exit)
    return loop


class _Loop:
    """The steps of a loop found by the optimizer hook, on an :class:`Attachment`: the first
    clock step begins step 0, each later one ends the open step and begins the next."""

    def __init__(self, config: ProfilerConfig) -> None:
        from neuron_mlflow.engine.attach import Attachment

        self.attach: Attachment = Attachment(config, stages=(STAGE,))
        self.windows = self.attach.windows[STAGE]
        self.clock: weakref.ref[Any] | None = None
        self.started = False

    def step(self, optimizer: Any) -> None:
        clock = self.clock() if self.clock is not None else None
        if clock is None:  # the first optimizer stepped (or the last clock is gone)
            self.clock = weakref.ref(optimizer)
        elif optimizer is not clock:
            return
        _state.clock_steps += 1
        windows = self.windows
        if not self.started:
            from neuron_mlflow.engine.options import torch_broadcast

            self.started = True
            self.attach.guard(self.attach.start, broadcast=torch_broadcast())
            self.attach.guard(self.attach.start_watch)
        else:
            windows.next_step += 1
            if not windows.end_quiet():
                self.attach.guard(windows.end, windows.next_step)
        if not windows.begin_quiet(windows.next_step):
            self.attach.guard(windows.begin, windows.next_step)


def _end_loop(wait: bool, exc: BaseException | None = None) -> None:
    loop, _state.loop = _state.loop, None
    if loop is not None:
        _state.last_loop = loop
        with contextlib.suppress(Exception):
            loop.attach.end(exc)  # (the window keeps its capture, incomplete)
            if wait:
                loop.attach.wait()


# -- the end of the process --------------------------------------------------------------------


def _at_exit() -> None:
    """Hand the loop's open window over and end its run (``FAILED`` after an uncaught
    exception), wait for the windows of the loop and of the callbacks autolog added (at most
    ``upload_timeout_s``), then say so once if nothing was profiled."""
    failed = getattr(sys, "last_value", None)
    _end_loop(True, failed if isinstance(failed, BaseException) else None)
    with contextlib.suppress(Exception):
        callbacks = list(_state.callbacks)
        if callbacks:
            deadline = time.monotonic() + _config().upload_timeout_s
            for callback in callbacks:
                with contextlib.suppress(Exception):
                    callback.wait(max(0.0, deadline - time.monotonic()))
    with contextlib.suppress(Exception):
        _warn_if_nothing_profiled()


def _warn_if_nothing_profiled() -> None:
    """Once: under ``neuron-mlflow run`` this process's report for the verb; else, after an
    ``nm.autolog()`` that found nothing, the warning (not in a multiprocessing child)."""
    if _state.warned:
        return
    _state.warned = True
    reports = os.environ.get(REPORTS_ENV)
    if reports:
        if _state.optimizer_steps or _state.trainers:
            with contextlib.suppress(OSError):
                Path(reports, str(os.getpid())).touch()
        return
    if not _state.explicit or _state.optimizer_steps or _state.trainers:
        return
    import multiprocessing

    if multiprocessing.parent_process() is not None:
        return
    _warn(f"neuron-mlflow autolog: {NOTHING_PROFILED}")
