"""Fetch a window's traces from MLflow and say how to open them.

For a Neuron window: ``neuron-explorer view -d DIR`` for each system profile folder (one
holding ``trace_info.pb``), and ``neuron-explorer view -n NEFF -s NTFF`` for each device-only
pair (a ``.ntff`` with the ``.neff`` of its folder). For torch traces: open them in Perfetto.

Example:
    >>> viewer_commands(Path("/nowhere"))
    []
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from neuron_mlflow.errors import DownloadError

_WINDOW = re.compile(r"^step_\d{6}-(\d{6})$")


def list_windows(client: Any, run_id: str, path: str | None = None) -> list[str]:
    """Artifact paths of every window folder (``P/step_<first>-<last>``) of the run."""
    found: list[str] = []
    for info in client.list_artifacts(run_id, path):
        if not info.is_dir:
            continue
        if _WINDOW.match(info.path.rsplit("/", 1)[-1]):
            found.append(info.path)
        elif info.path.rsplit("/", 1)[-1] != "traces":
            found.extend(list_windows(client, run_id, info.path))
    return found


def pick_window(windows: list[str], wanted: str | None) -> str:
    """``wanted`` (a full path, or a folder name ``step_...`` if unique), else the latest.

    Example:
        >>> pick_window(["profile/step_000001-000002", "profile/step_000006-000007"], None)
        'profile/step_000006-000007'
    """
    if not windows:
        raise DownloadError("the run has no profiling windows (no 'P/step_*' artifact folders)")
    if wanted is None:
        return max(windows, key=lambda w: (int(_WINDOW.match(w.rsplit("/", 1)[-1])[1]), w))
    matches = [w for w in windows if w == wanted.strip("/") or w.endswith("/" + wanted)]
    if len(matches) != 1:
        raise DownloadError(
            f"window {wanted!r} {'is ambiguous' if matches else 'was not found'}; "
            f"the run has: {', '.join(sorted(windows))}"
        )
    return matches[0]


def viewer_commands(root: Path) -> list[str]:
    """Commands that open the traces under ``root``, system profiles first."""
    commands: list[str] = []
    for info in sorted(root.rglob("trace_info.pb")):
        commands.append(f"neuron-explorer view -d {info.parent}")
    for ntff in sorted(root.rglob("*.ntff")):
        for neff in sorted(ntff.parent.glob("*.neff")):
            commands.append(f"neuron-explorer view -n {neff} -s {ntff}")
    if not commands:
        for trace in sorted(root.rglob("*.pt.trace.json*")):
            commands.append(f"# open {trace} at https://ui.perfetto.dev")
    return commands


def download_window(client: Any, run_id: str, window: str | None, dest: Path) -> tuple[str, Path]:
    """Download the traces of ``window`` (default: the latest) into ``dest``.

    Returns:
        ``(window path, local traces folder)``.

    Raises:
        DownloadError: the run or window does not exist, or the window has no traces.
    """
    from mlflow.exceptions import MlflowException

    try:
        client.get_run(run_id)
    except MlflowException as exc:
        raise DownloadError(f"run {run_id!r} was not found at {client.tracking_uri}") from exc
    chosen = pick_window(list_windows(client, run_id), window)
    if not client.list_artifacts(run_id, f"{chosen}/traces"):
        raise DownloadError(f"window {chosen!r} has no traces (logged with upload_traces=False?)")
    dest.mkdir(parents=True, exist_ok=True)
    local = client.download_artifacts(run_id, f"{chosen}/traces", str(dest))
    return chosen, Path(local)
