"""Shared fixtures. Tests never see the developer's own TIERD_* environment."""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, settings

from tierd.testing.localstack import start_localstack
from tierd.testing.s3server import S3Server, create_bucket, start_moto, start_seaweedfs

if TYPE_CHECKING:
    from collections.abc import Iterator

# Property tests check correctness, not speed: on 2 shared cores, and under the sanitizer build
# (make test-sanitizers), drawing an example or running one can take seconds, which Hypothesis's
# too_slow health check and 200 ms deadline would report as failures.
settings.register_profile("tierd", suppress_health_check=[HealthCheck.too_slow], deadline=None)
settings.load_profile("tierd")


# --- Parallel runs (`make test` runs pytest-xdist workers)
#: Session fixtures that start something heavy: every worker that runs one test using them starts
#: its own copy. Their tests are kept on one worker each (``--dist loadgroup``), so one JVM runs
#: the Spark session and one LocalStack or SeaweedFS runs per test run, as in a sequential run.
_ONE_WORKER = ("spark", "localstack_server", "seaweedfs_server")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("xdist"):
        return  # the marker is xdist's (and --strict-markers refuses unknown ones)
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        server = getattr(getattr(item, "callspec", None), "params", {}).get("s3_server")
        for name in _ONE_WORKER:
            if name in fixtures or f"{server}_server" == name:
                item.add_marker(pytest.mark.xdist_group(name))
                break


@pytest.fixture(autouse=True)
def _main_thread_event_loop() -> Iterator[None]:
    """Every test starts with a current event loop of its own in the main thread, closed after
    the test.

    ``asyncio.run`` leaves the main thread with no current loop (set to None), and from then on
    ``asyncio.get_event_loop()`` there raises "There is no current event loop in thread
    'MainThread'". The official RocketMQ client (through grpc.aio) asks for it, so a gRPC test
    failed whenever an earlier test in the same process had called ``asyncio.run`` — and which
    tests run earlier depends on how the workers of a parallel run share them out."""
    policy = asyncio.get_event_loop_policy()
    loop = policy.new_event_loop()
    policy.set_event_loop(loop)
    yield
    policy.set_event_loop(None)  # (an asyncio.run in the test may have unset it already)
    if not loop.is_running():
        loop.close()


@pytest.fixture(autouse=True)
def _isolated_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("TIERD_"):
            monkeypatch.delenv(key)
    # Every `tierd serve` a test starts serves gRPC (on by default at 8081) on a free port
    # instead, so tests running side by side never contend for 8081.
    monkeypatch.setenv("TIERD_GRPC__PORT", "0")


# --- S3 servers
# Real S3 servers as subprocesses on free ports, started once per test session and shared by
# every test that asks for them (drivers, tiering, Spark, service). Tests isolate themselves with
# a fresh bucket each (``s3_bucket``), never by restarting a server.


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """moto's S3 server (accepts any credentials)."""
    server = start_moto(tmp_path_factory.mktemp("moto"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def seaweedfs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """SeaweedFS (``weed mini``) with an enforced random access key."""
    server = start_seaweedfs(tmp_path_factory.mktemp("seaweedfs"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def localstack_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """LocalStack's S3 in host mode: installed into its own venv on first use, with a
    Python >= 3.12 found on the machine; fails loudly when that is impossible."""
    server = start_localstack(tmp_path_factory.mktemp("localstack"))
    yield server
    server.stop()


@pytest.fixture(scope="session", params=["moto", "seaweedfs", "localstack"])
def s3_server(request: pytest.FixtureRequest) -> S3Server:
    """Each S3 server in turn: tests using it run once per server."""
    server: S3Server = request.getfixturevalue(f"{request.param}_server")
    return server


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> str:
    """A new, empty bucket on ``s3_server``."""
    return create_bucket(s3_server)
