"""``neuron-mlflow capture`` against a job whose steps are quiet (no scheduled window): a start
step already past is refused with the job's true next step (not the end of the session's
last window), a future one is taken; ``--wait`` that times out says what each rank last said;
a run that is not running (ended, or its heartbeat long stale) is one line and exit 2."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient

from neuron_mlflow.cli.app import main
from neuron_mlflow.naming import CAPTURE_REQUEST_TAG, heartbeat_tag
from tests.engine.test_capture_requests import _wait_for

BIN = Path(sys.executable).parent
DONE_S = 600  # accepted -> done waits for the worker's summary and upload (idle class)

LOOP = """\
import pathlib, time
import torch

model = torch.nn.Linear(64, 8)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
deadline = time.monotonic() + 900
while not pathlib.Path("stop").exists() and time.monotonic() < deadline:
    optimizer.zero_grad()
    model(torch.randn(4, 64)).pow(2).mean().backward()
    optimizer.step()
    time.sleep(0.02)
print("stopped")
"""


def _capture(env: dict[str, str], run_id: str, *args: str) -> tuple[int, str, str]:
    done = subprocess.run(
        [str(BIN / "neuron-mlflow"), "capture", run_id, *args],
        capture_output=True, text=True, env=env, timeout=DONE_S + 120, check=False,
    )  # fmt: skip
    return done.returncode, done.stdout, done.stderr


@pytest.mark.slow
def test_past_steps_are_refused_with_the_true_next_step(tracking_uri, tmp_path) -> None:
    (tmp_path / "loop.py").write_text(LOOP)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "NEURON_MLFLOW"))}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.update(MLFLOW_TRACKING_URI=tracking_uri, NEURON_MLFLOW_POLL_S="0.2",
               NEURON_MLFLOW_WORKER_IDLE_S="5")  # fmt: skip
    client = MlflowClient(tracking_uri)
    client.search_experiments()  # the store's tables exist before the job opens it
    proc = subprocess.Popen(
        [str(BIN / "neuron-mlflow"), "run", "--backend", "cpu", "--schedule.skip-first",
         "1000000000", "--local-dir", str(tmp_path / "spool"), "--", "python", "loop.py"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip

    def step() -> int:
        assert proc.poll() is None, "the job ended"
        beat = client.get_run(run_id).data.tags.get(heartbeat_tag(0))
        return json.loads(beat)["step"] if beat else 0

    try:
        assert proc.stderr is not None
        lines = iter(proc.stderr.readline, "")
        seen: list[str] = []
        line = next((x for x in lines if seen.append(x) or "neuron-mlflow capture " in x), "")
        assert line, "".join(seen)[-3000:]
        run_id = line.split("neuron-mlflow capture ")[1].strip(" )\n")
        # no window yet: the session the request opens must not start counting at 0
        _wait_for(lambda: step() >= 40, 300)
        code, out, err = _capture(env, run_id, "--at-step", "10", "--wait", "--timeout", "300")
        assert code == 3, out + err
        found = re.search(r"refused: step 10 is past \(the next step is (\d+)\)", out)
        assert found and int(found.group(1)) >= 40, out
        # a future step is taken and its window logged (the CLI may take seconds to start)
        start = step() + 1500
        code, out, err = _capture(env, run_id, "--steps", "2", "--warmup", "0", "--at-step",
                                  str(start), "--wait", "--timeout", str(DONE_S))  # fmt: skip
        assert code == 0, out + err
        assert f"accepted: steps {start}-{start + 1}" in out and "rank 0: done: " in out, out
        # after the window, a step between its end and the job's step is past
        _wait_for(lambda: step() >= start + 60, 300)
        past = start + 20
        code, out, err = _capture(env, run_id, "--at-step", str(past), "--wait",
                                  "--timeout", "300")  # fmt: skip
        assert code == 3, out + err
        found = re.search(rf"refused: step {past} is past \(the next step is (\d+)\)", out)
        assert found and int(found.group(1)) >= start + 60, out
        # accepted, never done within --timeout: exit 4, and what rank 0 last said
        far = step() + 10**6
        code, out, err = _capture(env, run_id, "--at-step", str(far), "--wait",
                                  "--timeout", "60")  # fmt: skip
        assert code == 4, out + err
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert "no final answer within 60 s (rank 0 said 'accepted: steps " in err, err
    finally:
        (tmp_path / "stop").write_text("")
        out, err = proc.communicate(timeout=DONE_S)
    assert proc.returncode == 0, err[-3000:]
    # the job has ended: its run cannot take a request (at once, with --wait too)
    started = time.monotonic()
    code, out, err = _capture(env, run_id, "--wait")
    assert code == 2 and out == "", out + err
    assert err.startswith(f"neuron-mlflow capture: run {run_id} is not running (status "), err
    assert time.monotonic() - started < 120


@pytest.mark.parametrize("wait", [[], ["--wait", "--timeout", "600"]])
def test_a_run_that_is_not_running_is_one_line_and_exit_2(capsys, wait) -> None:
    client = MlflowClient()
    ended = client.create_run("0").info.run_id
    client.set_terminated(ended)  # FINISHED, never a heartbeat
    killed = client.create_run("0").info.run_id
    beat = {"step": 50, "steps_per_s": 2.0, "poll_s": 1.0, "time": time.time() - 30}
    client.set_tag(killed, heartbeat_tag(0), json.dumps(beat))
    client.set_terminated(killed, "KILLED")
    stale = client.create_run("0").info.run_id  # RUNNING, but its job is gone (SIGKILL)
    beat = {"step": 50, "steps_per_s": 2.0, "poll_s": 1.0, "time": time.time() - 3600}
    client.set_tag(stale, heartbeat_tag(0), json.dumps(beat))
    expected = {
        ended: "status FINISHED, no heartbeat",
        killed: "status KILLED, last heartbeat 3",  # 30 s and more (a busy machine)
        stale: "status RUNNING, last heartbeat 36",  # 3600 s and more
    }
    for run_id, why in expected.items():
        capsys.readouterr()  # (MLflow's own lines, creating the store)
        started = time.monotonic()
        assert main(["capture", run_id, *wait]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.count("\n") == 1, captured
        assert captured.err.startswith(
            f"neuron-mlflow capture: run {run_id} is not running ({why}"
        ), captured.err
        assert captured.err.endswith(": it cannot take a request\n"), captured.err
        assert time.monotonic() - started < 120
        assert CAPTURE_REQUEST_TAG not in client.get_run(run_id).data.tags
