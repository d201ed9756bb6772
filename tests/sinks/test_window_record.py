"""The window record: every transition written to disk and read back through ``Window``; a
manifest that does not validate is a clear error naming the file (nothing deleted); a
manifest of the previous release still reads, and still syncs."""

from __future__ import annotations

import calendar
import json

import msgspec
import pytest

from neuron_mlflow.engine.sync import sync_pending
from neuron_mlflow.sinks.spool import Spool, WindowRecord
from neuron_mlflow.sinks.window_record import SCHEMA_VERSION, Window, WindowState
from tests.helpers import metric_history


def _spooled(tmp_path) -> WindowRecord:
    spool = Spool(tmp_path / "spool")
    return spool.create_window(
        spool.new_session_dir(), "profile/step_000001-000002", summarised=False,
        prefix="profile", window={"index": 0, "first": 1, "last": 2},
    )  # fmt: skip


def _on_disk(record: WindowRecord) -> dict:
    return json.loads((record.path / "manifest.json").read_text())


def test_every_transition_is_written_and_read_back(tmp_path) -> None:
    record = _spooled(tmp_path)
    assert _on_disk(record)["state"] == "spooled"
    assert _on_disk(record)["schema_version"] == SCHEMA_VERSION
    record.failed("summary broke")
    again = WindowRecord.load(record.path)
    assert again.window.state is WindowState.FAILED and again.status == "pending"
    assert (again.window.error, again.window.failed_step) == ("summary broke", "summary")
    record.summarised({"profile/steps": 2.0})
    again = WindowRecord.load(record.path)
    assert again.window.state is WindowState.SUMMARISED and again.window.error is None
    assert again.window.metrics == {"profile/steps": 2.0}
    record.upload_failed("server down")
    again = WindowRecord.load(record.path)
    assert again.window.state is WindowState.SUMMARISED, "still pending for sync"
    assert again.window.failed_step == "upload"
    record.mark_uploaded("metrics")
    assert WindowRecord.load(record.path).window.uploaded.metrics is True
    record.uploaded()
    again = WindowRecord.load(record.path)
    assert again.window.state is WindowState.UPLOADED and again.status == "done"
    record.handled()
    assert WindowRecord.load(record.path).window.handled is True


def test_an_incomplete_window_stays_incomplete_when_summarised(tmp_path) -> None:
    spool = Spool(tmp_path / "spool")
    record = spool.create_window(
        spool.new_session_dir(), "profile/step_000001-000002", status="incomplete",
        summarised=False,
    )  # fmt: skip
    record.summarised({"profile/steps": 1.0}, incomplete=True)
    again = WindowRecord.load(record.path)
    assert again.window.state is WindowState.INCOMPLETE and again.window.summarised


def test_a_manifest_that_does_not_validate_names_its_file_and_is_kept(tmp_path, capsys) -> None:
    record = _spooled(tmp_path)
    manifest = record.path / "manifest.json"
    manifest.write_text(json.dumps({**_on_disk(record), "metric_step": "soon"}))
    with pytest.raises(ValueError, match=r"manifest\.json is not valid .*metric_step"):
        WindowRecord.load(record.path)
    report = sync_pending(str(tmp_path / "spool"))
    ((where, reason),) = report.failed
    assert where == str(record.path) and str(manifest) in reason
    assert manifest.is_file() and (record.path / "artifacts").is_dir(), "nothing deleted"
    with pytest.raises(AttributeError, match="no field 'colour'"):
        record.update(colour="blue")


def test_a_manifest_of_the_previous_release_still_syncs(tmp_path, tracking_uri) -> None:
    spool = Spool(tmp_path / "spool")
    folder = spool.new_session_dir() / "profile" / "step_000001-000002"
    (folder / "artifacts").mkdir(parents=True)
    (folder / "artifacts" / "summary.md").write_text("# a window of the first release\n")
    (folder / "manifest.json").write_text(json.dumps({
        "format": 1, "status": "pending", "created": "2026-11-30T10:00:00Z",
        "artifact_path": "profile/step_000001-000002", "session": folder.parent.parent.name,
        "run_id": None, "uploaded": dict.fromkeys(("tags", "params", "metrics", "artifacts"),
        False), "error": None, "metrics": {"profile/steps": 2.0}, "params": {}, "tags": {},
        "metric_step": 2, "window": {"index": 0, "first": 1, "last": 2, "partial": False},
    }))  # fmt: skip
    (record,) = list(spool.windows())
    assert record.window.state is WindowState.SUMMARISED  # no "summarised" key: summarised
    stamp = calendar.timegm((2026, 11, 30, 10, 0, 0)) * 1000
    assert record.window.captured_ms == stamp, "from its created stamp"
    report = sync_pending(str(tmp_path / "spool"))
    ((_, run_id),) = report.uploaded
    assert metric_history(run_id, "profile/steps") == [(2, 2.0)]
    assert _on_disk(record)["state"] == "uploaded", "written back in the current format"


def test_a_window_is_placed_once(tmp_path) -> None:
    spool = Spool(tmp_path)
    session = spool.new_session_dir()
    staged = Spool.capture_dir(session, 0, "p")
    (staged / "artifacts" / "traces").mkdir(parents=True)
    window = msgspec.convert(
        {"state": "spooled", "artifact_path": "p/step_000001-000002", "session": session.name,
         "created": "", "captured_ms": 0, "facts": {"index": 0, "first": 1, "last": 2}},
        Window,
    )  # fmt: skip
    assert spool.staged_dir(window) == staged
    placed = spool.place(window)
    assert placed.path == session / "p/step_000001-000002" and not staged.exists()
    assert spool.place(window).window == placed.window, "in place already: read as it is"
    with pytest.raises(OSError):
        spool.place(msgspec.structs.replace(window, artifact_path="p/step_000003-000004"))


def test_placing_a_window_where_one_is_takes_over_its_artifacts(tmp_path) -> None:
    # the same steps captured again in one session: the newer window replaces the older
    spool = Spool(tmp_path)
    session = spool.new_session_dir()
    old = spool.create_window(session, "p/step_000001-000002")
    (old.artifacts_dir / "old.txt").write_text("old")
    staged = Spool.capture_dir(session, 1, "p")
    (staged / "artifacts" / "traces").mkdir(parents=True)
    (staged / "artifacts" / "traces" / "new.json").write_text("{}")
    window = msgspec.structs.replace(old.window, steps=7)
    placed = spool.place(window, staged)
    assert placed.path == old.path and not staged.exists()
    assert [p.name for p in placed.artifacts_dir.rglob("*.*")] == ["new.json"]
    assert WindowRecord.load(placed.path).window.steps == 7
