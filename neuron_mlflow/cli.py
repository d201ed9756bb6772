"""The ``neuron-mlflow`` command line: a thin shell over library functions.

Exit codes: 0 success, 1 failure (some window could not be uploaded), 2 bad usage.
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

from neuron_mlflow.config import ProfilerConfig
from neuron_mlflow.mlflow_sink import current_tracking_uri, sync_pending

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
    return parser


def _sync(args: argparse.Namespace) -> int:
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
    return EXIT_USAGE  # pragma: no cover - argparse rejects unknown verbs


if __name__ == "__main__":
    sys.exit(main())
