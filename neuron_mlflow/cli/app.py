"""The ``neuron-mlflow`` command line: a thin shell over library functions.

Verbs: ``sync`` (upload pending windows), ``compare`` (compare profiled runs), ``download``
(fetch a window's traces and print the commands that open them), ``summarize`` (the op
summary of a trace file, without MLflow), ``ingest`` (trace files into MLflow).
Exit codes: 0 success, 1 failure (a window could not be uploaded; a regression above
``--fail-above``), 2 bad usage (including unknown runs and runs without profile metrics).
Results go to stdout, diagnostics to stderr.

Example:
    >>> import tempfile
    >>> main(["sync", "--local-dir", tempfile.mkdtemp()])
    nothing to upload: no pending windows
    0
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import replace

# Each verb imports what it needs when it runs: `summarize` stays free of mlflow, pydantic and
# torch, so it starts fast and small.

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="neuron-mlflow",
        description="Accelerator profiling windows in MLflow.",
    )
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    sync = verbs.add_parser(
        "sync",
        help="upload every pending window of the local spool to the current tracking URI",
        description=(
            "Upload every pending window of the local spool to the tracking URI that MLflow "
            "resolves (MLFLOW_TRACKING_URI), into its original run when that run exists there, "
            "else into a new run. Windows already uploaded are never uploaded again."
        ),
    )
    sync.add_argument(
        "--local-dir",
        default=None,
        help="the spool folder (default: ProfilerConfig().local_dir, ./neuron_mlflow_traces)",
    )
    sync.add_argument(
        "--include-incomplete",
        action="store_true",
        help="also upload windows that were interrupted by an exception",
    )
    compare = verbs.add_parser(
        "compare",
        help="compare profiled runs: headline metrics and per-op changes vs a baseline",
        description=(
            "Compare the latest profile windows of MLflow runs side by side: headline metrics "
            "(device time, self CPU time, wall time, op calls, steps) and per-op times with "
            "the change against the baseline (first run unless --baseline). Exit codes: 0 ok, "
            "1 regression above --fail-above, 2 bad usage (unknown runs, no profile metrics)."
        ),
    )
    compare.add_argument("run_ids", nargs="*", metavar="RUN_ID", help="runs to compare")
    compare.add_argument("--baseline", metavar="RUN_ID", help="the run others are compared to")
    compare.add_argument("--prefix", metavar="P", help="metric prefix (default: the run's own)")
    compare.add_argument("--top", type=int, default=20, metavar="N", help="ops shown (20)")
    compare.add_argument(
        "--fail-above",
        type=float,
        metavar="PCT",
        help="exit 1 when a run's headline time exceeds the baseline's by more than PCT %%",
    )
    compare.add_argument(
        "--format", choices=("table", "markdown", "json"), default="table", help="output format"
    )
    compare.add_argument("--experiment", metavar="NAME", help="pick runs from this experiment")
    compare.add_argument(
        "--last", type=int, metavar="K", help="with --experiment: the K most recent profiled runs"
    )
    download = verbs.add_parser(
        "download",
        help="fetch a window's traces and print the commands that open them",
        description=(
            "Download the traces of one window (default: the latest) of RUN_ID into DEST, with "
            "names and nesting unchanged, and print the neuron-explorer commands for the system "
            "profile and the device-only (.neff + .ntff) views. Exit 2 for an unknown run or "
            "window."
        ),
    )
    download.add_argument("run_id", metavar="RUN_ID")
    download.add_argument(
        "--window", metavar="W", help="window folder, e.g. step_000010-000012 or P/step_..."
    )
    download.add_argument("--dest", required=True, metavar="DIR", help="local folder")
    summarize = verbs.add_parser(
        "summarize",
        help="print the op summary of a trace file (no MLflow)",
        description=(
            "Read a Chrome/Kineto trace (.json or .json.gz, any accelerator) and print its op "
            "summary in the seed's layout, per profiled step, plus device kernels, device "
            "busy share and unattributed device events. Exit 2 for a missing or malformed file."
        ),
    )
    summarize.add_argument("path", metavar="PATH")
    summarize.add_argument("--top", type=int, default=30, metavar="N", help="ops shown (30)")
    ingest = verbs.add_parser(
        "ingest",
        help="log trace files (or folders of them) into MLflow like a live window",
        description=(
            "Summarise trace files (a file, or a folder searched for .json/.json.gz traces, one "
            "per rank; the rank from the file's distributedInfo when present) and log them "
            "with the same metrics and artifacts as a live window, the files included. "
            "Exit 2 for bad input, 1 when MLflow cannot be reached (the window stays in the "
            "spool for `neuron-mlflow sync`)."
        ),
    )
    ingest.add_argument("paths", nargs="+", metavar="PATH")
    target = ingest.add_mutually_exclusive_group()
    target.add_argument("--run-id", metavar="R", help="log into this run")
    target.add_argument("--experiment", metavar="E", help="create the run in this experiment")
    ingest.add_argument("--prefix", default="profile", metavar="P", help="metric prefix")
    ingest.add_argument("--local-dir", default=None, help="spool folder")
    return parser


def _summarize(args: argparse.Namespace) -> int:
    from pathlib import Path

    from neuron_mlflow.summary.tables import render_markdown
    from neuron_mlflow.trace.reader import TraceFormatError
    from neuron_mlflow.trace.summarize import summarize_trace

    path = Path(args.path)
    if not path.is_file():
        print(f"neuron-mlflow summarize: no such file: {path}", file=sys.stderr)
        return EXIT_USAGE
    try:
        result = summarize_trace(path)
    except TraceFormatError as exc:
        print(f"neuron-mlflow summarize: {exc}", file=sys.stderr)
        return EXIT_USAGE
    summary = result.summary
    shown = replace(summary, ops=summary.ops[: args.top])
    print(render_markdown(shown, title=str(path)), end="")
    if result.rank is not None:
        print(f"- Rank (distributedInfo): {result.rank}")
    if result.device_events:
        busy = result.device_busy_pct
        print(
            f"- Device events: {result.device_events}, unattributed: "
            f"{result.unattributed_device_events}"
        )
        if busy is not None:
            print(f"- Device busy: {busy:.1f} % of the device span")
        top = sorted(result.kernels.items(), key=lambda kv: -kv[1])[:5]
        print(
            "- Top device kernels (window total): "
            + "; ".join(f"{name} {us:.1f} us" for name, us in top)
        )
    return EXIT_OK


def _ingest(args: argparse.Namespace) -> int:
    from pathlib import Path

    from neuron_mlflow.config import ProfilerConfig
    from neuron_mlflow.engine.ingest import IngestError, ingest
    from neuron_mlflow.sinks.mlflow_sink import current_tracking_uri
    from neuron_mlflow.trace.reader import TraceFormatError

    local_dir = Path(args.local_dir or ProfilerConfig().local_dir)
    try:
        ProfilerConfig(metric_prefix=args.prefix)
        run_id, record, ranks = ingest(
            [Path(p) for p in args.paths], args.run_id, args.experiment, args.prefix, local_dir
        )
    except (IngestError, TraceFormatError, ValueError) as exc:
        print(f"neuron-mlflow ingest: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ConnectionError as exc:
        print(f"neuron-mlflow ingest: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    for rank, (path, result) in ranks.items():
        print(
            f"rank {rank}: {path} ({result.device_events} device events, "
            f"{result.unattributed_device_events} unattributed)"
        )
    print(f"logged {record.artifact_path} into run {run_id} at {current_tracking_uri()}")
    return EXIT_OK


def _download(args: argparse.Namespace) -> int:
    from pathlib import Path

    from mlflow import MlflowClient

    from neuron_mlflow.sinks.download import DownloadError, download_window, viewer_commands

    try:
        window, local = download_window(MlflowClient(), args.run_id, args.window, Path(args.dest))
    except DownloadError as exc:
        print(f"neuron-mlflow download: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"# window {window} of run {args.run_id}: traces in {local}")
    for command in viewer_commands(local):
        print(command)
    return EXIT_OK


def _pick_recent(client: object, experiment: str, last: int) -> list[str]:
    """The ``last`` most recent runs of ``experiment`` that have profile metrics, oldest first."""
    from neuron_mlflow.errors import CompareError
    from neuron_mlflow.sinks.profiles import profile_prefixes

    found = client.get_experiment_by_name(experiment)  # type: ignore[attr-defined]
    if found is None:
        raise CompareError(f"experiment {experiment!r} was not found")
    runs = client.search_runs(  # type: ignore[attr-defined]
        [found.experiment_id], order_by=["attributes.start_time DESC"], max_results=500
    )
    profiled = [r.info.run_id for r in runs if profile_prefixes(r.data.metrics)][:last]
    if not profiled:
        raise CompareError(f"experiment {experiment!r} has no runs with profile metrics")
    return list(reversed(profiled))


def _compare(args: argparse.Namespace) -> int:
    from mlflow import MlflowClient

    from neuron_mlflow.errors import CompareError
    from neuron_mlflow.sinks.profiles import load_profile
    from neuron_mlflow.summary.comparison import (
        compare_profiles,
        regressions,
        render_json,
        render_markdown,
        render_table,
    )

    if args.top < 1 or (args.fail_above is not None and args.fail_above < 0):
        print("neuron-mlflow compare: --top must be >= 1 and --fail-above >= 0", file=sys.stderr)
        return EXIT_USAGE
    if (args.experiment is None) != (args.last is None) or (args.last or 1) < 1:
        print(
            "neuron-mlflow compare: --experiment NAME and --last K (K >= 1) go together",
            file=sys.stderr,
        )
        return EXIT_USAGE
    client = MlflowClient()
    try:
        run_ids = list(args.run_ids)
        if args.experiment is not None:
            run_ids += [
                r for r in _pick_recent(client, args.experiment, args.last) if r not in run_ids
            ]
        if args.baseline and args.baseline not in run_ids:
            run_ids.insert(0, args.baseline)
        if len(run_ids) < 2:
            print(
                "neuron-mlflow compare: give at least two runs (RUN_ID... or --experiment NAME "
                "--last K)",
                file=sys.stderr,
            )
            return EXIT_USAGE
        profiles = [load_profile(client, run_id, args.prefix) for run_id in run_ids]
    except CompareError as exc:
        print(f"neuron-mlflow compare: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.prefix is None and len({p.prefix for p in profiles}) > 1:
        shared = set.intersection(*(set(p.prefixes) for p in profiles))
        if shared:
            prefix = sorted(shared)[0]
            profiles = [load_profile(client, p.run_id, prefix) for p in profiles]
    comparison = compare_profiles(profiles, baseline=args.baseline, top=args.top)
    render = {"table": render_table, "markdown": render_markdown, "json": render_json}
    print(render[args.format](comparison), end="")
    if args.fail_above is not None:
        failures = regressions(comparison, args.fail_above)
        for line in failures:
            print(f"regression: {line}", file=sys.stderr)
        if failures:
            return EXIT_FAILURE
    return EXIT_OK


def _sync(args: argparse.Namespace) -> int:
    from neuron_mlflow.config import ProfilerConfig
    from neuron_mlflow.sinks.mlflow_sink import current_tracking_uri, sync_pending

    local_dir = args.local_dir or str(ProfilerConfig().local_dir)
    try:
        report = sync_pending(local_dir, include_incomplete=args.include_incomplete)
    except ConnectionError as exc:
        print(f"neuron-mlflow sync: {exc}; nothing was uploaded", file=sys.stderr)
        return EXIT_FAILURE
    for path in report.skipped:
        print(f"skipped (incomplete): {path}", file=sys.stderr)
    if not report.uploaded and not report.failed:
        print("nothing to upload: no pending windows")
        return EXIT_OK
    uri = current_tracking_uri()
    for path, run_id in report.uploaded:
        print(f"uploaded {path} -> run {run_id} at {uri}")
    for path, error in report.failed:
        print(f"failed {path}: {error}", file=sys.stderr)
    return EXIT_FAILURE if report.failed else EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default: ``sys.argv[1:]``); return the exit code.

    Example:
        >>> main(["frobnicate"])
        2
    """
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return EXIT_OK if exc.code in (0, None) else EXIT_USAGE
    if args.verb == "sync":
        return _sync(args)
    if args.verb == "compare":
        return _compare(args)
    if args.verb == "download":
        return _download(args)
    if args.verb == "summarize":
        return _summarize(args)
    if args.verb == "ingest":
        return _ingest(args)
    return EXIT_USAGE  # pragma: no cover - argparse rejects unknown verbs


if __name__ == "__main__":
    sys.exit(main())
