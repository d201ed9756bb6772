"""Fetch a window's traces from MLflow and say how to open them: ``neuron-explorer`` for a
Neuron window (docs/neuron.md, "Open a window in Neuron Explorer"), Perfetto for torch traces.

Example:
    >>> viewer_commands(Path("/nowhere"))
    []
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any, TextIO

from neuron_mlflow.capture.profile_reader import TRACE_SUFFIXES, looks_like_trace
from neuron_mlflow.errors import DownloadError

_WINDOW = re.compile(r"^step_\d{6}-(\d{6})$")
_RANK = re.compile(r"^rank_(\d+)$")
_PROCESS = re.compile(r"_pid_\d+$")
_MODEL_NTFF = re.compile(r"^(?P<hash>\d+)_instid_\d+_vnc_\d+\.ntff$")
EXPLORER = "neuron-explorer"
ALL_RANKS = "all_ranks"


def list_windows(client: Any, run_id: str, path: str | None = None) -> list[str]:
    """Artifact paths of every window folder (``P/step_<first>-<last>``) of the run."""
    found: list[str] = []
    for info in client.list_artifacts(run_id, path):
        name = info.path.rsplit("/", 1)[-1]
        if info.is_dir and _WINDOW.match(name):
            found.append(info.path)
        elif info.is_dir and name != "traces":
            found += list_windows(client, run_id, info.path)
    return found


def _last_step(window: str) -> int:
    match = _WINDOW.match(window.rsplit("/", 1)[-1])
    return int(match[1]) if match else -1


def pick_window(windows: list[str], wanted: str | None) -> str:
    """``wanted`` (a full path, or a folder name ``step_...`` if unique), else the latest.

    Example:
        >>> pick_window(["profile/step_000001-000002", "profile/step_000006-000007"], None)
        'profile/step_000006-000007'
    """
    if not windows:
        raise DownloadError("the run has no profiling windows (no 'P/step_*' artifact folders)")
    if wanted is None:
        return max(windows, key=lambda w: (_last_step(w), w))
    matches = [w for w in windows if w == wanted.strip("/") or w.endswith("/" + wanted)]
    if len(matches) != 1:
        raise DownloadError(
            f"window {wanted!r} {'is ambiguous' if matches else 'was not found'}; "
            f"the run has: {', '.join(sorted(windows))}"
        )
    return matches[0]


def _rank_of(path: Path, root: Path) -> str | None:
    for part in path.relative_to(root).parts:
        match = _RANK.match(part)
        if match:
            return match[1]
    return None


def _name(label: str, rank: str | None, *more: str) -> str:
    return "/".join([label, *([f"rank_{rank}"] if rank is not None else []), *more])


def _explorer(display: str, *args: str | Path) -> str:
    """``neuron-explorer view ARGS``, the profile stored in Explorer under ``display``."""
    view = [EXPLORER, "view", *map(str, args), "--ingest-only", "--display-name", display]
    return shlex.join(view)


def _system_commands(root: Path, label: str) -> list[str]:
    """Per-rank ``-d`` commands, then the all-ranks one(s)."""
    profiles = sorted(info.parent for info in root.rglob("trace_info.pb"))
    per_rank: dict[str | None, list[Path]] = {}
    for folder in profiles:
        per_rank.setdefault(_rank_of(folder, root), []).append(folder)
    commands = [
        _explorer(_name(label, rank, *([folder.name] if len(folders) > 1 else [])), "-d", folder)
        for rank, folders in sorted(per_rank.items(), key=lambda kv: int(kv[0] or -1))
        for folder in folders
    ]
    processes = {folder.parent for folder in profiles if _PROCESS.search(folder.parent.name)}
    parents = [process.parent for process in processes]
    together = sorted({p for p in parents if parents.count(p) > 1})  # ranks sharing a folder
    if not together and len([rank for rank in per_rank if rank is not None]) > 1:
        together = [root / ALL_RANKS]
        for process in sorted(processes):
            link = together[0] / process.name
            if not link.exists():
                together[0].mkdir(exist_ok=True)
                os.symlink(process.resolve(), link, target_is_directory=True)
    return commands + [_explorer(f"{label}/{ALL_RANKS}", "-d", folder) for folder in together]


def _device_pairs(root: Path, label: str) -> list[str]:
    commands: list[str] = []
    for ntff in sorted(root.rglob("*.ntff")):
        if ALL_RANKS in ntff.relative_to(root).parts or ntff.stat().st_size == 0:
            continue
        neffs = sorted(ntff.parent.glob("*.neff"))
        model = _MODEL_NTFF.match(ntff.name)
        if model:
            neffs = [n for n in neffs if n.name == f"neff_{model['hash']}.neff"]
        if len(neffs) != 1:
            continue
        display = _name(label, _rank_of(ntff, root), ntff.stem)
        commands.append(_explorer(display, "-n", neffs[0], "-s", ntff))
    return commands


def _is_trace(path: Path) -> bool:
    """A torch/Chrome trace file by its name (``*.pt.trace.json[.gz]``), or a ``.json`` /
    ``.json.gz`` file that :func:`looks_like_trace` (what ``ingest`` takes)."""
    if not path.is_file() or not path.name.endswith(TRACE_SUFFIXES):
        return False
    try:
        return path.name.endswith(TRACE_SUFFIXES[:2]) or looks_like_trace(path)
    except EOFError:  # a gzip stream cut short
        return False


def viewer_commands(root: Path, label: str = "profile") -> list[str]:
    """Commands that open the traces under ``root``: per rank, all ranks, device-only pairs.

    Args:
        root: the downloaded ``traces`` folder.
        label: ``<run>/<window>``, the start of every ``--display-name``.

    Example:
        >>> import tempfile
        >>> root = Path(tempfile.mkdtemp())
        >>> folder = root / "rank_0" / "i-1_pid_7" / "20260421_153012_123"
        >>> folder.mkdir(parents=True)
        >>> for name in ("trace_info.pb", "neff_5_vnc_0.neff", "profile_nc_0_session_0.ntff"):
        ...     _ = (folder / name).write_bytes(b"x")
        >>> [c.split(" --ingest-only")[0].replace(str(root), "R") for c in viewer_commands(root)]
        ... # doctest: +NORMALIZE_WHITESPACE
        ['neuron-explorer view -d R/rank_0/i-1_pid_7/20260421_153012_123',
         'neuron-explorer view -n R/rank_0/i-1_pid_7/20260421_153012_123/neff_5_vnc_0.neff
          -s R/rank_0/i-1_pid_7/20260421_153012_123/profile_nc_0_session_0.ntff']
    """
    if not root.is_dir():
        return []
    commands = [*_system_commands(root, label), *_device_pairs(root, label)]
    traces = [] if commands else sorted(p for p in root.rglob("*.json*") if _is_trace(p))
    return commands + [f"# open {trace} at https://ui.perfetto.dev" for trace in traces]


def _child_runs(client: Any, run: Any) -> str:
    """The child runs of ``run`` (a job's variants), as ``id (name), ...``; "" when none."""
    from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

    children = client.search_runs(
        [run.info.experiment_id],
        f"tags.`{MLFLOW_PARENT_RUN_ID}` = '{run.info.run_id}'",
        max_results=11,
        order_by=["attributes.start_time ASC"],
    )
    listed = [f"{c.info.run_id} ({c.info.run_name})" for c in children]
    return ", ".join(listed[:10] + (["..."] if len(listed) > 10 else []))


def print_download(
    client: Any, run_id: str, window: str | None, dest: Path, out: TextIO, open_first: bool = False
) -> int:
    """The ``download`` verb: fetch the traces of ``window`` (default: the latest) into
    ``dest`` and print the commands that open them (docs/cli.md, ``download``).

    Returns:
        The exit code of the command that ran (0 when none ran).

    Raises:
        DownloadError: the run or window does not exist, or the window has no traces.
        MlflowException: MLflow failed otherwise.
        OSError: writing under ``dest`` failed (the CLI checks first that it can be made).
    """
    from neuron_mlflow.sinks.profiles import existing_run, quiet_downloads
    from neuron_mlflow.sinks.reachability import bounded_http

    with bounded_http(), quiet_downloads():
        run = existing_run(client, run_id, error=DownloadError)
        windows = list_windows(client, run_id)
        if not windows and (children := _child_runs(client, run)):
            raise DownloadError(
                f"run {run_id!r} has no profiling windows but has child runs (a job's "
                f"variants keep theirs): {children}; download one of those"
            )
        chosen = pick_window(windows, window)
        if not client.list_artifacts(run_id, f"{chosen}/traces"):
            raise DownloadError(
                f"window {chosen!r} has no traces (logged with upload_traces=False?)"
            )
        dest.mkdir(parents=True, exist_ok=True)
        local = Path(client.download_artifacts(run_id, f"{chosen}/traces", str(dest)))
    window_name = chosen.rsplit("/", 1)[-1]
    commands = viewer_commands(local, label=f"{run_id}/{window_name}")
    print(f"# window {chosen} of run {run_id}: traces in {local}", file=out)
    for command in commands:
        print(command, file=out)
    if not open_first:
        return 0
    runnable = [c for c in commands if not c.startswith("#")]
    if not runnable:
        print("# --open: nothing to open with neuron-explorer in this window", file=out)
        return 0
    if shutil.which(EXPLORER) is None:
        print(f"# --open: {EXPLORER} is not on PATH (install aws-neuronx-tools)", file=out)
        return 0
    print(f"# running: {runnable[0]}", file=out)
    out.flush()
    return subprocess.run(shlex.split(runnable[0]), check=False).returncode
