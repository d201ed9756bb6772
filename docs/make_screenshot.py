"""Make docs/mlflow-compare.png: the MLflow UI's compare view of `mlflow run . -e rmsnorm`.

Runs the rmsnorm entry point into a fresh SQLite store, serves it with a real `mlflow server`,
and takes a screenshot of the compare page of the three variant runs with headless Chromium
(Debian package `chromium`).

Run:  .venv/bin/python docs/make_screenshot.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mlflow import MlflowClient  # noqa: E402

from tests.conftest import running_mlflow_server  # noqa: E402
from tests.helpers import parent_and_children, run_python  # noqa: E402


def main() -> None:
    work = Path(tempfile.mkdtemp())
    uri = f"sqlite:///{work / 'mlflow.db'}"
    params = ["rows=256", "hidden=1024", "backend=cpu"]
    run_python(
        [
            "-m",
            "mlflow",
            "run",
            str(ROOT),
            "-e",
            "rmsnorm",
            "--env-manager",
            "local",
            "--experiment-name",
            "rmsnorm",
            *(a for p in params for a in ("-P", p)),
        ],
        uri,
        cwd=work,
    )
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("rmsnorm")
    children = list(parent_and_children(client, "rmsnorm")[1].values())
    with running_mlflow_server(work, backend_store_uri=uri) as server:
        query = urllib.parse.urlencode(
            {"runs": json.dumps(children), "experiments": json.dumps([experiment.experiment_id])}
        )
        url = f"{server}/#/compare-runs?{query}"
        out = ROOT / "docs" / "mlflow-compare.png"
        subprocess.run(
            [
                "chromium",
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={work / 'chrome'}",
                "--hide-scrollbars",
                "--window-size=1500,3000",
                "--virtual-time-budget=20000",
                f"--screenshot={out}",
                url,
            ],
            check=True,
            timeout=180,
        )
        print(f"wrote {out} from {url}")


if __name__ == "__main__":
    main()
