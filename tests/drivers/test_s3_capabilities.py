"""The S3 capability probe and what tierd does with its verdict (issue 21).

Real servers (moto, SeaweedFS, LocalStack) must pass the probe. A server that ignores
preconditions is a precondition-stripping proxy in front of moto
(:mod:`tierd.testing.s3proxy`): the probe must refuse it, single-writer mode must accept it
without ever overwriting a committed byte, and a server that passes the probe and misbehaves
later must be caught by the confirmation of blind first writes.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, cast

import pytest

from tierd import BlockingMessageStore, Message
from tierd.config import BackendConfig, TierdConfig
from tierd.drivers.s3 import S3Root
from tierd.drivers.s3probe import forget_probes
from tierd.drivers.segment import ByteRange
from tierd.errors import ConfigError, CorruptionError, UnsafeBackendError
from tierd.service.metrics import ServiceMetrics
from tierd.testing.s3proxy import PreconditionStrippingProxy
from tierd.testing.s3server import S3Server, create_bucket
from tierd.tiered.roots import open_driver_factory

from ..tiered.conftest import cold_config

if TYPE_CHECKING:
    from collections.abc import Coroutine, Iterator
    from pathlib import Path

    from tierd.store import MessageStore


def _run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


def _keys(server: S3Server, bucket: str) -> list[str]:
    client = server.boto3_client()
    try:
        return [str(o["Key"]) for o in client.list_objects_v2(Bucket=bucket).get("Contents", [])]
    finally:
        client.close()


def _read_back(server: S3Server, bucket: str, path: str) -> bytes:
    """The segment's bytes as stored: its chunks in key order, read with a plain client."""
    client = server.boto3_client()
    try:
        keys = sorted(k for k in _keys(server, bucket) if k.startswith(f"cold/{path}.chunks/"))
        return b"".join(bytes(client.get_object(Bucket=bucket, Key=k)["Body"].read()) for k in keys)
    finally:
        client.close()


@pytest.fixture
def proxy(moto_server: S3Server) -> Iterator[PreconditionStrippingProxy]:
    """moto behind a proxy that drops If-None-Match / If-Match: a server ignoring preconditions."""
    with PreconditionStrippingProxy(moto_server) as p:
        yield p
    forget_probes()


def test_real_servers_pass_the_probe_and_it_leaves_nothing_behind(
    s3_server: S3Server, s3_bucket: str
) -> None:
    async def main() -> dict[str, Any]:
        async with S3Root(f"s3://{s3_bucket}/cold", s3_server.storage_options) as root:
            return dict(await root.check_capabilities())

    forget_probes()
    report = _run(main())
    assert report["findings"] == [], report
    for name in (
        "conditional_create",
        "conditional_replace",
        "user_metadata",
        "multipart_upload",
        "multipart_listing",
        "server_side_copy",
        "batch_delete",
        "preconditions",
    ):
        assert report[name] is True, name
    assert report["range_reads"] == "exact"
    assert report["policy"]["mode"] == "multi-writer"
    assert report["policy"]["conditional_writes"] is True
    assert _keys(s3_server, s3_bucket) == []  # scratch objects removed
    client = s3_server.boto3_client()
    try:
        assert client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []
    finally:
        client.close()


def test_probe_refuses_a_server_that_ignores_preconditions(
    moto_server: S3Server, proxy: PreconditionStrippingProxy
) -> None:
    bucket = create_bucket(moto_server)

    async def main() -> tuple[UnsafeBackendError, UnsafeBackendError, dict[str, Any] | None]:
        async with S3Root(f"s3://{bucket}/cold", proxy.storage_options) as root:
            with pytest.raises(UnsafeBackendError) as first:
                await root.driver("seg").write(0, b"abc")
            with pytest.raises(UnsafeBackendError) as again:
                await root.driver("other").create()
            report = root.capability_report()
            return first.value, again.value, dict(report) if report else None

    err, again, report = _run(main())
    message = str(err)
    assert "ignores If-None-Match: * on an existing object (answered 200 and overwrote it)" in message
    assert "ignores If-Match with a wrong ETag" in message
    assert "backend.single_writer = true" in message  # the opt-out is named
    assert str(again) == message
    assert err.code == "backend_unsafe"
    assert report is not None
    assert report["conditional_create"] is False
    assert report["conditional_replace"] is False
    assert report["policy"]["mode"] == "refused"
    assert _keys(moto_server, bucket) == []  # nothing was written, the probe cleaned up
    assert proxy.stripped["if-none-match"] >= 1


def test_a_second_writer_cannot_overwrite_committed_chunks_behind_a_precondition_ignoring_server(
    moto_server: S3Server, proxy: PreconditionStrippingProxy
) -> None:
    """Issue 21's worst case: with the old default (conditional writes assumed) a second writer's
    first write to an existing segment overwrote committed chunk 0 (`abcdef` became `XYZdef`)."""
    bucket = create_bucket(moto_server)

    async def main() -> None:
        async with S3Root(f"s3://{bucket}/cold", proxy.storage_options, single_writer=True) as owner:
            d = owner.driver("seg")
            await d.write(0, b"abc")
            await d.write(3, b"def")
        async with S3Root(f"s3://{bucket}/cold", proxy.storage_options) as second:
            with pytest.raises(UnsafeBackendError):
                await second.driver("seg").write(0, b"XYZ")

    _run(main())
    assert _read_back(moto_server, bucket, "seg") == b"abcdef"


def test_single_writer_mode_lists_before_writing_and_never_overwrites(
    moto_server: S3Server, proxy: PreconditionStrippingProxy
) -> None:
    bucket = create_bucket(moto_server)

    async def main() -> dict[str, Any]:
        async with S3Root(f"s3://{bucket}/cold", proxy.storage_options, single_writer=True) as root:
            await root.check_capabilities()
            sent = dict(proxy.stripped)
            d = root.driver("seg")
            await d.write(0, b"abc")
            await d.write(3, b"def")
            # A stale or second driver instance: decided from a fresh listing, never blind.
            with pytest.raises(CorruptionError, match="conflicts with the 3 bytes already stored"):
                await root.driver("seg").write(0, b"XYZ")
            await root.driver("seg").write(0, b"abcdef")  # the same bytes again: a no-op
            await d.seal()
            assert await root.driver("seg").read(ByteRange(0, 6)) == b"abcdef"
            assert proxy.stripped == sent  # no precondition was even sent after the probe
            report = root.capability_report()
            assert report is not None
            return dict(report)

    report = _run(main())
    assert report["policy"]["mode"] == "single-writer"
    assert report["policy"]["conditional_writes"] is False
    assert any("single-writer mode" in w for w in report["policy"]["warnings"])
    client = moto_server.boto3_client()
    try:
        assert client.get_object(Bucket=bucket, Key="cold/seg")["Body"].read() == b"abcdef"
    finally:
        client.close()


def test_a_server_that_misbehaves_after_the_probe_is_caught_by_the_blind_write_confirmation(
    moto_server: S3Server,
) -> None:
    """Defence in depth: this server honours preconditions only on the probe's scratch keys."""
    bucket = create_bucket(moto_server)
    with PreconditionStrippingProxy(moto_server, honour=lambda key: "tierd-probe-" in key) as liar:
        try:

            async def main() -> None:
                async with S3Root(f"s3://{bucket}/cold", liar.storage_options) as first:
                    d = first.driver("seg")
                    await d.write(0, b"abc")
                    await d.write(3, b"def")
                    assert first.policy is not None
                    assert first.policy.mode == "multi-writer"  # the probe was fooled
                async with S3Root(f"s3://{bucket}/cold", liar.storage_options) as second:
                    # Its blind first write of chunk 0 lands on the existing segment; the listing
                    # that confirms it shows the other chunk: never reported as committed.
                    with pytest.raises(CorruptionError, match="ignored If-None-Match"):
                        await second.driver("seg").write(0, b"XYZ")
                    with pytest.raises(UnsafeBackendError, match="did not enforce a precondition"):
                        await second.driver("seg2").write(0, b"more")  # and nothing more is written

            _run(main())
        finally:
            forget_probes()
    assert "cold/seg2.chunks/00000000000000000000" not in _keys(moto_server, bucket)


def test_a_server_answering_ranges_with_whole_objects_is_worked_around(moto_server: S3Server) -> None:
    bucket = create_bucket(moto_server)
    with PreconditionStrippingProxy(moto_server, honour=lambda key: True, strip_ranges=True) as p:
        try:

            async def main() -> dict[str, Any]:
                async with S3Root(f"s3://{bucket}/cold", p.storage_options) as root:
                    d = root.driver("seg")
                    await d.write(0, b"hello ")
                    await d.write(6, b"world")
                    assert await d.read(ByteRange(0, 1)) == b"h"
                    assert await d.read(ByteRange(4, 4)) == b"o wo"
                    into = bytearray(4)
                    await d.read_into(ByteRange(4, 4), memoryview(into))  # the cold read path's call
                    assert into == b"o wo"
                    await d.seal()
                    assert await d.read(ByteRange(10, 1)) == b"d"
                    return dict(root.capability_report() or {})

            report = _run(main())
        finally:
            forget_probes()
    assert report["range_reads"] == "whole-object"
    assert report["policy"]["mode"] == "multi-writer"
    assert any("Range: bytes=0-0" in f for f in report["findings"])


def test_capability_settings_come_from_the_backend_section(moto_server: S3Server, tmp_path: Path) -> None:
    bucket = create_bucket(moto_server)
    url = f"s3://{bucket}/cold"
    options = moto_server.storage_options

    async def write(backend: BackendConfig) -> S3Root:
        root = open_driver_factory(backend)
        assert isinstance(root, S3Root)
        async with root:
            await root.driver("seg").write(0, b"abc")
        return root

    # Turning preconditions off needs the single-writer promise.
    off = BackendConfig(name="s3", url=url, storage_options=options, conditional_writes=False)
    with pytest.raises(UnsafeBackendError, match="conditional_writes = false"):
        _run(write(off))
    accepted = _run(write(off.model_copy(update={"single_writer": True})))
    assert accepted.conditional_writes is False
    no_copy = _run(write(BackendConfig(name="s3", url=url, storage_options=options, server_side_copy=False)))
    assert no_copy.server_side_copy is False
    assert no_copy.conditional_writes is True  # from the probe
    # Meaningless for other drivers: refused, not ignored.
    with pytest.raises(ConfigError, match=r"backend\.single_writer only apply to the s3 driver"):
        open_driver_factory(BackendConfig(name="posix", url=str(tmp_path), single_writer=True))
    # And from the environment, as every key.
    env = {"TIERD_BACKEND__CONDITIONAL_WRITES": "false", "TIERD_BACKEND__SINGLE_WRITER": "true"}
    cfg = TierdConfig.load(env=env)
    assert (cfg.backend.conditional_writes, cfg.backend.single_writer) == (False, True)


def test_the_service_refuses_to_tier_and_keeps_every_message(
    moto_server: S3Server, proxy: PreconditionStrippingProxy, tmp_path: Path
) -> None:
    bucket = create_bucket(moto_server)
    backend = {"name": "s3", "url": f"s3://{bucket}/cold", "storage_options": proxy.storage_options}
    cfg = cold_config(tmp_path, backend)
    with BlockingMessageStore.open(cfg) as store:
        store.wait_ready()
        assert store.tiering is not None
        store.put_batch([Message("t", b"m%d" % i, queue_id=0) for i in range(10)])
        with pytest.raises(UnsafeBackendError, match="single_writer"):
            store.tier_now()
        assert isinstance(store.tiering.refused, UnsafeBackendError)
        # The collector reads the parts both facades share (hot store, router, tiering).
        shared = cast("MessageStore", store)
        metrics = ServiceMetrics(lambda: shared, lambda: False).render().decode()
        assert "tierd_backend_writes_refused 1.0" in metrics
        assert 'tierd_backend_capability{capability="conditional_create"} 0.0' in metrics
        assert 'tierd_backend_capability{capability="server_side_copy"} 1.0' in metrics
        assert [m.body for m in store.get("t", 0, 0, 10, policy="DISABLE").messages] == [
            b"m%d" % i for i in range(10)
        ]
    assert _keys(moto_server, bucket) == []  # not one object: no segment, no manifest


def test_an_s3rver_like_server_is_usable_only_in_single_writer_mode(moto_server: S3Server) -> None:
    """s3rver 3.7.1 as measured in issue 21: preconditions ignored, 501 for UploadPartCopy and
    ListMultipartUploads, whole objects for ranges. Refused by default; with single_writer the
    seal downloads and re-uploads, reads slice, and the bytes come back exact."""
    bucket = create_bucket(moto_server)
    unimplemented = frozenset({"UploadPartCopy", "ListMultipartUploads"})
    big = 6 * 1024 * 1024  # chunks big enough that S3 would copy them on the server

    async def main(options: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
        async with S3Root(f"s3://{bucket}/cold", options) as refused:
            with pytest.raises(UnsafeBackendError, match="single_writer"):
                await refused.driver("seg").write(0, b"x")
        async with S3Root(f"s3://{bucket}/cold", options, single_writer=True) as root:
            d = root.driver("seg")
            await d.write(0, b"a" * big)
            await d.write(big, b"b" * big)
            await d.write(2 * big, b"tail")
            fs = await root.filesystem()
            ops: list[str] = []
            fs.s3.meta.events.register("before-call.s3", lambda model, **_: ops.append(model.name))
            await d.seal()
            assert await d.read(ByteRange(big - 2, 4)) == b"aabb"
            assert await d.read(ByteRange(2 * big, 4)) == b"tail"
            return ops, dict(root.capability_report() or {})

    with PreconditionStrippingProxy(moto_server, strip_ranges=True, not_implemented=unimplemented) as p:
        try:
            ops, report = _run(main(p.storage_options))
        finally:
            forget_probes()
    assert "UploadPartCopy" not in ops
    assert ops.count("UploadPart") == 3  # download-and-reupload seal
    assert report["server_side_copy"] is False
    assert report["multipart_listing"] is False
    assert report["range_reads"] == "whole-object"
    assert report["policy"]["mode"] == "single-writer"
    findings = " | ".join(report["findings"])
    assert "does not implement UploadPartCopy (HTTP 501 NotImplemented)" in findings
    assert "does not implement ListMultipartUploads" in findings
