"""The ``neuron-mlflow`` command line: a thin shell over library functions.

Verbs: ``sync`` (upload pending windows), ``compare`` (compare profiled runs), ``download``
(fetch a window's traces and print the commands that open them), ``summarize`` (the op
summary of a trace file, without MLflow), ``ingest`` (trace files into MLflow), ``capture``
(ask a running job for a window: :mod:`neuron_mlflow.cli.capture`, with its own exit codes).
Exit codes: 0 success, 1 failure (a window could not be uploaded; a regression above
``--fail-above``), 2 bad usage (including unknown runs and runs without profile metrics),
3 ``compare --fail-above``: insufficient data to decide (unless ``--allow-insufficient``).
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
from typing import TYPE_CHECKING, Any

from neuron_mlflow.cli.parser import build_parser

if TYPE_CHECKING:
    from neuron_mlflow.sinks.pending import SyncReport

# Each verb imports what it needs when it runs: `summarize` stays free of mlflow, pydantic and
# torch, so it starts fast and small.

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INSUFFICIENT = 3  # compare --fail-above could not decide (summary.comparison)


def _summarize(args: argparse.Namespace) -> int:
    from pathlib import Path

    from neuron_mlflow.summary.names import display_names
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
        short = display_names(name for name, _ in top)
        print(
            "- Top device kernels (window total): "
            + "; ".join(f"{short[name]} {us:.1f} us" for name, us in top)
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

    from neuron_mlflow.sinks.download import DownloadError, print_download

    try:
        code = print_download(
            MlflowClient(), args.run_id, args.window, Path(args.dest), sys.stdout, args.open
        )
    except DownloadError as exc:
        print(f"neuron-mlflow download: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK if code == 0 else EXIT_FAILURE


def _pick_recent(client: object, experiment: str, last: int) -> list[Any]:
    """The ``last`` most recent runs of ``experiment`` that have profile metrics, oldest first."""
    from neuron_mlflow.errors import CompareError
    from neuron_mlflow.sinks.profiles import profile_prefixes

    found = client.get_experiment_by_name(experiment)  # type: ignore[attr-defined]
    if found is None:
        raise CompareError(f"experiment {experiment!r} was not found")
    runs = client.search_runs(  # type: ignore[attr-defined]
        [found.experiment_id], order_by=["attributes.start_time DESC"], max_results=500
    )
    profiled = [r for r in runs if profile_prefixes(r.data.metrics)][:last]
    if not profiled:
        raise CompareError(f"experiment {experiment!r} has no runs with profile metrics")
    return list(reversed(profiled))


def _sides(args: argparse.Namespace, client: Any) -> list[tuple[str | None, list[str]]]:
    """The sides to compare, baseline first: (label for a group, run ids)."""
    from neuron_mlflow.errors import CompareError

    run_ids = list(args.run_ids)
    if args.experiment is not None:
        picked = _pick_recent(client, args.experiment, args.last)
        if args.split_by:
            groups: dict[str, list[str]] = {}
            for run in picked:
                value = run.data.tags.get(args.split_by, run.data.params.get(args.split_by))
                if value is None:
                    raise CompareError(
                        f"run {run.info.run_id!r} has no tag or param {args.split_by!r}"
                    )
                groups.setdefault(value, []).append(run.info.run_id)
            if len(groups) < 2:
                raise CompareError(f"--split-by {args.split_by}: the runs share one value")
            return [(f"{args.split_by}={value}"[:60], ids) for value, ids in groups.items()]
        run_ids += [r.info.run_id for r in picked if r.info.run_id not in run_ids]
    if args.baseline:
        candidates = [r for r in run_ids if r not in args.baseline] or run_ids
        if not candidates:
            raise CompareError("give the candidate run(s) besides --baseline")
        label = "baseline" if len(args.baseline) > 1 else None
        return [
            (label, list(args.baseline)),
            ("candidate" if len(candidates) > 1 else None, candidates),
        ]
    return [(None, [r]) for r in run_ids]


def _compare(args: argparse.Namespace) -> int:
    from mlflow import MlflowClient

    from neuron_mlflow.errors import CompareError
    from neuron_mlflow.sinks.profiles import load_profile
    from neuron_mlflow.summary.comparison import (
        EXIT_INSUFFICIENT,
        RunProfile,
        compare_profiles,
        group_profiles,
        regressions,
        render_json,
        render_markdown,
        render_table,
        undecided,
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
        sides = _sides(args, client)
        if len(sides) < 2:
            print(
                "neuron-mlflow compare: give at least two runs (RUN_ID... or --experiment NAME "
                "--last K)",
                file=sys.stderr,
            )
            return EXIT_USAGE
        unique = list(dict.fromkeys(r for _, ids in sides for r in ids))
        loaded = {r: load_profile(client, r, args.prefix) for r in unique}
        if args.prefix is None and len({p.prefix for p in loaded.values()}) > 1:
            shared = set.intersection(*(set(p.prefixes) for p in loaded.values()))
            if shared:
                prefix = sorted(shared)[0]
                loaded = {r: load_profile(client, r, prefix) for r in unique}
    except CompareError as exc:
        print(f"neuron-mlflow compare: {exc}", file=sys.stderr)
        return EXIT_USAGE
    profiles: list[RunProfile] = []
    for label, ids in sides:
        profile = group_profiles([loaded[r] for r in ids], label)
        taken = {p.run_id for p in profiles}
        if profile.run_id in taken:  # the same run on both sides: keep the rows apart
            profile = replace(profile, run_id=f"{profile.run_id}#{len(profiles) + 1}")
        profiles.append(profile)
    comparison = compare_profiles(
        profiles, baseline=profiles[0].run_id, top=args.top, margin_pct=args.fail_above
    )
    render = {"table": render_table, "markdown": render_markdown, "json": render_json}
    print(render[args.format](comparison), end="")
    if args.html or args.log_to:
        from pathlib import Path

        from neuron_mlflow.sinks.comparison_files import publish_comparison

        html_path = Path(args.html) if args.html else None
        try:
            written = publish_comparison(
                comparison, html_path, args.log_to, args.fail_above, client
            )
        except CompareError as exc:
            print(f"neuron-mlflow compare: {exc}", file=sys.stderr)
            return EXIT_USAGE
        for item in written:
            print(f"wrote {item}", file=sys.stderr)
    if args.fail_above is not None:
        failures = regressions(comparison, args.fail_above, ops=args.ops)
        for line in failures:
            print(f"regression: {line}", file=sys.stderr)
        if failures:
            return EXIT_FAILURE
        unsure = undecided(comparison, args.fail_above, ops=args.ops)
        for line in unsure:
            print(f"undecided: {line}", file=sys.stderr)
        if unsure and not args.allow_insufficient:
            print(
                f"neuron-mlflow compare: insufficient data for --fail-above "
                f"{args.fail_above:g} (exit {EXIT_INSUFFICIENT}): profile more steps or windows "
                "(Schedule(active=20, repeat=3)) or give each side several runs; "
                "--allow-insufficient exits 0 instead",
                file=sys.stderr,
            )
            return EXIT_INSUFFICIENT
    return EXIT_OK


def _sync(args: argparse.Namespace) -> int:
    from neuron_mlflow.config import ProfilerConfig
    from neuron_mlflow.engine.sync import sync_pending

    local_dir = args.local_dir or str(ProfilerConfig().local_dir)
    try:
        report = sync_pending(local_dir, include_incomplete=args.include_incomplete)
    except ConnectionError as exc:
        print(f"neuron-mlflow sync: {exc}; nothing was uploaded", file=sys.stderr)
        code = EXIT_FAILURE
    else:
        code = _sync_report(report)
    if args.prune:  # what was uploaded before (or just now) loses its trace files
        _prune(local_dir)
    return code


def _prune(local_dir: str) -> None:
    """``sync --prune``: free the trace files of every uploaded window; say what stayed."""
    from neuron_mlflow.sinks.spool_cleanup import prune

    pruned = prune(local_dir)
    for path, reason in pruned.kept:
        print(f"kept {path}: {reason}", file=sys.stderr)
    if pruned.pruned:
        print(
            f"freed {pruned.freed_bytes / 1e6:.1f} MB: the trace files of "
            f"{len(pruned.pruned)} uploaded windows (their records stay)"
        )
    else:
        print("no trace files of uploaded windows to free")


def _sync_report(report: SyncReport) -> int:
    from neuron_mlflow.sinks.mlflow_sink import current_tracking_uri

    for path in report.skipped:
        print(f"skipped (incomplete): {path}", file=sys.stderr)
    for path in report.busy:
        print(f"skipped (a running job is still uploading it): {path}", file=sys.stderr)
    if not report.uploaded and not report.failed and report.busy:
        print("nothing to upload now: every pending window belongs to a running job")
        return EXIT_OK
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
    parser = build_parser()
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
    if args.verb == "capture":
        from neuron_mlflow.cli.capture import run_capture

        return run_capture(args)
    return EXIT_USAGE  # pragma: no cover - argparse rejects unknown verbs


if __name__ == "__main__":
    sys.exit(main())
