"""Bad input never ends in a traceback: a truncated ``.json.gz`` is exit 2 with a clear message."""

from __future__ import annotations

import gzip
import json
import random

import pytest

from neuron_mlflow.cli import main


@pytest.mark.parametrize("events", [100, 60_000], ids=["cut-in-the-first-chunk", "cut-later"])
def test_a_truncated_gzip_trace_is_exit_2_with_a_clear_message(tmp_path, capsys, events) -> None:
    rng = random.Random(0)
    trace = {
        "traceEvents": [
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": f"aten::mm_{rng.random()}",
                "pid": 1,
                "tid": 1,
                "ts": float(i),
                "dur": 1.0,
            }
            for i in range(events)
        ]
    }
    data = gzip.compress(json.dumps(trace).encode())
    path = tmp_path / "trace.json.gz"
    path.write_bytes(data[: int(len(data) * 0.8)])
    assert main(["summarize", str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "truncated" in err
    assert "Traceback" not in err and "EOFError:" not in err.split("(")[0]


def test_ingest_into_an_unknown_run_is_exit_2_and_creates_nothing(tmp_path, capsys) -> None:
    from mlflow import MlflowClient

    trace = tmp_path / "trace.json"
    trace.write_text(
        json.dumps(
            {"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1,
                              "tid": 1, "ts": 0.0, "dur": 5.0}]}
        )
    )  # fmt: skip
    client = MlflowClient()
    before = {e.experiment_id: len(client.search_runs([e.experiment_id]))
              for e in client.search_experiments()}  # fmt: skip
    spool = tmp_path / "spool"
    code = main(["ingest", str(trace), "--run-id", "0123456789abcdef", "--local-dir", str(spool)])
    assert code == 2
    err = capsys.readouterr().err
    assert "0123456789abcdef" in err and "was not found" in err
    after = {e.experiment_id: len(client.search_runs([e.experiment_id]))
             for e in client.search_experiments()}  # fmt: skip
    assert after == before, "no run was created"
    assert not list(spool.rglob("manifest.json")), "nothing was spooled for a later sync"
