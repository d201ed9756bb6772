"""Reading a run's profile (what `compare` does) leaves no temporary folders behind."""

from __future__ import annotations

import json
import tempfile

from mlflow import MlflowClient

from neuron_mlflow.sinks.profiles import load_profile


def test_load_profile_removes_its_temporary_download(tmp_path, monkeypatch) -> None:
    client = MlflowClient()
    run_id = client.create_run("0").info.run_id
    client.log_metric(run_id, "profile/op_calls", 6.0)
    window = tmp_path / "step_000001-000002"
    window.mkdir()
    summary = {"summary": {"ops": [{"name": "aten::mul", "self_cpu_us": 3.0, "calls": 2}]}}
    (window / "summary.json").write_text(json.dumps(summary))
    client.log_artifacts(run_id, str(window), "profile/step_000001-000002")

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    for _ in range(3):
        profile = load_profile(client, run_id)
    assert profile.ops == {"aten::mul": {"self_cpu_us": 3.0, "calls": 2}}
    assert list(scratch.iterdir()) == [], "no temporary folder left behind"
