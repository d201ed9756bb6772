"""The ``neuron-mlflow`` argument parser: every verb, option and help text.

Example:
    >>> build_parser().parse_args(["summarize", "t.json"]).verb
    'summarize'
"""

from __future__ import annotations

import argparse

from neuron_mlflow.engine.environment import package_version


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="neuron-mlflow", description="Accelerator profiling windows in MLflow."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
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
    sync.add_argument(
        "--prune",
        action="store_true",
        help="then remove the trace files of every uploaded window from the spool (their "
        "manifests and summaries stay; nothing that was not uploaded is removed)",
    )
    compare = verbs.add_parser(
        "compare",
        help="compare profiled runs: headline metrics and per-op changes vs a baseline",
        description=(
            "Compare profiled MLflow runs: headline metrics (device time, self CPU time, wall "
            "time, op calls, steps) and per-op times, each with the ratio to the baseline, its "
            "95% interval (a bootstrap over runs, windows and steps: docs/comparing.md) and a "
            "verdict (regression, improvement, no change, insufficient data). A job's parent "
            "run (its variants nested under it, as the RMSNorm main job logs them) stands for "
            "its variants: each variant (the nested run's name) is one side, the first one "
            "the baseline. Without --baseline the first run is the baseline and each other "
            "run a candidate; with --baseline R1 R2 ... the runs given are pooled into one "
            "baseline side (a parent given: its first variant) and the other runs into one "
            "candidate side (variants: one side each). --experiment NAME --last K compares "
            "the K most recent jobs (a parent with its variants is one job, pooled variant by "
            "variant; a profiled run without nested runs is a job of its own). Which runs "
            "each side holds is printed on stderr (JSON: 'runs'). Exit "
            "codes: 0 ok, 1 regression (the interval's lower bound above 1 + --fail-above/100), "
            "2 bad usage (unknown runs, no profile metrics, an --html PATH that cannot be "
            "written, an unknown --log-to RUN), 3 insufficient data for the gate "
            "(unless --allow-insufficient)."
        ),
    )
    compare.add_argument("run_ids", nargs="*", metavar="RUN_ID", help="runs to compare")
    compare.add_argument(
        "--baseline",
        nargs="+",
        metavar="RUN_ID",
        help="the baseline run(s); several are pooled into one side (run-to-run noise counts); "
        "a job's parent run: its first variant (its other variants are the candidates when no "
        "RUN_ID is given)",
    )
    compare.add_argument("--prefix", metavar="P", help="metric prefix (default: the run's own)")
    compare.add_argument("--top", type=int, default=20, metavar="N", help="ops shown (20)")
    compare.add_argument(
        "--fail-above",
        type=percentage,
        metavar="PCT",
        help=(
            "exit 1 when the interval of the headline time's ratio lies wholly above "
            "1 + PCT/100 (exit 3 when it cannot be decided); also the verdicts' margin; "
            "'off': no gate (the default)"
        ),
    )
    compare.add_argument(
        "--ops", action="store_true", help="with --fail-above: gate every op on both sides too"
    )
    compare.add_argument(
        "--allow-insufficient",
        action="store_true",
        help="with --fail-above: exit 0 instead of 3 when the gate cannot decide",
    )
    compare.add_argument(
        "--split-by",
        metavar="KEY",
        help=(
            "with --experiment/--last: group the runs by this tag or param (e.g. "
            "mlflow.source.git.commit), a job's variants apart; the oldest job's group is the "
            "baseline"
        ),
    )
    compare.add_argument(
        "--format", choices=("table", "markdown", "json"), default="table", help="output format"
    )
    compare.add_argument("--experiment", metavar="NAME", help="pick runs from this experiment")
    compare.add_argument(
        "--last",
        type=int,
        metavar="K",
        help="with --experiment: the K most recent jobs (a parent run with its nested variant "
        "runs is one job; a profiled run without nested runs, one job)",
    )
    compare.add_argument(
        "--html", metavar="PATH", help="also write comparison.html (the comparison as a picture)"
    )
    compare.add_argument(
        "--log-to",
        metavar="RUN",
        help="log comparison.html and comparison.md as artifacts of run RUN",
    )
    download = verbs.add_parser(
        "download",
        help="fetch a window's traces and print the commands that open them",
        description=(
            "Download the traces of one window (default: the latest) of RUN_ID into DEST, with "
            "names and nesting unchanged, and print the neuron-explorer commands: one per "
            "rank's profile directory, one for all ranks together, and device-only views for "
            ".neff + .ntff pairs that belong together. Exit 2 for an unknown run or window, "
            "or a DEST that is a file or cannot be made."
        ),
    )
    download.add_argument("run_id", metavar="RUN_ID")
    download.add_argument(
        "--window", metavar="W", help="window folder, e.g. step_000010-000012 or P/step_..."
    )
    download.add_argument("--dest", required=True, metavar="DIR", help="local folder")
    download.add_argument(
        "--open",
        action="store_true",
        help="run the first command when neuron-explorer is on PATH (exit: its exit code)",
    )
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
    capture = verbs.add_parser(
        "capture",
        help="ask a running job for a profiling window now (and wait for it with --wait)",
        description=(
            "Write a capture request into RUN_ID's tag neuron_mlflow.capture.request; the job "
            "reads it within its poll_s and takes the window. The start step is the furthest "
            "rank's step (from its heartbeat) plus 2 x poll_s of steps, rounded up to a "
            "multiple of --roundup, so every rank starts on it. Exit codes: 0 written (with "
            "--wait: the window is in the run), 1 MLflow or the window failed, 2 bad usage "
            "(unknown run), 3 refused by the job (the reason is printed), 4 --wait timed out."
        ),
    )
    capture.add_argument("run_id", metavar="RUN_ID")
    capture.add_argument(
        "--steps",
        type=int,
        metavar="N",
        help="recorded steps (the job's schedule's active; at most its max_request_steps, 50)",
    )
    capture.add_argument(
        "--warmup", type=int, metavar="W", help="warm-up steps before them (the schedule's warmup)"
    )
    capture.add_argument("--at-step", type=int, metavar="S", help="the step to start at")
    capture.add_argument(
        "--roundup", type=int, default=10, metavar="R", help="start on a multiple of R (10)"
    )
    capture.add_argument(
        "--wait",
        action="store_true",
        help="wait until the window's metrics are in the run; print where",
    )
    capture.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        metavar="S",
        help="with --wait: give up after S seconds (600; exit 4)",
    )
    capture.add_argument("--interval", type=float, default=0.5, help=argparse.SUPPRESS)
    verbs.add_parser(  # listed only: main() hands `run` to cli/run.py before parsing
        "run",
        help="run any command with autolog in every Python process it starts (one MLflow run)",
        add_help=False,
    )
    ingest.add_argument("paths", nargs="+", metavar="PATH")
    target = ingest.add_mutually_exclusive_group()
    target.add_argument("--run-id", metavar="R", help="log into this run")
    target.add_argument("--experiment", metavar="E", help="create the run in this experiment")
    ingest.add_argument("--prefix", default="profile", metavar="P", help="metric prefix")
    ingest.add_argument("--local-dir", default=None, help="spool folder")
    for sub in verbs.choices.values():  # an unknown option is the verb's error, with its usage
        sub.set_defaults(verb_parser=sub)
    return parser


def percentage(text: str) -> float | None:
    """``--fail-above``'s value: a percentage, or ``off`` (no gate: ``MLproject``'s default).

    Example:
        >>> percentage("5"), percentage("off")
        (5.0, None)
    """
    if text == "off":
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a percentage (e.g. 5) or off") from None
