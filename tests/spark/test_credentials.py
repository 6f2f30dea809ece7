"""Credentials on a cluster: planning runs on the driver with its credentials, each executor
reads with its own. An executor without any must fail with a message that names the fix (the
executors' environment, an instance profile, IRSA) and where the driver's came from — not a
botocore stack trace deep in a task.

Driven without Spark (what the planning worker and a task call), with the credentials taken
from the environment: present while planning, gone while reading.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from tierd.errors import CredentialsError
from tierd.spark import storage as storage_module
from tierd.spark.filters import Constraints
from tierd.spark.options import ReadOptions
from tierd.spark.source import SPARK_SCHEMA, plan_partitions, read_partition, select_columns
from tierd.spark.storage import open_storage
from tierd.testing.s3server import create_bucket

from ..tiered.conftest import cold_config
from .conftest import messages, produce

if TYPE_CHECKING:
    from pathlib import Path

    from tierd.testing.s3server import S3Server


def _no_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setattr(storage_module, "_OPEN", {})  # a fresh client: credentials are resolved again


def test_an_executor_without_credentials_is_told_how_to_get_them(
    moto_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"s3://{create_bucket(moto_server)}/cold"
    so = moto_server.storage_options
    produce(cold_config(tmp_path, {"name": "s3", "url": url, "storage_options": so}), [messages(0, 20)])
    opts = ReadOptions.parse(
        {"path": url, "storage_options": json.dumps({"endpoint_url": moto_server.endpoint_url})}
    )
    c = Constraints.from_options(opts)
    # The driver: credentials in its environment.
    _no_credentials(monkeypatch, tmp_path)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", moto_server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", moto_server.secret_key)
    parts = plan_partitions(open_storage(opts.url, opts.storage_options), opts, c)
    assert parts
    assert {p.credentials for p in parts} == {"env"}
    # An executor: none.
    _no_credentials(monkeypatch, tmp_path)
    with pytest.raises(CredentialsError) as e:
        list(read_partition(opts, c, select_columns(SPARK_SCHEMA), parts[0]))
    msg = str(e.value)
    assert "NoCredentialsError" in msg
    assert "The driver planned this read with credentials from 'env'" in msg
    assert "spark.executorEnv.AWS_ACCESS_KEY_ID" in msg
    assert "instance profile" in msg
    assert "IRSA" in msg


def test_a_driver_without_credentials_fails_at_planning_naming_the_fix(
    moto_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_credentials(monkeypatch, tmp_path)
    url = f"s3://{create_bucket(moto_server)}/cold"
    opts = ReadOptions.parse(
        {"path": url, "storage_options": json.dumps({"endpoint_url": moto_server.endpoint_url})}
    )
    with pytest.raises(CredentialsError, match=r"failed on host .*NoCredentialsError.*spark\.executorEnv"):
        plan_partitions(open_storage(opts.url, opts.storage_options), opts, Constraints.from_options(opts))


def test_rejected_credentials_are_credentials_errors_too(
    seaweedfs_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SeaweedFS checks keys (moto accepts any): a wrong secret is named as such."""
    _no_credentials(monkeypatch, tmp_path)
    url = f"s3://{create_bucket(seaweedfs_server)}/cold"
    so: dict[str, Any] = {**seaweedfs_server.storage_options, "secret": "wrong"}
    opts = ReadOptions.parse({"path": url, "storage_options": json.dumps(so)})
    with pytest.raises(
        CredentialsError, match="Every process that reads the bucket needs its own credentials"
    ):
        plan_partitions(open_storage(opts.url, opts.storage_options), opts, Constraints.from_options(opts))
