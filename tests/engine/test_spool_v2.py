"""A spool written by the release before one record (``tests/data/spool_v2``: a
``schema_version`` 2 manifest summarised but not uploaded, and a window that ended with no
worker running, its ``draft.json`` staged and its end facts in a queued job) still syncs:
each window once, with its metrics, and nothing of the old protocol is left behind."""

from __future__ import annotations

import shutil
from pathlib import Path

from neuron_mlflow.engine.sync import sync_pending
from neuron_mlflow.sinks.spool import Spool
from tests.helpers import ROOT, artifact_files, metric_history

FIXTURE = ROOT / "tests" / "data" / "spool_v2"


def test_a_spool_of_the_previous_release_syncs_once(tmp_path: Path, tracking_uri: str) -> None:
    spool = tmp_path / "spool"
    shutil.copytree(FIXTURE, spool)
    report = sync_pending(str(spool), tracking_uri)
    assert report.failed == [] and report.busy == [], report
    assert len(report.uploaded) == 2
    records = sorted(Spool(spool).windows(), key=lambda r: r.window.session)
    assert [r.status for r in records] == ["done", "done"]
    assert [r.window.steps for r in records] == [2, 2]
    assert all(r.window.summarised for r in records)
    assert not list(spool.glob("*/.capture/*/*")), "nothing left staged"
    for record in records:
        run_id = str(record.window.run_id)
        assert [s for s, _ in metric_history(run_id, "profile/steps")] == [2], "once"
        files = artifact_files(run_id)
        assert "profile/step_000001-000002/summary.json" in files, files
        assert any(f.startswith("profile/step_000001-000002/traces/rank_0/") for f in files)
    again = sync_pending(str(spool), tracking_uri)
    assert again.uploaded == [] and again.failed == []
    for record in records:
        assert len(metric_history(str(record.window.run_id), "profile/steps")) == 1
