"""``neuron-mlflow run [options] -- COMMAND [ARGS...]``: any command, profiled, unedited.

``nm.autolog()`` reaches every Python process of the command through a ``sitecustomize`` put
first on ``PYTHONPATH``, its options as ``NEURON_MLFLOW_*`` variables: docs/autolog.md,
"neuron-mlflow run".

Example:
    >>> run_command(["--backend", "tpu", "--", "true"])
    2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import types
import typing
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn
from unittest import mock

from pydantic import BaseModel

from neuron_mlflow.cli.app import EXIT_USAGE, fail, folder_problem
from neuron_mlflow.config import CONFIG_FILE_ENV, ENV_PREFIX, ProfilerConfig, config_file_problem
from neuron_mlflow.engine.options import JOB_ID_ENV, RUN_ID_ENV
from neuron_mlflow.integrations.autolog import AUTOLOG_ENV, NOTHING_PROFILED, REPORTS_ENV

SITE_DIR = Path(__file__).resolve().parent / "site"  # put first on the command's PYTHONPATH

FORWARDED = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")  # to its group

EXIT_CANNOT_RUN = 126
EXIT_NOT_FOUND = 127


@dataclass(frozen=True)
class FieldOption:
    """One ``ProfilerConfig`` field as an option of ``run``."""

    path: tuple[str, ...]  # ("schedule", "warmup")
    kind: str  # "bool", "list" or "value"
    help: str

    @property
    def flag(self) -> str:
        return "--" + ".".join(part.replace("_", "-") for part in self.path)

    @property
    def dest(self) -> str:
        return "field:" + ".".join(self.path)

    @property
    def env(self) -> str:
        return ENV_PREFIX + "__".join(self.path).upper()

    def env_value(self, value: str) -> str:
        """The variable's value: a list as JSON (``device,runtime`` -> ``["device", ...]``)."""
        if self.kind == "list" and not value.lstrip().startswith("["):
            return json.dumps([part.strip() for part in value.split(",") if part.strip()])
        return value


def _kind(members: tuple[Any, ...]) -> str:
    args = tuple(a for a in members if a is not type(None))
    if args == (bool,):
        return "bool"
    if any(typing.get_origin(a) in (tuple, list, set, frozenset) for a in args):
        return "list"
    return "value"


def _literal_values(annotation: Any) -> list[str]:
    """The values a ``Literal`` field (or a tuple of them) allows, for the help."""
    if typing.get_origin(annotation) is typing.Literal:
        return [str(value) for value in typing.get_args(annotation)]
    return [v for arg in typing.get_args(annotation) for v in _literal_values(arg)]


def field_options(
    model: type[Any] | None = None, prefix: tuple[str, ...] = ()
) -> list[FieldOption]:
    """Every leaf field of ``ProfilerConfig`` (nested models walked) as an option.

    Example:
        >>> [o.flag for o in field_options()][:3]
        ['--backend', '--schedule.skip-first', '--schedule.wait']
        >>> [o.env for o in field_options() if o.flag == "--schedule.warmup"]
        ['NEURON_MLFLOW_SCHEDULE__WARMUP']
    """
    options = []
    for name, info in (model or ProfilerConfig).model_fields.items():
        union = typing.get_origin(info.annotation) in (typing.Union, types.UnionType)
        members = typing.get_args(info.annotation) if union else (info.annotation,)
        nested = [m for m in members if isinstance(m, type) and issubclass(m, BaseModel)]
        if nested:
            options.extend(field_options(nested[0], (*prefix, name)))
        else:
            text = (info.description or "").replace("%", "%%")
            allowed = ", ".join(_literal_values(info.annotation))
            text += f" ({allowed})" if allowed else ""
            options.append(FieldOption((*prefix, name), _kind(members), text))
    return options


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line (the option, the value, what is allowed), exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"neuron-mlflow run: {message} (see `neuron-mlflow run --help`)\n")


def build_run_parser(options: Sequence[FieldOption]) -> argparse.ArgumentParser:
    parser = _Parser(
        prog="neuron-mlflow run",
        usage="neuron-mlflow run [options] -- COMMAND [ARGS...]",
        description=(
            "Run COMMAND with autolog in every Python process it starts (torchrun's workers "
            "included), without editing it: every optimizer.step() of a plain loop ends one "
            "step, Lightning and Hugging Face Trainers get their callbacks. One MLflow run for "
            "the whole command. Options are ProfilerConfig fields (the names of the YAML file "
            "and of the NEURON_MLFLOW_* variables: --schedule.warmup is "
            "NEURON_MLFLOW_SCHEDULE__WARMUP); unset ones come from the environment, then "
            "--config. Exit code: the command's."
        ),
        epilog="Lists: comma-separated or JSON. Flags: --keep-local alone means true.",
    )
    parser.add_argument(
        "--experiment",
        metavar="NAME",
        help="MLflow experiment of the run (created if missing); the same setting as "
        "--experiment-name, and the one kept if both are given",
    )
    parser.add_argument(
        "--config", metavar="FILE", help="YAML file of ProfilerConfig fields (NEURON_MLFLOW_CONFIG)"
    )
    for option in options:
        text = option.help
        if option.path == ("experiment_name",):
            text += " (the same setting as --experiment)"
        parser.add_argument(option.flag, dest=option.dest, metavar="VALUE", help=text)
        underscored = "--" + ".".join(option.path)
        if underscored != option.flag:  # --local_dir as in YAML works too
            parser.add_argument(underscored, dest=option.dest, help=argparse.SUPPRESS)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command and its arguments")
    return parser


def _config_env(args: argparse.Namespace, options: Sequence[FieldOption]) -> dict[str, str]:
    env: dict[str, str] = {}
    for option in options:
        value = getattr(args, option.dest)
        if value is not None:
            env[option.env] = option.env_value(value)
    if args.experiment is not None:
        env["NEURON_MLFLOW_EXPERIMENT_NAME"] = args.experiment
    if args.config is not None:
        env[CONFIG_FILE_ENV] = str(Path(args.config).absolute())
    return env


def _checked_config(
    args: argparse.Namespace, options: Sequence[FieldOption]
) -> tuple[dict[str, str], ProfilerConfig] | str:
    """The variables and the ``ProfilerConfig`` the command's processes will read, or why
    there are none (one line naming the option, the value and what is allowed)."""
    if args.config is not None:  # named as the user gave it, not as the variable it becomes
        problem = config_file_problem(args.config, "--config")
        if problem is not None:
            return problem
    env = _config_env(args, options)
    try:
        with mock.patch.dict(os.environ, env):
            config = ProfilerConfig()
        if config.backend != "auto":  # fail now, not in every process
            from neuron_mlflow.capture.backends import resolve_backend

            resolve_backend(config.backend, config)
    except Exception as exc:
        return _problem(exc)
    flag = "local_dir" if getattr(args, "field:local_dir") is None else "--local-dir"
    return folder_problem(flag, Path(config.local_dir)) or (env, config)


def _problem(exc: Exception) -> str:
    """One line: each bad option with its value and what is allowed."""
    errors = getattr(exc, "errors", None)
    if not isinstance(errors, list) or not errors:
        return " ".join(str(exc).split())
    options = sorted(field_options(), key=lambda o: -len(o.path))
    parts = []
    for error in errors:
        loc = tuple(str(part) for part in error.get("loc", ()))
        named = [o for o in options if loc[: len(o.path)] == o.path]
        where = named[0].flag if named else ".".join(loc) or "options"
        parts.append(f"{where} {error.get('input')!r}: {error.get('msg')}")
    return "; ".join(dict.fromkeys(parts))


@dataclass
class _Run:
    """The MLflow run the verb made for the command (``None`` id: no server)."""

    tracking_uri: str
    run_id: str | None
    created: bool


def _open_run(config: ProfilerConfig, command: Sequence[str], job_id: str) -> _Run:
    """The run of the command: ``MLFLOW_RUN_ID`` when the caller set one, else a new run."""
    import mlflow

    from neuron_mlflow.naming import JOB_TAG
    from neuron_mlflow.sinks.mlflow_sink import MlflowSink

    uri = mlflow.get_tracking_uri()
    given = os.environ.get(RUN_ID_ENV)
    if given:
        return _Run(uri, given, created=False)
    sink = MlflowSink()
    try:
        sink.check_reachable()
        tags = {JOB_TAG: job_id, "neuron_mlflow.command": shlex.join(command)[:4000]}
        run_id = sink.create_run(config.experiment_name, config.run_name, tags, running=True)
    except Exception as exc:
        print(
            f"neuron-mlflow run: could not create an MLflow run at {uri} ({type(exc).__name__}: "
            f"{' '.join(str(exc).split())[:300]}); each process keeps its windows in the spool for "
            "`neuron-mlflow sync` (one job)",
            file=sys.stderr,
        )
        return _Run(uri, None, created=False)
    return _Run(uri, run_id, created=True)


def _end_run(run: _Run, status: str) -> None:
    from mlflow import MlflowClient

    if run.created and run.run_id is not None:
        with contextlib.suppress(Exception):
            MlflowClient(run.tracking_uri).set_terminated(run.run_id, status)


def _child_env(config_env: dict[str, str], run: _Run, job_id: str, reports: str) -> dict[str, str]:
    env = {**os.environ, **config_env}
    env[AUTOLOG_ENV] = "1"
    env[REPORTS_ENV] = reports
    env[JOB_ID_ENV] = job_id
    env["MLFLOW_TRACKING_URI"] = run.tracking_uri
    if run.run_id is not None:
        env[RUN_ID_ENV] = run.run_id
    paths = [str(SITE_DIR), *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


@contextlib.contextmanager
def _forwarding(child: subprocess.Popen[bytes]) -> Iterator[None]:
    """While the command runs, the signals in :data:`FORWARDED` go to its process group."""

    def forward(signum: int, frame: Any) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signum)

    previous = {}
    for number in (signal.Signals[name] for name in FORWARDED):
        with contextlib.suppress(ValueError, OSError):  # not the main thread
            previous[number] = signal.signal(number, forward)
    try:
        yield
    finally:
        for number, handler in previous.items():
            with contextlib.suppress(ValueError, OSError, TypeError):
                signal.signal(number, handler)


BOOL_WORDS = {"true", "false", "1", "0", "yes", "no", "on", "off", "t", "f", "y", "n"}


def _flags_alone(argv: Sequence[str], options: Sequence[FieldOption]) -> list[str]:
    """``--keep-local`` alone becomes ``--keep-local=true``, so that the command after it
    (``neuron-mlflow run --keep-local python train.py``) is not read as its value; only the
    verb's own options are looked at, never the command's.

    Example:
        >>> _flags_alone(["--keep-local", "python", "--keep-local"], field_options())
        ['--keep-local=true', 'python', '--keep-local']
        >>> _flags_alone(["--keep-local", "no", "--top-k", "5", "x"], field_options())
        ['--keep-local', 'no', '--top-k', '5', 'x']
    """
    bools = [option for option in options if option.kind == "bool"]
    flags = {flag for o in bools for flag in (o.flag, "--" + ".".join(o.path))}
    out = list(argv)
    i = 0
    while i < len(out):
        token = out[i]
        if token == "--" or not token.startswith("-"):
            break  # the command starts here
        if "=" in token or token in ("-h", "--help"):
            i += 1
        elif token in flags:
            if i + 1 < len(out) and out[i + 1].lower() in BOOL_WORDS:
                i += 2
            else:
                out[i] = f"{token}=true"
                i += 1
        else:  # an option with a value (an unknown one: argparse says so)
            i += 2
    return out


def run_command(argv: Sequence[str]) -> int:
    """``neuron-mlflow run ARGV``: run the command, return its exit code (see the module)."""
    options = field_options()
    parser = build_run_parser(options)
    try:
        args = parser.parse_args(_flags_alone(argv, options))
    except SystemExit as exc:
        return int(exc.code or 0) if isinstance(exc.code, int) else EXIT_USAGE
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        return fail(
            "run",
            "no command: give one after `--` (neuron-mlflow run [options] -- COMMAND [ARGS...])",
            EXIT_USAGE,
        )
    checked = _checked_config(args, options)
    if isinstance(checked, str):  # before a run is made or the command starts
        return fail("run", checked, EXIT_USAGE)
    config_env, config = checked
    if shutil.which(command[0]) is None and not Path(command[0]).exists():
        return fail("run", f"command not found: {command[0]}", EXIT_NOT_FOUND)
    job_id = uuid.uuid4().hex
    with mock.patch.dict(os.environ, config_env):
        run = _open_run(config, command, job_id)
    if run.run_id is not None:
        print(f"neuron-mlflow run: run {run.run_id} at {run.tracking_uri} (on demand: "
              f"neuron-mlflow capture {run.run_id})", file=sys.stderr)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="neuron-mlflow-run-") as reports:
        env = _child_env(config_env, run, job_id, reports)
        try:
            child = subprocess.Popen(command, env=env, start_new_session=True)
        except OSError as exc:
            _end_run(run, "FAILED")
            return fail("run", f"cannot run {command[0]}: {exc}", EXIT_CANNOT_RUN)
        with _forwarding(child):
            code = child.wait()
        signalled = code < 0
        if not signalled and not any(Path(reports).iterdir()):  # (autolog's REPORTS_ENV)
            print(f"neuron-mlflow run: warning: in `{shlex.join(command)}`, "
                  f"{NOTHING_PROFILED}", file=sys.stderr)  # fmt: skip
    _end_run(run, "FINISHED" if code == 0 else "KILLED" if signalled else "FAILED")
    return 128 - code if signalled else code
