"""Is the tracking server there? A short check, cached per process and URI (a failure for a
back-off that doubles: docs/spool.md), and MLflow's minutes of HTTP retries bounded for our
calls (:func:`bounded_http`).

For HTTP(S) the check is ``GET <uri>/health``, not a TCP connect (a proxy can accept the
connection and answer 503, or never answer); SQLite, file and SQLAlchemy database stores get
their own; other stores are assumed reachable.

Example:
    >>> import tempfile
    >>> check_reachable(f"sqlite:///{tempfile.mkdtemp()}/mlflow.db")  # no exception: reachable
    >>> try:
    ...     check_reachable("http://127.0.0.1:9/", timeout_s=1)
    ... except ConnectionError as err:
    ...     print(str(err).split(" (")[0])
    cannot connect to the MLflow tracking server at http://127.0.0.1:9/
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

HEALTH_TIMEOUT_S = 3.0  # timeout of one check (seconds)
OK_TTL_S = 30.0  # how long a successful check is trusted (seconds)
FIRST_BACKOFF_S = 5.0  # how long a first failed check is trusted (seconds); doubles
MAX_BACKOFF_S = 300.0  # the longest back-off between two checks (seconds)

HTTP_BOUNDS = {
    "MLFLOW_HTTP_REQUEST_TIMEOUT": 15,
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": 2,
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": 1,
}
"""Upper bounds for MLflow's client HTTP settings during our calls (a user's lower value wins)."""


@dataclass
class _State:
    checked_at: float
    error: str | None
    backoff_s: float


_cache: dict[str, _State] = {}


def _check_http(uri: str, timeout_s: float) -> None:
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout_s) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except urllib.error.URLError as exc:
        raise ConnectionError(getattr(exc.reason, "strerror", None) or str(exc.reason)) from exc
    except TimeoutError as exc:
        raise ConnectionError(f"no answer to GET /health within {timeout_s:g} s") from exc
    except OSError as exc:
        raise ConnectionError(exc.strerror or str(exc)) from exc
    if status != 200:
        raise ConnectionError(f"GET /health answered HTTP {status}")


def _check_sqlite(uri: str, timeout_s: float) -> None:
    path = unquote(uri[len("sqlite:///") :])
    if path in ("", ":memory:"):
        return
    folder = Path(path).parent
    if not folder.is_dir():
        raise ConnectionError(f"the folder of the SQLite store does not exist: {folder}")
    if not Path(path).exists():
        if not os.access(folder, os.W_OK):
            raise ConnectionError(f"cannot create the SQLite store in {folder}")
        return
    try:
        with sqlite3.connect(path, timeout=timeout_s) as conn:
            conn.execute("SELECT 1").fetchone()
    except sqlite3.Error as exc:
        raise ConnectionError(f"cannot open the SQLite store {path}: {exc}") from exc


def _check_database(uri: str, timeout_s: float) -> None:
    import sqlalchemy

    engine = sqlalchemy.create_engine(uri, connect_args={"connect_timeout": max(1, int(timeout_s))})
    try:
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text("SELECT 1"))
    except Exception as exc:
        raise ConnectionError(f"cannot connect to the database store: {exc}") from exc
    finally:
        engine.dispose()


def _check_once(uri: str, timeout_s: float) -> None:
    scheme = urlsplit(uri).scheme.lower()
    if scheme in ("http", "https"):
        _check_http(uri, timeout_s)
    elif scheme == "sqlite":
        _check_sqlite(uri, timeout_s)
    elif scheme.split("+")[0] in ("postgresql", "postgres", "mysql"):
        _check_database(uri, timeout_s)
    elif scheme in ("", "file"):
        root = Path(unquote(urlsplit(uri).path) if scheme == "file" else uri)
        existing = next((p for p in (root, *root.parents) if p.exists()), None)
        if existing is None or not os.access(existing, os.W_OK):
            raise ConnectionError(f"the file store {root} cannot be written")
    # databricks, uc, other plugin stores: their own clients decide.


def check_reachable(uri: str, timeout_s: float | None = None, *, cached: bool = True) -> None:
    """Raise ``ConnectionError`` unless the tracking store at ``uri`` answers (cached).

    Args:
        timeout_s: timeout of the check itself (seconds); default :data:`HEALTH_TIMEOUT_S`.
        cached: ``False`` checks now, ignoring (but updating) the cache.

    Raises:
        ConnectionError: the store is not reachable; the message names the URI and why.

    Example:
        >>> check_reachable("databricks")  # not checked: MLflow's own client decides
    """
    state = _cache.get(uri)  # (one dict operation at a time: no lock needed)
    if cached and state is not None:
        age = time.monotonic() - state.checked_at
        if state.error is None and age < OK_TTL_S:
            return
        if state.error is not None and age < state.backoff_s:
            raise ConnectionError(_message(uri, state.error + ", checked recently"))
    try:
        _check_once(uri, HEALTH_TIMEOUT_S if timeout_s is None else timeout_s)
    except ConnectionError as exc:
        backoff = FIRST_BACKOFF_S if state is None or state.error is None else state.backoff_s * 2
        _cache[uri] = _State(time.monotonic(), str(exc), min(backoff, MAX_BACKOFF_S))
        raise ConnectionError(_message(uri, str(exc))) from exc
    _cache[uri] = _State(time.monotonic(), None, 0.0)


def _message(uri: str, why: str) -> str:
    return f"cannot connect to the MLflow tracking server at {uri} ({why})"


def forget(uri: str | None = None) -> None:
    """Drop the cached answer for ``uri`` (all URIs when ``None``), e.g. before a sync."""
    if uri is None:
        _cache.clear()
    else:
        _cache.pop(uri, None)


_env_lock = threading.RLock()


@contextmanager
def bounded_http() -> Iterator[None]:
    """Cap MLflow's HTTP timeout and retries (:data:`HTTP_BOUNDS`) while the block runs.

    MLflow reads them from ``os.environ`` at each call: they are set there for the block (a
    user's lower value is kept), then restored. Blocks nest and are serialised by a lock.
    """
    with _env_lock:
        saved = {name: os.environ.get(name) for name in HTTP_BOUNDS}
        for name, limit in HTTP_BOUNDS.items():
            try:
                value = min(float(saved[name] or limit), float(limit))
            except ValueError:
                value = float(limit)
            os.environ[name] = str(int(value)) if value.is_integer() else str(value)
        try:
            yield
        finally:
            for name, old in saved.items():
                if old is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = old
