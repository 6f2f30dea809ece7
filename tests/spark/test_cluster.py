"""The standalone-cluster recipe of docs/spark.md ("Credentials on a cluster"), run for real: a
master and one worker started from PySpark's own install (``spark-class``), SQL-only users
(``spark-sql -f``: no Python code, no register() call — the source is found as the installed
``pyspark_tierd`` module), a table on S3 (moto).

The driver has credentials in its environment, the worker none. A table that relies on the
default credential chain must fail with the message that names the fix; one whose executors get
credentials through ``spark.executorEnv.*`` (a credentials file, the profile named in the
table's storage_options) must read every message. One application runs both, the failing query last
(each spark-sql start costs ~30 s here).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tierd.testing.s3server import create_bucket, free_port

from ..tiered.conftest import cold_config
from .conftest import SEGMENT, messages, produce

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tierd.testing.s3server import S3Server

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow


def _clean_env(tmp: Path) -> dict[str, str]:
    """No AWS credentials from anywhere, PySpark's Python = this venv's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "TIERD_", "SPARK_", "PYSPARK_"))}
    env.update(
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        AWS_CONFIG_FILE=str(tmp / "no-aws-config"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp / "no-aws-credentials"),
        AWS_EC2_METADATA_DISABLED="true",
        SPARK_LOG_DIR=str(tmp / "logs"),
    )
    return env


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[str]:
    """``spark://127.0.0.1:PORT`` with one worker (1 core) that has no credentials."""
    env = _clean_env(tmp_path)
    port, ui = free_port(), free_port()
    procs: list[subprocess.Popen[bytes]] = []
    logs = tmp_path / "logs"
    logs.mkdir()
    try:
        with (logs / "master.out").open("wb") as out:
            procs.append(
                subprocess.Popen(
                    [str(BIN / "spark-class"), "org.apache.spark.deploy.master.Master",
                     "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui)],
                    env=env, stdout=out, stderr=subprocess.STDOUT,
                )
            )  # fmt: skip
        master = f"spark://127.0.0.1:{port}"
        with (logs / "worker.out").open("wb") as out:
            procs.append(
                subprocess.Popen(
                    [str(BIN / "spark-class"), "org.apache.spark.deploy.worker.Worker", master,
                     "--host", "127.0.0.1", "--cores", "1", "--memory", "1g",
                     "--webui-port", str(free_port()), "--work-dir", str(tmp_path / "work")],
                    env=env, stdout=out, stderr=subprocess.STDOUT,
                )
            )  # fmt: skip
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=2) as r:
                    if json.load(r).get("aliveworkers", 0) >= 1:
                        break
            except (OSError, ValueError):
                # Not listening yet, or (seen in CI) the UI answering before its status page
                # has a body: an empty reply is not JSON. Both mean "not up yet".
                pass
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                tails = {f.name: f.read_text()[-2000:] for f in logs.glob("*.out")}
                raise AssertionError(f"standalone cluster did not come up: {tails}")
            time.sleep(0.2)  # polling the master's status with a deadline
        yield master
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in reversed(procs):
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)


def _spark_sql(
    master: str, workdir: Path, sql: str, env: dict[str, str], *conf: str
) -> subprocess.CompletedProcess[str]:
    script = workdir / "query.sql"
    script.write_text(sql)
    args = [str(BIN / "spark-sql"), "--master", master, "--conf", "spark.ui.enabled=false"]
    args += [
        "--conf",
        "spark.task.maxFailures=1",
        "--conf",
        f"spark.sql.warehouse.dir={workdir / 'warehouse'}",
    ]
    for c in conf:
        args += ["--conf", c]
    return subprocess.run(
        [*args, "-f", str(script)],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def test_the_standalone_cluster_recipe(cluster: str, moto_server: S3Server, tmp_path: Path) -> None:
    url = f"s3://{create_bucket(moto_server)}/cold"
    cfg = cold_config(
        tmp_path / "store",
        {"name": "s3", "url": url, "storage_options": moto_server.storage_options},
        **SEGMENT,
    )
    produced = produce(cfg, [messages(0, 150), messages(150, 50)])
    # A credentials file with one profile, on every node (here: one file); no default profile.
    creds = tmp_path / "aws-credentials"
    creds.write_text(
        f"[tierd]\naws_access_key_id = {moto_server.access_key}\n"
        f"aws_secret_access_key = {moto_server.secret_key}\n"
    )
    driver_env = _clean_env(tmp_path)
    driver_env.update(
        # The driver: credentials in its environment (default chain) and the profile's file.
        AWS_ACCESS_KEY_ID=moto_server.access_key,
        AWS_SECRET_ACCESS_KEY=moto_server.secret_key,
        AWS_DEFAULT_REGION="us-east-1",
        AWS_SHARED_CREDENTIALS_FILE=str(creds),
        # What `pip install tierd[spark]` gives: pyspark_tierd on the path (here: the checkout).
        PYTHONPATH=str(REPO),
    )
    work = tmp_path / "sql"
    work.mkdir()
    endpoint = moto_server.endpoint_url
    table = "CREATE TABLE {name} USING tierd OPTIONS (storage_options '{so}') LOCATION '{url}';\n"
    sql = (
        # The executors' environment points at the credentials file; the table names the profile.
        table.format(
            name="profile_creds", so=json.dumps({"endpoint_url": endpoint, "profile": "tierd"}), url=url
        )
        + "SELECT concat('profile_creds=', count(*)) FROM profile_creds;\n"
        # Executors have no credentials of their own for this one: the driver's do not travel.
        + table.format(name="env_creds", so=json.dumps({"endpoint_url": endpoint}), url=url)
        + "SELECT concat('env_creds=', count(*)) FROM env_creds;\n"
    )
    run = _spark_sql(
        cluster,
        work,
        sql,
        driver_env,
        f"spark.executorEnv.AWS_SHARED_CREDENTIALS_FILE={creds}",
        "spark.executorEnv.AWS_DEFAULT_REGION=us-east-1",
    )
    out = run.stdout + run.stderr
    # SQL-only: USING tierd resolved with no Python code; the query without executor
    # credentials failed naming the fix.
    assert "NoCredentialsError" in out, out[-4000:]
    assert "The driver planned this read with credentials from 'env'" in out, out[-4000:]
    assert "spark.executorEnv.AWS_ACCESS_KEY_ID" in out, out[-4000:]
    assert "env_creds=" not in run.stdout
    assert f"profile_creds={len(produced.messages)}" in run.stdout, out[-4000:]
