"""Never hurt the training job: our failures are one report, the job finishes with its result."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import neuron_mlflow as nm
from tests.helpers import ROOT, inject_worker_failure, inputs, rmsnorm_naive

FINISH = "neuron_mlflow.engine.pipeline:summarise_window"  # the summary, in the worker process

SCHEDULE = nm.Schedule(warmup=1, active=2, repeat=3)  # 3 windows in 9 steps


def _loop(profiled, steps: int = 9) -> list[torch.Tensor]:
    x, w = inputs()
    return [profiled(x, w) for _ in range(steps)]


def _ours(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, nm.NeuronMlflowWarning)]


def _unwritable(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("a file where local_dir's parent folder should be")
    return blocker / "spool"


def test_an_unwritable_local_dir_turns_profiling_off_with_one_report(tmp_path, caplog):
    profiled = nm.profile(
        backend="cpu", strict=False, schedule=SCHEDULE, local_dir=_unwritable(tmp_path)
    )(rmsnorm_naive)
    x, w = inputs()
    with (
        caplog.at_level(logging.WARNING, logger="neuron_mlflow"),
        warnings.catch_warnings(record=True) as caught,
    ):
        warnings.simplefilter("always")
        results = _loop(profiled)
        profiled.profiler.close()
    assert all(torch.equal(r, rmsnorm_naive(x, w)) for r in results), "the job's own results"
    (message,) = _ours(caught)
    assert "a-file" in message and "profiling is off" in message
    records = [r for r in caplog.records if r.name == "neuron_mlflow"]
    assert [r.getMessage() for r in records] == [message], "one log record, the same report"
    assert profiled.profiler.session.disabled


def test_an_unwritable_local_dir_raises_in_strict_mode(tmp_path) -> None:
    profiled = nm.profile(
        backend="cpu", strict=True, schedule=SCHEDULE, local_dir=_unwritable(tmp_path)
    )(rmsnorm_naive)
    with pytest.raises(OSError, match="a-file"):
        _loop(profiled)


def test_python_dash_w_error_never_turns_our_warning_into_an_exception(tmp_path) -> None:
    script = tmp_path / "job.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import json
            import torch
            import neuron_mlflow as nm

            @nm.profile(backend="cpu", strict=False, local_dir={str(_unwritable(tmp_path))!r},
                        schedule=nm.Schedule(warmup=0, active=2))
            def step(i):
                return torch.ones(2) * i

            print("RESULT=" + json.dumps([float(step(i).sum()) for i in range(4)]))
            """
        )
    )
    env = {
        "PYTHONPATH": str(ROOT),
        "PATH": "/usr/bin:/bin",
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db",
    }
    result = subprocess.run(
        [sys.executable, "-W", "error", str(script)],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(x for x in result.stdout.splitlines() if x.startswith("RESULT="))
    assert json.loads(line.split("=", 1)[1]) == pytest.approx([0.0, 2.0, 4.0, 6.0])
    assert "profiling is off" in result.stderr, "the log record is the report"


def test_a_failure_in_the_summary_code_leaves_the_job_and_its_windows(
    tmp_path, monkeypatch
) -> None:
    inject_worker_failure(monkeypatch, tmp_path, FINISH, "injected failure in the summary code")
    profiled = nm.profile(
        backend="cpu", strict=False, schedule=SCHEDULE, local_dir=tmp_path / "spool"
    )(rmsnorm_naive)
    x, w = inputs()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = _loop(profiled)
        profiled.profiler.close()
        profiled.profiler.wait()  # the worker's failure is reported when its results are read
    assert torch.equal(results[-1], rmsnorm_naive(x, w))
    messages = _ours(caught)
    assert messages and all("injected failure" in m for m in messages)
    kept = list((tmp_path / "spool").rglob("traces/rank_0"))
    assert kept, "the raw captures stay in the spool"


def test_a_failure_in_the_summary_code_raises_in_strict_mode(tmp_path, monkeypatch) -> None:
    inject_worker_failure(monkeypatch, tmp_path, FINISH, "injected failure in the summary code")
    profiled = nm.profile(
        backend="cpu", strict=True, schedule=SCHEDULE, local_dir=tmp_path / "spool"
    )(rmsnorm_naive)
    # the worker process's failure is raised here, when the session reads its results
    with pytest.raises(nm.NeuronMlflowError, match="injected failure"):
        _loop(profiled)
        profiled.profiler.close()
        profiled.profiler.wait()


def test_the_users_exception_propagates_unchanged(tmp_path) -> None:
    class UserError(Exception):
        pass

    @nm.profile(backend="cpu", strict=False, schedule=SCHEDULE, local_dir=_unwritable(tmp_path))
    def step(i: int) -> int:
        if i == 2:
            raise UserError("bad batch")
        return i

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert [step(i) for i in range(2)] == [0, 1]
        with pytest.raises(UserError, match="bad batch"):
            step(2)
        assert step(3) == 3
