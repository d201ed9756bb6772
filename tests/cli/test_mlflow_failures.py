"""A tracking server that starts failing midway: `compare` says so (one line, exit 1) instead
of deciding from the part of the runs it could read, and `capture` asks again for heartbeats.

A real ``mlflow server`` behind an HTTP proxy that answers the first calls of one kind and
then fails them (HTTP 500, or a connection closed without an answer)."""

from __future__ import annotations

import http.client
import itertools
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import pytest
from mlflow import MlflowClient

from neuron_mlflow.cli import main
from neuron_mlflow.naming import CAPTURE_REQUEST_TAG
from tests.cli.test_rough_edges import _one_line_failure

ARTIFACT = "/api/2.0/mlflow-artifacts/artifacts"
FAILING = {  # what fails: a path test on the calls
    "artifact downloads": lambda path: path.startswith(f"{ARTIFACT}/"),
    "artifact listings": lambda path: path.startswith(f"{ARTIFACT}?"),
    "metric history": lambda path: path.startswith("/api/2.0/mlflow/metrics/get-history"),
    "run reads": lambda path: path.startswith("/api/2.0/mlflow/runs/get?"),
}


class _Forward(BaseHTTPRequestHandler):
    """Forward each call to the server; the failing kind, past its first ``allow`` calls,
    gets a 500 (``how="500"``) or a closed connection (``how="reset"``)."""

    server: _FailingProxy

    def _forward(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        proxy = self.server
        if proxy.fails(self.path) and next(proxy.seen) >= proxy.allow:
            if proxy.how == "reset":
                self.close_connection = True  # no answer at all
                return
            self._answer(500, json.dumps({"error_code": "INTERNAL_ERROR", "message": "boom"}))
            return
        upstream = http.client.HTTPConnection(proxy.upstream, timeout=30)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
        upstream.request(self.command, self.path, body, headers)
        response = upstream.getresponse()
        self._answer(response.status, response.read(), response.getheader("Content-Type"))
        upstream.close()

    def _answer(self, status: int, body: str | bytes, kind: str | None = None) -> None:
        data = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        self.send_header("Content-Type", kind or "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

    def log_message(self, *args: object) -> None:
        pass


class _FailingProxy(ThreadingHTTPServer):
    def __init__(self, upstream: str, failing: str, allow: int, how: str) -> None:
        super().__init__(("127.0.0.1", 0), _Forward)
        self.upstream = urlsplit(upstream).netloc
        self.fails = FAILING[failing] if failing else (lambda path: False)
        self.allow, self.how, self.seen = allow, how, itertools.count()


@contextmanager
def failing_proxy(
    upstream: str, failing: str = "", allow: int = 0, how: str = "500"
) -> Iterator[str]:
    """The URI of a proxy to ``upstream`` whose ``failing`` calls fail after ``allow`` of them."""
    proxy = _FailingProxy(upstream, failing, allow, how)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{proxy.server_port}"
    finally:
        proxy.shutdown()
        proxy.server_close()


def _profiled_run(client: MlflowClient, cpu_us: float, windows: int) -> str:
    """A run with ``windows`` windows of 4 steps each (steps.jsonl and summary.json), or with
    3 logged windows in its metric history only (``windows=0``)."""
    run_id = client.create_run("0").info.run_id
    client.log_metric(run_id, "profile/op_calls", 2.0)
    for step in range(max(windows, 3)):
        client.log_metric(run_id, "profile/cpu_time_us", cpu_us + 0.1 * step, step=step)
    for number in range(windows):
        window = f"profile/step_{10 * number:06d}-{10 * number + 3:06d}"
        rows = [{"step": s, "cpu_time_us": cpu_us + 0.1 * (s % 3)} for s in range(4)]
        client.log_text(
            run_id, "".join(json.dumps(r) + "\n" for r in rows), f"{window}/steps.jsonl"
        )
        summary = {"summary": {"cpu_time_us": cpu_us, "ops": []}}
        client.log_text(run_id, json.dumps(summary), f"{window}/summary.json")
    return run_id


@pytest.mark.parametrize(
    ("failing", "allow", "how"),
    [
        ("artifact downloads", 3, "500"),
        ("artifact downloads", 3, "reset"),
        ("artifact listings", 2, "500"),
        ("metric history", 1, "500"),
    ],
)
def test_compare_fails_when_the_server_fails_midway(
    failing, allow, how, mlflow_server, monkeypatch, capsys
) -> None:
    client = MlflowClient(mlflow_server)
    windows = 0 if failing == "metric history" else 3
    a, b = (_profiled_run(client, cpu, windows) for cpu in (10.0, 15.0))
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # the test's time, not the point
    with failing_proxy(mlflow_server) as uri:  # the proxy itself is sound
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        assert main(["compare", a, b]) == 0
        assert "compared: " in capsys.readouterr().err
    with failing_proxy(mlflow_server, failing, allow, how) as uri:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        err = _one_line_failure(capsys, ["compare", a, b])
    assert err.startswith(f"neuron-mlflow compare: MLflow failed at {uri}: "), err


def test_capture_asks_again_for_heartbeats_when_the_server_hiccups(
    mlflow_server, monkeypatch, capsys
) -> None:
    client = MlflowClient(mlflow_server)
    run_id = client.create_run("0").info.run_id
    beat = {"step": 5, "poll_s": 1.0, "time": time.time()}  # a first beat: no step rate yet
    client.set_tag(run_id, "neuron_mlflow.capture.heartbeat.rank.0", json.dumps(beat))
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    with failing_proxy(mlflow_server, "run reads", allow=1) as uri:  # the first read answers
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        assert main(["capture", run_id]) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and "trying again" in captured.err, captured.err
    assert f"-> run {run_id} (from step " in captured.out, captured.out
    request = json.loads(client.get_run(run_id).data.tags[CAPTURE_REQUEST_TAG])
    assert request["at_step"] >= 5
