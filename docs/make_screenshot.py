"""Make docs/mlflow-compare.png: the MLflow UI's compare view of `mlflow run . -e rmsnorm`.

Runs the rmsnorm entry point into a fresh SQLite store, serves it with a real `mlflow server`,
and takes a screenshot of the compare page of the three variant runs with headless Chromium
(Debian package `chromium`).

Run:  .venv/bin/python docs/make_screenshot.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mlflow import MlflowClient  # noqa: E402

from tests.conftest import running_mlflow_server  # noqa: E402


def main() -> None:
    work = Path(tempfile.mkdtemp())
    uri = f"sqlite:///{work / 'mlflow.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env.update(MLFLOW_TRACKING_URI=uri, PATH=f"{Path(sys.executable).parent}:{env['PATH']}")
    subprocess.run(
        [
            sys.executable,
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
            "-P",
            "rows=256",
            "-P",
            "hidden=1024",
            "-P",
            "backend=cpu",
        ],
        check=True,
        env=env,
        cwd=work,
    )
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("rmsnorm")
    children = [
        r.info.run_id
        for r in client.search_runs([experiment.experiment_id])
        if "mlflow.parentRunId" in r.data.tags
    ]
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
