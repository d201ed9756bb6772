"""Write a comparison's ``comparison.html`` (and log it with ``comparison.md`` into a run).

What ``neuron-mlflow compare --html PATH --log-to RUN`` does after comparing.

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> from neuron_mlflow.summary.comparison import RunProfile, compare_profiles
    >>> a = RunProfile("a", "naive", "p", {"cpu_time_us": 125.0}, {})
    >>> b = RunProfile("b", "fused", "p", {"cpu_time_us": 48.0}, {})
    >>> path = Path(tempfile.mkdtemp()) / "comparison.html"
    >>> publish_comparison(compare_profiles([a, b]), html_path=path) == [str(path)]
    True
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from neuron_mlflow.errors import CompareError
from neuron_mlflow.naming import COMPARISON_HTML, COMPARISON_MARKDOWN
from neuron_mlflow.sinks.profiles import existing_run
from neuron_mlflow.summary.comparison import Comparison, render_seed_markdown
from neuron_mlflow.summary.comparison_html import render_comparison_html


def publish_comparison(
    comparison: Comparison,
    html_path: Path | None = None,
    log_to: str | None = None,
    fail_above_pct: float | None = None,
    client: Any = None,
) -> list[str]:
    """Write ``comparison.html`` to ``html_path`` and/or log it and ``comparison.md`` as
    artifacts of run ``log_to`` (at the root of its artifacts).

    Args:
        comparison: the comparison.
        html_path: where to write the page, if anywhere.
        log_to: the run that gets both files, if any.
        fail_above_pct: the ``--fail-above`` limit, for the verdict on the page.
        client: an ``MlflowClient`` (default: a new one for the current tracking URI).

    Returns:
        What was written: the file path and/or ``runs:/<run>/comparison.html``.

    Raises:
        CompareError: ``html_path`` cannot be written (a folder; its folder cannot be made),
            or ``log_to`` is not a run of the tracking server.
        MlflowException: MLflow failed otherwise.
    """
    page = render_comparison_html(comparison, fail_above_pct=fail_above_pct)
    done = []
    if html_path is not None:
        try:
            html_path.parent.mkdir(parents=True, exist_ok=True)
            html_path.write_text(page, encoding="utf-8")
        except OSError as exc:
            why = "it is a folder" if html_path.is_dir() else exc.strerror or type(exc).__name__
            where = "" if exc.filename in (None, str(html_path)) else f": {exc.filename}"
            raise CompareError(f"--html {html_path}: cannot write it ({why}{where})") from exc
        done.append(str(html_path))
    if log_to is not None:
        from mlflow import MlflowClient

        client = client or MlflowClient()
        existing_run(client, log_to, "--log-to: run")
        client.log_text(log_to, render_seed_markdown(comparison), COMPARISON_MARKDOWN)
        client.log_text(log_to, page, COMPARISON_HTML)
        done += [f"runs:/{log_to}/{COMPARISON_MARKDOWN}", f"runs:/{log_to}/{COMPARISON_HTML}"]
    return done
