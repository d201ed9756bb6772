"""A throwaway PostgreSQL cluster for the load test: ``initdb`` + ``pg_ctl`` in a temp folder.

PostgreSQL refuses to run as root, so as root the cluster belongs to an unprivileged user
(``postgres`` when it exists, else ``nobody``) and the tools run through ``runuser``.
Without the binaries the fixture skips, unless ``NEURON_MLFLOW_REQUIRE_SYSTEM_TOOLS=1`` (CI).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import free_port


def _tool(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


def _missing(what: str) -> None:
    if os.environ.get("NEURON_MLFLOW_REQUIRE_SYSTEM_TOOLS") == "1":
        pytest.fail(f"{what}; CI installs postgresql (see .ci/run)")
    pytest.skip(what)


def _as_user(user: str | None, args: list[str], **kwargs) -> subprocess.CompletedProcess:
    command = ["runuser", "-u", user, "--", *args] if user else args
    return subprocess.run(command, check=True, capture_output=True, text=True, **kwargs)


@contextlib.contextmanager
def postgres_cluster() -> Iterator[str]:
    """Start a PostgreSQL cluster on a free localhost port; yield a SQLAlchemy URI of a new
    database ``mlflow`` (user ``mlflow``, trust authentication); stop and remove it after."""
    initdb, pg_ctl = _tool("initdb"), _tool("pg_ctl")
    if not initdb or not pg_ctl:
        _missing("PostgreSQL's initdb/pg_ctl are not installed")
    user = None
    if os.geteuid() == 0:
        user = "postgres"
        try:
            pwd.getpwnam(user)
        except KeyError:
            user = "nobody"
    # Not under pytest's tmp folder: that one is private to root (mode 700).
    root = Path(tempfile.mkdtemp(prefix="neuron-mlflow-pg-"))
    root.chmod(0o755)
    data, sockets = root / "data", root / "sockets"
    sockets.mkdir()
    if user:
        shutil.chown(root, user)
        shutil.chown(sockets, user)
    port = free_port()
    _as_user(user, [initdb, "-D", str(data), "-U", "mlflow", "-A", "trust", "-E", "UTF8"])
    options = f"-p {port} -k {sockets} -c listen_addresses=127.0.0.1 -c max_connections=200"
    _as_user(
        user, [pg_ctl, "-D", str(data), "-o", options, "-l", str(root / "pg.log"), "-w", "start"]
    )
    try:
        import psycopg2

        deadline = time.monotonic() + 60
        while True:
            try:
                conn = psycopg2.connect(
                    host="127.0.0.1", port=port, user="mlflow", dbname="postgres"
                )
                break
            except psycopg2.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        conn.autocommit = True
        with conn.cursor() as cursor:
            cursor.execute("CREATE DATABASE mlflow")
        conn.close()
        yield f"postgresql+psycopg2://mlflow@127.0.0.1:{port}/mlflow"
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            _as_user(user, [pg_ctl, "-D", str(data), "-m", "fast", "-w", "stop"])
        shutil.rmtree(root, ignore_errors=True)
