"""The ``neuron-mlflow`` command line: a thin shell over library functions.

The verbs ``sync``, ``compare``, ``download``, ``summarize`` and ``ingest``; ``capture`` and
``run`` have modules of their own. Their options and exit codes: docs/cli.md. Results go to
stdout, diagnostics to stderr.

Example:
    >>> import tempfile
    >>> main(["sync", "--local-dir", tempfile.mkdtemp()])  # doctest: +ELLIPSIS
    nothing to upload: no pending windows in /tmp/...
    0
"""

from __future__ import annotations

import argparse
import os
import sys
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuron_mlflow.cli.parser import build_parser

if TYPE_CHECKING:
    from neuron_mlflow.sinks.pending import SyncReport

# Each verb imports what it needs when it runs: `summarize` stays free of mlflow, pydantic and
# torch, so it starts fast and small.
EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INSUFFICIENT = 3  # compare --fail-above could not decide
TRACE_SHAPE = "a Chrome/Kineto trace is JSON text (.json, or gzip-compressed .json.gz)"


def fail(verb: str, message: object, code: int) -> int:
    """Say ``neuron-mlflow VERB: MESSAGE`` on stderr; return the exit ``code``."""
    print(f"neuron-mlflow {verb}: {message}", file=sys.stderr)
    return code


def mlflow_failed(verb: str, exc: Exception) -> int:
    """One line on stderr for an MLflow call that failed (not an unknown id); exit 1."""
    import mlflow

    why = " ".join(str(exc).split())
    return fail(verb, f"MLflow failed at {mlflow.get_tracking_uri()}: {why}", EXIT_FAILURE)


def reading_mlflow(verb: str, body: Callable[[Any], int], bounded: bool = True) -> int:
    """``body(MlflowClient())`` with MLflow's INFO lines off and, if ``bounded``, its HTTP
    retries bounded: an MLflow failure is one line and exit 1, an unknown run or window exit 2."""
    import logging

    import mlflow
    from mlflow import MlflowClient  # (configures MLflow's loggers: quieten them after)
    from mlflow.exceptions import MlflowException

    from neuron_mlflow.errors import CompareError, DownloadError
    from neuron_mlflow.sinks.reachability import bounded_http, check_reachable

    logger = logging.getLogger("mlflow")
    before = logger.level
    if "MLFLOW_LOGGING_LEVEL" not in os.environ:
        logger.setLevel(max(before, logging.WARNING))
    try:
        try:
            check_reachable(mlflow.get_tracking_uri())
        except ConnectionError as exc:
            return fail(verb, exc, EXIT_FAILURE)
        with bounded_http() if bounded else nullcontext():
            return body(MlflowClient())
    except (CompareError, DownloadError) as exc:
        return fail(verb, exc, EXIT_USAGE)
    except MlflowException as exc:  # not an unknown run (that is the errors above)
        return mlflow_failed(verb, exc)
    finally:
        logger.setLevel(before)


def _cannot_make(folder: Path) -> str | None:
    """Why the missing ``folder`` cannot be made (a file on its way, no permission,
    ``/proc``), or None; what was made to find out is removed again."""
    missing = [folder, *(p for p in folder.parents if not p.exists())]
    try:
        folder.mkdir(parents=True)
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        blocker = next((p for p in folder.parents if p.exists() and not p.is_dir()), None)
        return f"{why}: {blocker}" if blocker is not None else why
    for made in missing:
        try:
            made.rmdir()
        except OSError:
            break
    return None


def folder_problem(flag: str, folder: Path) -> str | None:
    """Why ``folder`` cannot be an output folder, or None; nothing is left behind by looking.

    Example:
        >>> import tempfile
        >>> file = Path(tempfile.mkdtemp()) / "notes.txt"
        >>> _ = file.write_text("x")
        >>> folder_problem("--dest", file)  # doctest: +ELLIPSIS
        '--dest /tmp/.../notes.txt: it is a file, not a folder; give a folder (made if missing)'
        >>> folder_problem("--dest", file / "sub")  # doctest: +ELLIPSIS
        '--dest /tmp/.../notes.txt/sub: cannot make the folder (Not a directory: /tmp/...)'
        >>> folder_problem("--dest", file.parent / "new" / "d"), (file.parent / "new").exists()
        (None, False)
    """
    if folder.is_dir():
        return None
    if folder.exists() or folder.is_symlink():
        return f"{flag} {folder}: it is a file, not a folder; give a folder (made if missing)"
    why = _cannot_make(folder)
    return f"{flag} {folder}: cannot make the folder ({why})" if why is not None else None


def _html_problem(path: Path) -> str | None:
    """Why ``compare --html PATH`` cannot be written, or None; nothing is left behind by looking.

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> _html_problem(folder)  # doctest: +ELLIPSIS
        '--html /tmp/...: it is a folder; give a file path, such as /tmp/.../comparison.html'
        >>> _html_problem(folder / "new" / "comparison.html"), list(folder.iterdir())
        (None, [])
    """
    from neuron_mlflow.naming import COMPARISON_HTML

    if path.is_dir():
        return f"--html {path}: it is a folder; give a file path, such as {path / COMPARISON_HTML}"
    folder = path.parent
    if folder.exists() and not folder.is_dir():
        return f"--html {path}: its folder {folder} is a file"
    if not folder.exists():
        why = _cannot_make(folder)
        return f"--html {path}: cannot make its folder {folder} ({why})" if why else None
    if path.exists():
        return None if os.access(path, os.W_OK) else f"--html {path}: cannot write it"
    try:
        path.open("x").close()
    except OSError as exc:
        return f"--html {path}: cannot write it ({exc.strerror or type(exc).__name__})"
    path.unlink()
    return None


def _not_a_trace(path: Path) -> str | None:
    """Why ``path`` cannot be a trace file, from its first bytes; None when it may be one
    (a truncated or malformed trace is the reader's to say, with its byte offset)."""
    from neuron_mlflow.trace.reader import open_trace

    if path.is_dir():
        return (
            f"{path} is a directory, not a trace file; give one .json or .json.gz file "
            "(`neuron-mlflow ingest DIR` reads a folder of traces)"
        )
    if not path.exists():
        return f"no such file: {path}"
    if not path.is_file():
        return f"{path} is not a regular file; give a .json or .json.gz trace file"
    with path.open("rb") as raw:
        head = raw.read(4096)
    gzipped = head[:2] == b"\x1f\x8b"
    if gzipped and path.suffix != ".gz":
        return f"{path} is gzip-compressed but not named .gz: name it .json.gz"
    if not gzipped and path.suffix == ".gz":
        if head.lstrip()[:1] in (b"{", b"["):
            return f"{path} is named .gz but holds plain JSON text: name it .json"
        return f"{path} is not a trace: named .gz but not gzip data; {TRACE_SHAPE}"
    try:
        with open_trace(path) as handle:
            start = handle.read(4096).lstrip()
    except EOFError:  # a gzip stream cut short: the reader names the offset
        return None
    except (OSError, UnicodeDecodeError, zlib.error) as exc:
        what = "damaged gzip data" if gzipped else "its bytes are not text"
        return f"{path} is not a trace: {what} ({type(exc).__name__}); {TRACE_SHAPE}"
    if not start:
        return f"{path} is not a trace: the file is empty; {TRACE_SHAPE}"
    if start[0] not in "{[":
        return (
            f"{path} is not a trace: it starts with {start[:12]!r}, not a JSON object or "
            f"array; {TRACE_SHAPE}"
        )
    return None


def _nothing_to_summarize(path: Path) -> str:
    """The message for a trace that holds no operator and no device event."""
    from neuron_mlflow.trace.reader import TraceStream

    events = sum(1 for _ in TraceStream(path, typed=True))
    if events == 0:
        return (
            f"{path} holds no trace events (its traceEvents is empty or missing): nothing to "
            "summarize"
        )
    return (
        f"{path} holds {events} trace event{'s' if events != 1 else ''} but no operator or "
        "device event (an empty profiler window?): nothing to summarize"
    )


def _summarize(args: argparse.Namespace) -> int:
    from neuron_mlflow.summary.names import display_names
    from neuron_mlflow.summary.tables import render_markdown
    from neuron_mlflow.trace.reader import TraceFormatError
    from neuron_mlflow.trace.summarize import summarize_trace

    path = Path(args.path)
    problem = _not_a_trace(path) if args.top >= 1 else f"--top {args.top}: give N >= 1"
    if problem is None:
        try:
            result = summarize_trace(path)
        except TraceFormatError as exc:
            problem = str(exc)
        except zlib.error as exc:  # gzip data damaged past the first bytes
            problem = f"{path}: damaged gzip data ({exc}); the file is not a readable trace"
        else:
            if not result.summary.ops and not result.device_events:
                problem = _nothing_to_summarize(path)
    if problem is not None:
        return fail("summarize", problem, EXIT_USAGE)
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
    from neuron_mlflow.config import ProfilerConfig
    from neuron_mlflow.engine.ingest import ingest

    local_dir = Path(args.local_dir or ProfilerConfig().local_dir)
    paths = [Path(p) for p in args.paths]
    for path in paths:  # (a folder is searched for traces by ingest)
        if not path.is_dir() and (problem := _not_a_trace(path)):
            return fail("ingest", problem, EXIT_USAGE)
    where = "--local-dir" if args.local_dir else "the spool folder (local_dir)"
    if problem := folder_problem(where, local_dir):  # before any run is made
        return fail("ingest", problem, EXIT_USAGE)
    try:
        ProfilerConfig(metric_prefix=args.prefix)
        run_id, record, ranks = ingest(paths, args.run_id, args.experiment, args.prefix, local_dir)
    except ValueError as exc:  # IngestError, TraceFormatError, ConfigError (--prefix)
        return fail("ingest", exc, EXIT_USAGE)
    except ConnectionError as exc:
        return fail("ingest", exc, EXIT_FAILURE)
    except OSError as exc:
        if exc.filename is None:  # not a file's (a network error): a failure
            return fail("ingest", " ".join(str(exc).split()), EXIT_FAILURE)
        # a trace that cannot be read, a spool that cannot be written
        return fail("ingest", f"{exc.filename}: {exc.strerror or exc}", EXIT_USAGE)
    for rank, (path, result) in ranks.items():
        print(
            f"rank {rank}: {path} ({result.device_events} device events, "
            f"{result.unattributed_device_events} unattributed)"
        )
    import mlflow

    print(f"logged {record.artifact_path} into run {run_id} at {mlflow.get_tracking_uri()}")
    return EXIT_OK


def _download(args: argparse.Namespace) -> int:
    if problem := folder_problem("--dest", Path(args.dest)):
        return fail("download", problem, EXIT_USAGE)
    # print_download bounds its own calls: the --open command gets the user's environment
    return reading_mlflow("download", lambda client: _fetch(client, args), bounded=False)


def _fetch(client: Any, args: argparse.Namespace) -> int:
    from neuron_mlflow.sinks.download import print_download

    dest = Path(args.dest)
    try:
        code = print_download(client, args.run_id, args.window, dest, sys.stdout, args.open)
    except OSError as exc:
        if exc.filename is None:  # not a file's (a network error): a failure
            return mlflow_failed("download", exc)
        # writing under --dest (a full disk, no permission)
        why = f"--dest {dest}: cannot write {exc.filename} ({exc.strerror or exc})"
        return fail("download", why, EXIT_USAGE)
    return EXIT_OK if code == 0 else EXIT_FAILURE


PARENT_TAG = "mlflow.parentRunId"  # MLflow's tag on a nested run: its parent's run id


@dataclass
class _Unit:
    """One profiled run to compare: a job's variant (``variant``: the nested run's name) or a
    plain run; ``job``: the top-level run it belongs to, when known."""

    run_id: str
    variant: str | None = None
    run: Any = None
    job: Any = None


def _search(client: Any, experiment_id: str, filter_string: str = "") -> Iterator[Any]:
    """Every active run of the experiment matching ``filter_string``, newest first (paged)."""
    token = None
    while True:
        page = client.search_runs(
            [experiment_id],
            filter_string,
            order_by=["attributes.start_time DESC"],
            max_results=1000,
            page_token=token,
        )
        yield from page
        token = page.token
        if not token:
            return


def _variants(client: Any, parent: Any) -> list[_Unit]:
    """The nested runs of ``parent`` that have profile metrics, oldest first: its variants."""
    from neuron_mlflow.sinks.profiles import profile_prefixes

    found = _search(
        client, parent.info.experiment_id, f"tags.`{PARENT_TAG}` = '{parent.info.run_id}'"
    )
    children = sorted(
        (r for r in found if profile_prefixes(r.data.metrics)),
        key=lambda r: (r.info.start_time or 0, r.info.run_name or ""),
    )
    return [
        _Unit(r.info.run_id, r.info.run_name or r.info.run_id, run=r, job=parent) for r in children
    ]


def _pick_jobs(client: Any, experiment: str, last: int) -> list[list[_Unit]]:
    """The ``last`` most recent jobs of ``experiment``, oldest first, each as its units (a
    parent's variants, or a profiled top-level run alone)."""
    from neuron_mlflow.errors import CompareError
    from neuron_mlflow.sinks.profiles import profile_prefixes

    found = client.get_experiment_by_name(experiment)
    if found is None:
        names = [e.name for e in client.search_experiments(max_results=11)]
        listed = ", ".join(names[:10]) + (", ..." if len(names) > 10 else "")
        raise CompareError(
            f"experiment {experiment!r} was not found at {client.tracking_uri}; "
            f"the experiments: {listed}"
        )
    jobs: list[list[_Unit]] = []
    for run in _search(client, found.experiment_id):
        if len(jobs) == last:
            break
        if PARENT_TAG in run.data.tags:
            continue
        variants = _variants(client, run)
        if variants:
            jobs.append(variants)
        elif profile_prefixes(run.data.metrics):
            jobs.append([_Unit(run.info.run_id, run=run, job=run)])
    if not jobs:
        raise CompareError(f"experiment {experiment!r} has no runs with profile metrics")
    return list(reversed(jobs))


def _expand(client: Any, run_ids: Sequence[str]) -> list[_Unit]:
    """The runs given by hand, a job's parent run replaced by its variants."""
    from mlflow.exceptions import MlflowException

    from neuron_mlflow.sinks.profiles import is_not_found

    units: list[_Unit] = []
    for run_id in run_ids:
        try:
            run = client.get_run(run_id)
        except MlflowException as exc:
            if not is_not_found(exc):
                raise
            units.append(_Unit(run_id))  # unknown: load_profile says so
            continue
        units += _variants(client, run) or [_Unit(run_id, run=run, job=run)]
    return units


def _group(units: Sequence[_Unit]) -> list[tuple[str | None, list[str]]]:
    """Sides in first-seen order: a variant's runs pooled under its name; a plain run alone."""
    sides: list[tuple[str | None, list[str]]] = []
    pooled: dict[str, list[str]] = {}
    for unit in units:
        if unit.variant is None:
            sides.append((None, [unit.run_id]))
        elif unit.variant not in pooled:
            pooled[unit.variant] = [unit.run_id]
            sides.append((unit.variant, pooled[unit.variant]))
        elif unit.run_id not in pooled[unit.variant]:
            pooled[unit.variant].append(unit.run_id)
    return sides


def _split(units: Sequence[_Unit], key: str) -> list[tuple[str | None, list[str]]]:
    """``--split-by KEY``: the runs grouped by KEY's value (the run's tag or param, else its
    job's), a job's variants apart; the oldest job's group first."""
    from neuron_mlflow.errors import CompareError

    groups: dict[tuple[str, str | None], list[str]] = {}
    for unit in units:
        value = None
        for run in (unit.run, unit.job):
            if run is not None and value is None:
                value = run.data.tags.get(key, run.data.params.get(key))
        if value is None:
            raise CompareError(f"run {unit.run_id!r} has no tag or param {key!r}")
        groups.setdefault((value, unit.variant), []).append(unit.run_id)
    if len({value for value, _ in groups}) < 2:
        raise CompareError(f"--split-by {key}: the runs share one value")
    return [
        (f"{key}={value}"[:60] + (f" {variant}" if variant else ""), ids)
        for (value, variant), ids in groups.items()
    ]


def _sides(args: argparse.Namespace, client: Any) -> list[tuple[str | None, list[str]]]:
    """The sides to compare, baseline first: (label for a group, run ids)."""
    from neuron_mlflow.errors import CompareError

    units = _expand(client, args.run_ids)
    if args.experiment is not None:
        picked = [u for job in _pick_jobs(client, args.experiment, args.last) for u in job]
        if args.split_by:
            return _split(picked, args.split_by)
        given = {u.run_id for u in units}
        units += [u for u in picked if u.run_id not in given]
    if not args.baseline:
        return _group(units)
    base = _expand(client, args.baseline)
    first = base[0].variant
    if first is not None:  # a job's parent (or a variant's run): its first variant
        rest = [u for u in base if u.variant != first]
        base = [u for u in base if u.variant == first]
        if not units:  # no RUN_ID: the baseline job's other variants are the candidates
            units = rest
    taken = {u.run_id for u in base}
    candidates = [u for u in units if u.run_id not in taken] or units
    if not candidates:
        raise CompareError("give the candidate run(s) besides --baseline")
    ids = [u.run_id for u in base]
    label = first if first is not None else ("baseline" if len(ids) > 1 else None)
    plain = [u.run_id for u in candidates if u.variant is None]
    sides: list[tuple[str | None, list[str]]] = [(label, ids)]
    if plain:
        sides.append(("candidate" if len(plain) > 1 else None, plain))
    return sides + _group([u for u in candidates if u.variant is not None])


def _bad_compare_options(args: argparse.Namespace) -> str | None:
    """What is wrong with compare's options (the value and what is allowed), or None."""
    if args.top < 1:
        return f"--top {args.top}: give N >= 1 (the ops shown)"
    if args.fail_above is not None and not args.fail_above >= 0:
        return f"--fail-above {args.fail_above:g}: give PCT >= 0 (a percentage)"
    if args.last is not None and args.last < 1:
        return f"--last {args.last}: give K >= 1 (the jobs compared)"
    if (args.experiment is None) != (args.last is None):
        given = "--experiment" if args.experiment is not None else "--last"
        return f"{given} without its partner: --experiment NAME and --last K go together"
    if args.split_by and args.experiment is None:
        return f"--split-by {args.split_by}: goes with --experiment NAME --last K"
    if args.html:
        return _html_problem(Path(args.html))
    return None


def _compare(args: argparse.Namespace) -> int:
    if bad := _bad_compare_options(args):
        return fail("compare", bad, EXIT_USAGE)
    return reading_mlflow("compare", lambda client: _compare_runs(args, client))


def _compare_runs(args: argparse.Namespace, client: Any) -> int:
    from neuron_mlflow.sinks.comparison_files import publish_comparison
    from neuron_mlflow.sinks.profiles import existing_run, load_profiles
    from neuron_mlflow.summary.comparison import (
        RunProfile,
        compare_profiles,
        group_profiles,
        regressions,
        undecided,
        undecided_advice,
    )

    if args.log_to:  # before any work, as a bad --baseline
        existing_run(client, args.log_to, "--log-to: run")
    sides = _sides(args, client)
    if len(sides) < 2:
        found = f" (found: {', '.join(i[:8] for _, ids in sides for i in ids)})" if sides else ""
        return fail(
            "compare",
            "give at least two runs or variants to compare (RUN_ID..., a job's parent run, "
            f"or --experiment NAME --last K){found}",
            EXIT_USAGE,
        )
    loaded = load_profiles(client, (r for _, ids in sides for r in ids), args.prefix)
    profiles: list[RunProfile] = []
    for label, ids in sides:
        profile = group_profiles([loaded[r] for r in ids], label)
        if profile.run_id in {p.run_id for p in profiles}:  # the same run twice: keep rows apart
            profile = replace(profile, run_id=f"{profile.run_id}#{len(profiles) + 1}")
        profiles.append(profile)
    comparison = compare_profiles(
        profiles, baseline=profiles[0].run_id, top=args.top, margin_pct=args.fail_above
    )
    if args.format != "json":  # JSON names them in "runs"
        for number, side in enumerate(comparison.runs):
            ids = side.run_ids or [side.run_id]
            runs = f"{'run' if len(ids) == 1 else 'runs'} {', '.join(i[:8] for i in ids)}"
            mark = " (baseline)" if number == 0 else ""
            print(f"compared: {side.name}{mark} = {runs}", file=sys.stderr)
    print(comparison.render(args.format), end="")
    if args.html or args.log_to:
        html_path = Path(args.html) if args.html else None
        for item in publish_comparison(comparison, html_path, args.log_to, args.fail_above, client):
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
            return fail(
                "compare",
                f"insufficient data for --fail-above {args.fail_above:g} (exit "
                f"{EXIT_INSUFFICIENT}): {undecided_advice(comparison)}; --allow-insufficient "
                "exits 0 instead",
                EXIT_INSUFFICIENT,
            )
    return EXIT_OK


def _sync(args: argparse.Namespace) -> int:
    from neuron_mlflow.config import ProfilerConfig
    from neuron_mlflow.engine.sync import sync_pending

    local_dir = args.local_dir or str(ProfilerConfig().local_dir)
    exists, made = Path(local_dir).exists(), Path(local_dir).is_dir()
    if (exists and not made) or (args.local_dir and not exists):  # the default may not exist
        why = "it is not a folder" if exists else "it does not exist"
        return fail("sync", f"--local-dir {local_dir}: not a spool folder ({why})", EXIT_USAGE)
    try:
        report = sync_pending(local_dir, include_incomplete=args.include_incomplete)
    except ConnectionError as exc:
        code = fail("sync", f"{exc}; nothing was uploaded", EXIT_FAILURE)
    else:
        code = _sync_report(report, local_dir, made)
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


def _sync_report(report: SyncReport, local_dir: str, made: bool) -> int:
    for path in report.skipped:
        print(f"skipped (incomplete): {path}", file=sys.stderr)
    for path in report.busy:
        print(f"skipped (a worker process is still uploading it): {path}", file=sys.stderr)
    if not report.uploaded and not report.failed and report.busy:
        print("nothing to upload now: a worker process is uploading every pending window")
        return EXIT_OK
    if not report.uploaded and not report.failed:
        where = f"in {local_dir}" if made else f"(no spool at {local_dir}; --local-dir names one)"
        print(f"nothing to upload: no pending windows {where}")
        return EXIT_OK
    import mlflow

    uri = mlflow.get_tracking_uri()
    for path, run_id in report.uploaded:
        print(f"uploaded {path} -> run {run_id} at {uri}")
    for path, error in report.failed:
        print(f"failed {path}: {error}", file=sys.stderr)
    return EXIT_FAILURE if report.failed else EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default: ``sys.argv[1:]``); return the exit code."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["run"]:  # its options and the command are its own (cli/run.py)
        from neuron_mlflow.cli.run import run_command

        return run_command(arguments[1:])
    parser = build_parser()
    try:
        args, unknown = parser.parse_known_args(arguments)
        if unknown:
            args.verb_parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    except SystemExit as exc:
        return EXIT_OK if exc.code in (0, None) else EXIT_USAGE
    if args.verb == "capture":
        from neuron_mlflow.cli.capture import run_capture

        return run_capture(args)
    verbs = {
        "sync": _sync,
        "compare": _compare,
        "download": _download,
        "summarize": _summarize,
        "ingest": _ingest,
    }
    return verbs[args.verb](args)
