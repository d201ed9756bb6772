"""Windows on demand: requests by CLI, run tag, file and signal; the slow-step trigger; bad
requests refused with the reason, never an exception in the job."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient

import neuron_mlflow as nm
from neuron_mlflow.config import SlowSteps
from neuron_mlflow.engine.capture_requests import BadRequest, parse_request
from neuron_mlflow.engine.slow_steps import SlowStepDetector
from neuron_mlflow.naming import CAPTURE_REQUEST_TAG, capture_status_tag
from tests.helpers import ROOT

POLL_S = 0.5
JOB = ROOT / "tests" / "engine" / "capture_job.py"
DONE_S = 600.0
"""How long a request's final answer may take: what ``neuron-mlflow capture --wait`` waits
(``--timeout``). ``done`` waits for the worker's summary and upload, and the worker runs in
the idle class: on a host that other processes keep busy it gets the CPU last (measured, 2
busy loops and other test runs on 2 cores: 95-145 s from ``accepted`` to ``done``)."""


# -- requests read and refused (no job) ---------------------------------------------------


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('{"steps": 3, "colour": "red"}', "unknown key(s) colour; allowed: id, steps"),
        ('{"steps": -1}', "steps=-1 is below 1"),
        ('{"steps": 0}', "steps=0 is below 1"),
        ('{"steps": 51}', "steps=51 is above max_request_steps=50"),
        ('{"warmup": -2}', "warmup=-2 is below 0"),
        ('{"steps": "3"}', "steps='3' is not a whole number"),
        ('{"steps": true}', "steps=True is not a whole number"),
        ('{"at_step": -5}', "at_step=-5 is below 0"),
        ('{"steps": 3', "malformed JSON"),
        ("[3]", "expected a JSON object"),
        ('{"id": "a b"}', "id='a b': expected 1-64 letters"),
    ],
)
def test_bad_request_is_refused_with_the_reason(text: str, reason: str) -> None:
    with pytest.raises(BadRequest) as caught:
        parse_request(text, "tag", max_steps=50)
    assert reason in str(caught.value)
    assert caught.value.request_id  # answered under an id all the same


def test_empty_request_takes_the_defaults() -> None:
    request = parse_request("  \n", "file", max_steps=50)
    assert (request.steps, request.warmup, request.at_step, request.source) == (
        None, None, None, "file",
    )  # fmt: skip
    assert request.id.startswith("file-")


def test_slow_steps_need_a_full_baseline_and_respect_cooldown_and_max() -> None:
    detector = SlowStepDetector(
        SlowSteps(factor=1.5, baseline_steps=20, min_steps=3, max_windows=2, cooldown_steps=10)
    )
    fired = [s for s in range(300) if detector.add(s, 0.05 if s < 10 else 0.01) is not None]
    assert fired == [], "slow first steps (compilation) before the baseline is full: no window"
    times = [0.01] * 100 + [0.02] * 8 + [0.01] * 20 + [0.03] * 200
    fired = [s for s, t in enumerate(times, 300) if detector.add(s, t) is not None]
    assert len(fired) == 2 and fired[0] - 400 <= 2  # the first within min_steps of the change
    assert fired[1] - fired[0] >= 10


def _statuses(spool: Path) -> list[str]:
    path = spool / "capture.status.rank.0"
    return path.read_text().splitlines() if path.exists() else []


def _wait_for(read, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while not (value := read()):
        assert time.monotonic() < deadline, "not in time"
        time.sleep(0.1)
    return value


def test_file_request_in_a_decorated_job_without_a_server(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()

    @nm.profile(schedule=nm.Schedule(skip_first=10**9), backend="cpu", local_dir=str(spool),
                poll_s=0.1, name="f")  # fmt: skip
    def f(x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.005)
        return x * 2

    for _ in range(5):
        f(torch.ones(4))
    (spool / "capture").write_text('{"steps": 2, "warmup": 0, "id": "by-file"}')
    (spool / "capture.tmp").write_text("{not json")
    deadline = time.monotonic() + 30
    while not any("by-file" in s for s in _statuses(spool)) and time.monotonic() < deadline:
        f(torch.ones(4))
    for _ in range(5):
        f(torch.ones(4))
    os.replace(spool / "capture.tmp", spool / "capture")  # a malformed file: refused
    _wait_for(lambda: any("refused: malformed JSON" in s for s in _statuses(spool)))
    f.profiler.close()
    statuses = _statuses(spool)
    assert statuses[0].startswith("accepted: steps ") and statuses[0].endswith("(request by-file)")
    assert any(s.startswith("refused: malformed JSON") for s in statuses)
    done = [s for s in statuses if s.startswith("done: ") and "by-file" in s]
    done = _wait_for(lambda: [s for s in _statuses(spool) if s.startswith("done: ")], 30)
    assert len(done) == 1 and done[0].endswith("(request by-file)"), _statuses(spool)
    records = f.profiler.session.records
    assert [r.manifest["reason"] for r in records] == ["request by-file"]


def test_signal_asks_for_a_window_and_the_handler_only_sets_a_flag(tmp_path: Path) -> None:
    with nm.profile(schedule=nm.Schedule(skip_first=10**9), backend="cpu",
                    local_dir=str(tmp_path / "spool"), poll_s=0.1) as prof:  # fmt: skip
        assert signal.getsignal(signal.SIGUSR2) is not signal.SIG_DFL
        for i in range(12):
            if i == 3:
                os.kill(os.getpid(), signal.SIGUSR2)
            _ = torch.ones(8) * 2
            prof.step()
    records = prof.session.records
    assert [r.manifest["reason"] for r in records] == ["request sigusr2-1"]
    assert signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL  # put back at close


def test_a_job_with_its_own_handler_keeps_it(tmp_path: Path) -> None:
    mine = lambda signum, frame: None  # noqa: E731
    previous = signal.signal(signal.SIGUSR2, mine)
    try:
        with nm.profile(schedule=nm.Schedule(skip_first=10**9), backend="cpu",
                        local_dir=str(tmp_path / "spool"), poll_s=0) as prof:  # fmt: skip
            assert signal.getsignal(signal.SIGUSR2) is mine
            prof.step()
    finally:
        signal.signal(signal.SIGUSR2, previous)


# -- a Lightning job and a real mlflow server ----------------------------------------------


class Job:
    def __init__(self, uri: str, tmp_path: Path, mode: str, experiment: str) -> None:
        self.uri, self.work, self.mode = uri, tmp_path, mode
        env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
        env["MLFLOW_TRACKING_URI"] = uri
        env["NEURON_MLFLOW_WORKER_IDLE_S"] = "5"
        env["PYTHONPATH"] = str(ROOT)
        self.env = env
        self.log = (tmp_path / "job.log").open("w")
        self.proc = subprocess.Popen(
            [sys.executable, str(JOB), uri, experiment, str(tmp_path), mode, str(POLL_S)],
            cwd=tmp_path, env=env, stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.run_id = _wait_for(self._run_id, 180)
        self.client = MlflowClient(uri)

    def _run_id(self) -> str | None:
        assert self.proc.poll() is None, (self.work / "job.log").read_text()[-3000:]
        path = self.work / "run_id"
        return path.read_text() if path.exists() else None

    def tags(self) -> dict[str, str]:
        return self.client.get_run(self.run_id).data.tags

    def windows(self) -> dict[str, str]:
        """Window artifact path -> its reason (tag neuron_mlflow.reason/<path>)."""
        prefix = "neuron_mlflow.reason/"
        return {k[len(prefix) :]: v for k, v in self.tags().items() if k.startswith(prefix)}

    def capture(self, *args: str) -> tuple[int, str, float]:
        started = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-m", "neuron_mlflow.cli", "capture", self.run_id, *args],
            env=self.env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        return result.returncode, result.stdout + result.stderr, time.monotonic() - started

    def answer(
        self, request_id: str, rank: int = 0, final: bool = True, timeout_s: float = DONE_S
    ) -> str:
        def read() -> str | None:
            status = self.tags().get(capture_status_tag(rank), "")
            if status.endswith(f"(request {request_id})") and (
                not final or not status.startswith(("accepted", "waiting"))
            ):
                return status
            return None

        return _wait_for(read, timeout_s)

    def stop(self, now: bool = True) -> str:
        if now:
            (self.work / "stop").write_text("")
        self.proc.wait(timeout=300)
        self.log.close()
        out = (self.work / "job.log").read_text()
        assert self.proc.returncode == 0, out[-3000:]
        return out


def _one_new_window(job: Job, before: dict[str, str], request_id: str) -> str:
    after = _wait_for(lambda: {k: v for k, v in job.windows().items() if k not in before}, 60)
    assert len(after) == 1, after
    ((path, reason),) = after.items()
    assert reason == f"request {request_id}"
    return path


@pytest.mark.slow
def test_requests_by_cli_tag_file_and_signal_and_bad_ones(mlflow_server: str, tmp_path) -> None:
    job = Job(mlflow_server, tmp_path, "requests", "on-demand")
    try:
        _wait_for(lambda: "neuron_mlflow.capture.heartbeat.rank.0" in job.tags(), 60)
        # the CLI, waiting for the window
        before = job.windows()
        code, out, seconds = job.capture("--steps", "3", "--wait", "--timeout", "120")
        assert code == 0, out
        request_id = out.split()[1].rstrip(":")
        path = _one_new_window(job, before, request_id)
        first, last = (int(s) for s in path.rsplit("step_", 1)[1].split("-"))
        assert last - first + 1 == 3
        assert f"window {path} (3 steps) in run {job.run_id}" in out
        assert seconds < 3 * POLL_S + 60, (seconds, out)  # 3 poll_s plus the window
        metrics = job.client.get_run(job.run_id).data.metrics
        assert metrics["profile/train/steps"] == 3.0
        # the tag, set by hand (MLflow UI or client)
        before = job.windows()
        job.client.set_tag(job.run_id, CAPTURE_REQUEST_TAG, '{"steps": 2, "id": "by-hand"}')
        assert job.answer("by-hand").startswith(f"done: runs:/{job.run_id}/profile/train/")
        _one_new_window(job, before, "by-hand")
        # the file
        before = job.windows()
        (tmp_path / "spool" / "capture").write_text('{"id": "by-file"}')
        assert job.answer("by-file").startswith("done: ")
        _one_new_window(job, before, "by-file")
        # the signal
        before = job.windows()
        os.kill(job.proc.pid, signal.SIGUSR2)
        assert job.answer("sigusr2-1").startswith("done: ")
        _one_new_window(job, before, "sigusr2-1")
        # bad requests: each refused with the reason, the job goes on
        bad = {
            '{"steps": 3, "colour": "red", "id": "b1"}': "unknown key(s) colour",
            '{"steps": -1, "id": "b2"}': "steps=-1 is below 1",
            '{"steps": 5000, "id": "b3"}': "steps=5000 is above max_request_steps=50",
            '{"at_step": 1, "id": "b4"}': "step 1 is past",
        }
        for value, reason in bad.items():
            request_id = json.loads(value)["id"]
            job.client.set_tag(job.run_id, CAPTURE_REQUEST_TAG, value)
            status = job.answer(request_id)
            assert status.startswith("refused: ") and reason in status, status
        job.client.set_tag(job.run_id, CAPTURE_REQUEST_TAG, '{"steps": 3')
        status = _wait_for(lambda: "malformed JSON" in job.tags()[capture_status_tag(0)], 60)
        (tmp_path / "spool" / "capture").write_text("{oops")
        _wait_for(
            lambda: "malformed JSON" in (tmp_path / "spool" / "capture.status.rank.0").read_text()
        )
        code, out, _ = job.capture("--steps", "500", "--wait", "--timeout", "60")
        assert code == 3 and "refused: steps=500 is above max_request_steps=50" in out, out
        code, out, _ = job.capture("--at-step", "2", "--wait", "--timeout", "60")
        assert code == 3 and "is past" in out, out
        assert len(job.windows()) == 4
    finally:
        job.stop()


@pytest.mark.slow
def test_slow_steps_take_one_window_near_the_slowdown(mlflow_server: str, tmp_path) -> None:
    job = Job(mlflow_server, tmp_path, "slow", "on-demand-slow")
    out = job.stop(now=False)  # 200 steps
    client = MlflowClient(mlflow_server)
    windows = {k: v for k, v in job.windows().items()}
    triggered = {k: v for k, v in windows.items() if v.startswith("slow steps: ")}
    assert len(triggered) == 1, (windows, out[-2000:])
    ((path, reason),) = triggered.items()
    first = int(path.rsplit("step_", 1)[1].split("-")[0])
    start = first - 1  # the schedule's warmup (1) before the recorded steps
    assert 60 <= start <= 60 + 3 + 1, (path, reason)  # within min_steps + 1 of the slowdown
    assert reason.endswith("x median") and float(reason.split()[2].rstrip("x")) >= 1.5
    history = client.get_metric_history(job.run_id, "system/step_time_s")
    assert history and max(m.value for m in history) > 0.05  # the slowdown, in the same run


@pytest.mark.slow
def test_ddp_ranks_take_the_same_steps(mlflow_server: str, tmp_path) -> None:
    job = Job(mlflow_server, tmp_path, "ddp", "on-demand-ddp")
    try:
        _wait_for(
            lambda: {"neuron_mlflow.capture.heartbeat.rank.0",
                     "neuron_mlflow.capture.heartbeat.rank.1"} <= set(job.tags()),
            60,
        )  # fmt: skip
        code, out, _ = job.capture("--steps", "3", "--wait", "--timeout", "180")
        assert code == 0, out
        request_id = out.split()[1].rstrip(":")
        paths = {job.answer(request_id, rank) for rank in (0, 1)}
        assert len(paths) == 1, paths  # both ranks: the same window, the same global steps
        path = next(iter(paths)).split(f"runs:/{job.run_id}/", 1)[1].split(" ")[0]
        files = [f.path for f in job.client.list_artifacts(job.run_id, f"{path}/traces")]
        assert {f"{path}/traces/rank_0", f"{path}/traces/rank_1"} <= set(files), files
    finally:
        job.stop()


@pytest.mark.slow
def test_requests_resume_when_the_server_is_back(mlflow_server: str, tmp_path) -> None:
    from tests.engine.proxy import Proxy

    proxy = Proxy(int(mlflow_server.rsplit(":", 1)[1]))
    job = Job(proxy.uri, tmp_path, "requests", "on-demand-down")
    job.client = MlflowClient(mlflow_server)  # the test talks to the server directly
    client = job.client
    try:
        _wait_for(lambda: "neuron_mlflow.capture.heartbeat.rank.0" in job.tags(), 60)
        proxy.hang = True  # the server stops answering the job
        client.set_tag(job.run_id, CAPTURE_REQUEST_TAG, '{"steps": 2, "id": "while-down"}')
        time.sleep(5 * POLL_S)
        assert job.proc.poll() is None  # the job goes on
        beat = json.loads(job.tags()["neuron_mlflow.capture.heartbeat.rank.0"])
        proxy.resume()
        status = job.answer("while-down", final=False, timeout_s=120)  # the job's own thread
        assert status.startswith(("accepted: ", "done: ")), status  # read once it is back
        assert job.answer("while-down").startswith("done: ")
        later = json.loads(job.tags()["neuron_mlflow.capture.heartbeat.rank.0"])
        assert later["step"] > beat["step"]
    finally:
        job.stop()


def test_a_rank_that_does_not_capture_refuses_and_says_why(tmp_path: Path) -> None:
    from neuron_mlflow.engine.capture_requests import start_for_stage
    from neuron_mlflow.engine.stages import StageWindows

    spool = tmp_path / "spool"
    spool.mkdir()
    config = nm.ProfilerConfig(
        backend="cpu", local_dir=str(spool), poll_s=0.05, capture_signal=None,
        schedule=nm.Schedule(skip_first=10**9),
    )  # fmt: skip
    windows = StageWindows(config, "profile/train", lambda: None)  # this rank: no session
    windows.watch = start_for_stage(windows, rank=0, world_size=2, run_id=None, tracking_uri=None)
    (spool / "capture").write_text('{"id": "off-here"}')
    step = 0
    deadline = time.monotonic() + 30
    while not any("off-here" in s for s in _statuses(spool)) and time.monotonic() < deadline:
        windows.begin(step)
        windows.end(step + 1)
        step += 1
        time.sleep(0.005)
    windows.watch.close()
    assert _statuses(spool) == [
        "refused: this rank does not capture (ranks, stages or off) (request off-here)"
    ]
