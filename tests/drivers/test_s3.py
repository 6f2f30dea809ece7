"""The segment driver conformance suite on the ``s3`` driver, against two real S3 servers
(moto and SeaweedFS, started once per session by ``tests/conftest.py``), plus S3-only checks:
compose planning, error messages for bad configuration, dangling multipart uploads."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, TypeVar

import pytest
from botocore.exceptions import ClientError
from hypothesis import given
from hypothesis import strategies as st

from tierd.drivers._chunks import Chunk
from tierd.drivers.s3 import Part, S3Driver, S3Root, plan_parts, receive_into
from tierd.drivers.segment import ByteRange
from tierd.errors import (
    BackendError,
    CorruptionError,
    InvalidArgumentError,
    ObjectExistsError,
    SegmentNotFoundError,
    SegmentSealedError,
    UnsafeBackendError,
)
from tierd.testing.s3server import S3Server, create_bucket, free_port
from tierd.testing.segment import SegmentDriverTests

if TYPE_CHECKING:
    from collections.abc import Coroutine, Iterator

_T = TypeVar("_T")


class TestS3Driver(SegmentDriverTests):
    driver_cls = S3Driver

    @pytest.fixture
    def root_config(self, s3_server: S3Server, s3_bucket: str) -> Iterator[tuple[str, dict[str, Any]]]:
        self.server = s3_server
        self.bucket = s3_bucket
        self.prefix = "cold"
        self.client = s3_server.boto3_client()
        yield f"s3://{s3_bucket}/{self.prefix}", s3_server.storage_options
        self.client.close()

    def _key(self, path: str) -> str:
        return f"{self.prefix}/{path}"

    def backdoor_write(self, path: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self._key(path), Body=data)

    def backdoor_objects(self, path: str) -> list[str]:
        key = self._key(path)
        resp = self.client.list_objects_v2(Bucket=self.bucket, Prefix=key)
        return [
            o["Key"]
            for o in resp.get("Contents", [])
            if o["Key"] == key or o["Key"].startswith(key + ".chunks/")
        ]

    def backdoor_read(self, path: str) -> bytes | None:
        key = self._key(path)
        objects = self.backdoor_objects(path)
        if key in objects:
            return bytes(self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read())
        if not objects:
            return None
        return b"".join(
            bytes(self.client.get_object(Bucket=self.bucket, Key=k)["Body"].read()) for k in objects
        )

    def test_chunks_are_immutable_objects_named_by_position(
        self, root_config: tuple[str, dict[str, Any]]
    ) -> None:
        async def main() -> None:
            async with S3Driver.open_root(*root_config) as root:
                d = root.driver("p/seg")
                await d.write(0, b"abc")
                await d.write(3, b"defgh")

        asyncio.run(main())
        assert self.backdoor_objects("p/seg") == [
            "cold/p/seg.chunks/00000000000000000000",
            "cold/p/seg.chunks/00000000000000000003",
        ]


# ---------------------------------------------------------------------------- S3-only behaviour
MiB = 1024 * 1024


def _run(coro: Coroutine[Any, Any, _T]) -> _T:
    return asyncio.run(coro)


def _root(server: S3Server, bucket: str, **kwargs: Any) -> S3Root:
    return S3Root(f"s3://{bucket}/cold", server.storage_options, **kwargs)


def _chunks(sizes: list[int]) -> list[Chunk]:
    out, pos = [], 0
    for n in sizes:
        out.append(Chunk(pos, n, f"k/{pos}"))
        pos += n
    return out


def _check_plan(
    chunks: list[Chunk], parts: list[Part], min_part: int, max_part: int, allow_copy: bool
) -> None:
    # The pieces tile every chunk, in order.
    flat = [(c.position + s, c.position + e) for p in parts for c, s, e in p.pieces]
    total = sum(c.length for c in chunks)
    assert [a for a, _ in flat] == [0, *(b for _, b in flat[:-1])][: len(flat)]
    assert (flat[-1][1] if flat else 0) == total
    assert all(b > a for a, b in flat)
    for i, p in enumerate(parts):
        assert p.size <= max_part
        if i < len(parts) - 1:
            assert p.size >= min_part, (i, p.size)
        if p.copy:
            assert allow_copy
            assert len(p.pieces) == 1


@given(
    sizes=st.lists(st.integers(0, 40), max_size=30),
    allow_copy=st.booleans(),
)
def test_plan_parts_always_makes_a_valid_multipart_upload(sizes: list[int], allow_copy: bool) -> None:
    chunks = _chunks(sizes)
    parts = plan_parts(chunks, min_part=5, max_part=12, allow_copy=allow_copy)
    _check_plan(chunks, parts, 5, 12, allow_copy)


def test_plan_parts_copies_big_chunks_and_groups_small_ones() -> None:
    four = _chunks([4 * MiB] * 5)
    plan = plan_parts(four)
    assert [(p.copy, p.size) for p in plan] == [(False, 8 * MiB), (False, 8 * MiB), (False, 4 * MiB)]
    big = _chunks([6 * MiB, 6 * MiB, 10])
    assert [(p.copy, p.size) for p in plan_parts(big)] == [(True, 6 * MiB), (True, 6 * MiB), (False, 10)]
    # A small run before a big chunk borrows just enough of its head; the rest is still copied.
    mixed = _chunks([1024, 12 * MiB])
    assert [(p.copy, p.size) for p in plan_parts(mixed)] == [(False, 5 * MiB), (True, 7 * MiB + 1024)]
    # ... unless the rest would be too small to stand as a part.
    assert [(p.copy, p.size) for p in plan_parts(_chunks([1024, 6 * MiB]))] == [(False, 6 * MiB + 1024)]
    assert all(not p.copy for p in plan_parts(big, allow_copy=False))


def test_seal_copies_on_the_server(s3_server: S3Server, s3_bucket: str) -> None:
    async def seal(server_side_copy: bool, path: str) -> list[str]:
        async with _root(s3_server, s3_bucket, server_side_copy=server_side_copy) as root:
            d = root.driver(path)
            for i, n in enumerate([6 * MiB, 6 * MiB, 1000]):
                await d.write(i * 6 * MiB, bytes([i]) * n)
            ops: list[str] = []
            fs = await root.filesystem()
            fs.s3.meta.events.register("before-call.s3", lambda model, **_: ops.append(model.name))
            await d.seal()
            assert await d.read(ByteRange(6 * MiB - 1, 2)) == b"\x00\x01"
            assert d.sealed_crc32c is not None
            return ops

    server_ops = _run(seal(True, "a"))
    assert server_ops.count("UploadPartCopy") == 2
    assert server_ops.count("UploadPart") == 1
    client_ops = _run(seal(False, "b"))
    assert client_ops.count("UploadPartCopy") == 0
    assert client_ops.count("UploadPart") == 3


def test_failed_seal_aborts_its_upload_and_keeps_the_chunks(s3_server: S3Server, s3_bucket: str) -> None:
    async def main() -> None:
        # Parts below the server's 5 MiB minimum make CompleteMultipartUpload fail (EntityTooSmall).
        async with _root(s3_server, s3_bucket, min_part_size=1024) as root:
            d = root.driver("seg")
            for i in range(3):
                await d.write(i * 2048, bytes([65 + i]) * 2048)
            with pytest.raises(BackendError, match="EntityTooSmall"):
                await d.seal()
            assert await root.list_uploads() == []
            assert await d.is_sealed() is False
            assert await d.read_all() == b"A" * 2048 + b"B" * 2048 + b"C" * 2048

    _run(main())


def test_dangling_uploads_are_listed_and_aborted(s3_server: S3Server, s3_bucket: str) -> None:
    client = s3_server.boto3_client()
    try:
        client.create_multipart_upload(Bucket=s3_bucket, Key="cold/x/seg")
        client.create_multipart_upload(Bucket=s3_bucket, Key="elsewhere/seg")

        async def main() -> None:
            async with _root(s3_server, s3_bucket) as root:
                assert [u.key for u in await root.list_uploads()] == ["cold/x/seg"]
                if s3_server.name != "moto":  # moto reports every upload as started in 2010
                    assert await root.abort_uploads(older_than=3600) == 0
                assert await root.abort_uploads() == 1
                assert await root.list_uploads() == []

        _run(main())
        assert [u["Key"] for u in client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", [])] == [
            "elsewhere/seg"
        ]
    finally:
        client.close()


@pytest.mark.parametrize(
    ("names", "match"),
    [
        ({0: b"abc", 5: b"de"}, "gap"),
        ({0: b"abcdef", 3: b"def"}, "overlap"),
        ({0: b"abc", "junk": b"x"}, "unexpected object"),
    ],
)
def test_gaps_and_overlaps_are_corruption(
    s3_server: S3Server, s3_bucket: str, names: dict[int | str, bytes], match: str
) -> None:
    client = s3_server.boto3_client()
    try:
        for name, body in names.items():
            suffix = f"{name:020d}" if isinstance(name, int) else name
            client.put_object(Bucket=s3_bucket, Key=f"cold/seg.chunks/{suffix}", Body=body)
    finally:
        client.close()

    async def main() -> None:
        async with _root(s3_server, s3_bucket) as root:
            with pytest.raises(CorruptionError, match=match):
                await root.driver("seg").size()
            with pytest.raises(CorruptionError):
                await root.driver("seg").read(ByteRange(0, 1))
            await root.driver("seg").delete()  # a corrupt segment can still be removed
            assert await root.driver("seg").exists() is False

    _run(main())


def test_an_interrupted_seal_is_finished_by_the_next_one(s3_server: S3Server, s3_bucket: str) -> None:
    async def main() -> None:
        async with _root(s3_server, s3_bucket) as root:
            good, bad = root.driver("good"), root.driver("bad")
            for d in (good, bad):
                await d.write(0, b"hello ")
                await d.write(6, b"world")
            client = s3_server.boto3_client()
            try:
                # As if a seal crashed after composing but before deleting the chunks.
                client.put_object(Bucket=s3_bucket, Key="cold/good", Body=b"hello world")
                client.put_object(Bucket=s3_bucket, Key="cold/bad", Body=b"HELLO world")
            finally:
                client.close()
            assert await good.is_sealed() is True  # the sealed object wins for readers
            await good.seal()
            assert await good.read_all() == b"hello world"
            with pytest.raises(CorruptionError, match="CRC32C"):
                await bad.seal()  # mismatching leftovers are reported, not deleted

    _run(main())
    client = s3_server.boto3_client()
    try:
        keys = [o["Key"] for o in client.list_objects_v2(Bucket=s3_bucket).get("Contents", [])]
    finally:
        client.close()
    assert keys == ["cold/bad", *[f"cold/bad.chunks/{p:020d}" for p in (0, 6)], "cold/good"]


def test_a_stale_writer_cannot_clobber_a_chunk(s3_server: S3Server, s3_bucket: str) -> None:
    async def main() -> None:
        async with _root(s3_server, s3_bucket) as root:
            a, b = root.driver("seg"), root.driver("seg")
            await a.write(0, b"abc")  # a's cached layout now ends at 3
            await b.write(3, b"def")
            await a.write(3, b"def")  # conditional PUT conflicts, a re-reads: same bytes → no-op
            with pytest.raises(CorruptionError):
                await a.write(3, b"XYZ")
            assert await a.read_all() == b"abcdef"

    _run(main())


def test_first_write_of_a_new_segment_is_a_conditional_put_confirmed_by_one_listing(
    s3_server: S3Server, s3_bucket: str
) -> None:
    async def main() -> list[tuple[str, bool]]:
        async with _root(s3_server, s3_bucket) as root:
            await root.check_capabilities()  # the probe's own requests are not counted
            fs = await root.filesystem()
            ops: list[tuple[str, bool]] = []

            def record(model: Any, params: dict[str, Any], **_: Any) -> None:
                ops.append((model.name, "if-none-match" in {k.lower() for k in params.get("headers", {})}))

            fs.s3.meta.events.register("before-call.s3", record)
            d = root.driver("fresh")
            await d.write(0, b"abc")
            await d.write(3, b"def")
            assert await root.driver("fresh").read_all() == b"abcdef"
            return ops

    ops = _run(main())
    # create-only PUT of chunk 0, one listing that confirms it before success, then a cached append
    assert ops[:3] == [("PutObject", True), ("ListObjectsV2", False), ("PutObject", True)]


def test_first_write_from_a_new_instance_still_sees_existing_chunks_and_seals(
    s3_server: S3Server, s3_bucket: str
) -> None:
    async def main() -> None:
        async with _root(s3_server, s3_bucket) as root:
            await root.driver("made").create()  # empty chunk 0 marker
            await root.driver("made").write(0, b"abc")  # chunk 0 exists: decided from a listing
            assert await root.driver("made").read_all() == b"abc"
            await root.driver("written").write(0, b"abc")
            await root.driver("written").write(0, b"abc")  # same bytes again: a no-op
            with pytest.raises(CorruptionError):
                await root.driver("written").write(0, b"XYZ")
            sealed = root.driver("sealed")
            await sealed.write(0, b"abc")
            await sealed.seal()
            with pytest.raises(SegmentSealedError):
                await root.driver("sealed").write(0, b"abc")
            with pytest.raises(SegmentSealedError):
                await root.driver("sealed").write(0, b"new")
            # the refused writes left no chunk beside the sealed object
            listing = await root.driver("sealed")._list()
            assert listing.sealed is not None
            assert listing.chunks == ()
            assert await root.driver("sealed").read_all() == b"abc"

    _run(main())


def test_listing_is_never_served_from_a_cache(s3_server: S3Server, s3_bucket: str) -> None:
    async def main() -> None:
        async with _root(s3_server, s3_bucket) as root:
            d = root.driver("seg")
            await d.write(0, b"abc")
            assert await d.size() == 3
            client = s3_server.boto3_client()
            try:
                client.put_object(Bucket=s3_bucket, Key="cold/seg.chunks/00000000000000000003", Body=b"de")
            finally:
                client.close()
            assert await d.size() == 5
            assert await d.read(ByteRange(3, 2)) == b"de"

    _run(main())


def test_sse_options_pass_through(moto_server: S3Server) -> None:
    bucket = create_bucket(moto_server)
    options = moto_server.storage_options | {"s3_additional_kwargs": {"ServerSideEncryption": "AES256"}}

    async def main() -> None:
        async with S3Root(f"s3://{bucket}/p", options) as root:
            d = root.driver("seg")
            await d.write(0, b"x" * (6 * MiB))
            await d.write(6 * MiB, b"tail")
            await d.seal()

    _run(main())
    client = moto_server.boto3_client()
    try:
        assert client.head_object(Bucket=bucket, Key="p/seg")["ServerSideEncryption"] == "AES256"
    finally:
        client.close()


# ---------------------------------------------------------------------------- bad configuration
def _error(url: str, options: dict[str, Any]) -> BackendError:
    async def main() -> BackendError:
        async with S3Driver.open_root(url, options) as root:
            with pytest.raises(BackendError) as exc:
                await root.driver("seg").write(0, b"x")
            return exc.value

    return _run(main())


def test_missing_bucket_names_the_setting(s3_server: S3Server) -> None:
    # A read: SeaweedFS creates a missing bucket on PUT (the service's first calls are reads).
    async def main() -> BackendError:
        async with S3Driver.open_root("s3://no-such-bucket-tierd/p", s3_server.storage_options) as root:
            with pytest.raises(BackendError) as exc:
                await root.driver("seg").size()
            return exc.value

    err = _run(main())
    assert "bucket 'no-such-bucket-tierd' does not exist" in str(err)
    assert "backend.url" in str(err)
    assert isinstance(err.__cause__, OSError | ClientError)


def test_unreachable_endpoint_names_the_setting() -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    options = {
        "endpoint_url": endpoint,
        "key": "k",
        "secret": "s",
        "config_kwargs": {"retries": {"max_attempts": 1}},
    }
    err = _error("s3://bucket/p", options)
    assert f"cannot connect to the S3 endpoint {endpoint}" in str(err)
    assert "backend.storage_options.endpoint_url" in str(err)


@pytest.mark.parametrize(
    ("bad_key", "code"), [(True, "InvalidAccessKeyId"), (False, "SignatureDoesNotMatch")]
)
def test_rejected_credentials_name_the_settings(seaweedfs_server: S3Server, bad_key: bool, code: str) -> None:
    # moto accepts any credentials; SeaweedFS enforces them.
    bucket = create_bucket(seaweedfs_server)
    secret = "wrong-secret-" + "9" * 20
    options = seaweedfs_server.storage_options | {"secret": secret}
    if bad_key:
        options["key"] = "WRONGKEY"
    err = _error(f"s3://{bucket}/p", options)
    assert code in str(err)
    assert "AWS_ACCESS_KEY_ID" in str(err)
    assert secret not in str(err)
    assert secret not in repr(S3Driver.open_root(f"s3://{bucket}/p", options))


def test_bad_url_and_options_are_config_errors() -> None:
    with pytest.raises(InvalidArgumentError, match="s3://bucket/prefix"):
        S3Driver.open_root("/not/s3")
    with pytest.raises(InvalidArgumentError, match="storage_options"):
        _run(S3Driver.open_root("s3://b/p", {"no_such_option": 1}).filesystem())


# ---------------------------------------------------------------------------- whole objects
async def _conditional_calls(root: S3Root, headers: set[str]) -> list[tuple[str, bool]]:
    """A live log of the root's S3 calls: (operation, whether it carried one of ``headers``)."""
    fs = await root.filesystem()
    ops: list[tuple[str, bool]] = []

    def record(model: Any, params: dict[str, Any], **_: Any) -> None:
        sent = {k.lower() for k in params.get("headers", {})}
        ops.append((model.name, bool(sent & headers)))

    fs.s3.meta.events.register("before-call.s3", record)
    return ops


def test_object_calls_are_single_unconditional_requests(s3_server: S3Server, s3_bucket: str) -> None:
    async def main() -> list[tuple[str, bool]]:
        async with _root(s3_server, s3_bucket) as root:
            ops = await _conditional_calls(root, {"if-match", "if-none-match"})
            await root.put_object("b/MANIFEST.json", b"v1")
            await root.put_object("b/MANIFEST.json", b"v2")  # replacing: no precondition to fail
            assert await root.get_object("b/MANIFEST.json") == b"v2"
            await root.delete_object("b/MANIFEST.json")
            await root.delete_object("b/MANIFEST.json")
            return ops

    assert _run(main()) == [
        ("PutObject", False),
        ("PutObject", False),
        ("GetObject", False),
        ("DeleteObject", False),
        ("DeleteObject", False),
    ]


def test_object_listing_pages_and_skips_foreign_keys(
    s3_server: S3Server, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = s3_server.boto3_client()
    try:
        for key in ["cold/q/seg.chunks/00000000000000000000", "cold/q/seg.chunks/00000000000000000003"]:
            client.put_object(Bucket=s3_bucket, Key=key, Body=b"abc")
        for key in ["cold/q/dir/", "coldx/q/y", "other/q/z"]:  # a directory marker, foreign keys
            client.put_object(Bucket=s3_bucket, Key=key, Body=b"")
    finally:
        client.close()

    async def main() -> None:
        async with _root(s3_server, s3_bucket) as root:
            real_call = root.call
            pages: list[str] = []

            async def small_pages(op: str, key: str | None = None, **kwargs: Any) -> Any:
                if op == "list_objects_v2":
                    kwargs["MaxKeys"] = 2
                    pages.append(kwargs.get("ContinuationToken", "first"))
                return await real_call(op, key, **kwargs)

            monkeypatch.setattr(root, "call", small_pages)
            for i in range(5):
                await root.put_object(f"q/m{i}", b"%d" % i)
            assert await root.list_objects("q") == ["q/m0", "q/m1", "q/m2", "q/m3", "q/m4", "q/seg"]
            assert len(pages) >= 4  # 8 keys (+ the marker on some servers) in pages of 2
            assert await root.list_objects("") == ["q/m0", "q/m1", "q/m2", "q/m3", "q/m4", "q/seg"]

    _run(main())


def test_object_api_on_a_root_without_prefix(s3_server: S3Server, s3_bucket: str) -> None:
    async def main() -> None:
        async with S3Root(f"s3://{s3_bucket}", s3_server.storage_options) as root:
            await root.put_object("b/MANIFEST.json", b"{}")
            await root.driver("b/t/0/seg").write(0, b"abc")
            assert await root.list_objects("") == ["b/MANIFEST.json", "b/t/0/seg"]
            assert await root.get_object("b/MANIFEST.json") == b"{}"

    _run(main())


def test_object_sse_options_apply_to_objects(moto_server: S3Server) -> None:
    bucket = create_bucket(moto_server)
    options = moto_server.storage_options | {"s3_additional_kwargs": {"ServerSideEncryption": "AES256"}}

    async def main() -> None:
        async with S3Root(f"s3://{bucket}/p", options) as root:
            await root.put_object("b/MANIFEST.json", b"{}")

    _run(main())
    client = moto_server.boto3_client()
    try:
        assert client.head_object(Bucket=bucket, Key="p/b/MANIFEST.json")["ServerSideEncryption"] == "AES256"
    finally:
        client.close()


def test_object_get_on_a_missing_bucket_names_the_setting(s3_server: S3Server) -> None:
    async def main() -> None:
        async with S3Root("s3://no-such-bucket-tierd/p", s3_server.storage_options) as root:
            with pytest.raises(BackendError, match="does not exist") as exc:
                await root.get_object("b/MANIFEST.json")
            assert not isinstance(exc.value, SegmentNotFoundError)
            assert "backend.url" in str(exc.value)

    _run(main())


def test_create_object_is_one_conditional_put_and_follows_the_write_policy(
    s3_server: S3Server, s3_bucket: str
) -> None:
    async def main() -> list[tuple[str, bool]]:
        async with _root(s3_server, s3_bucket) as root:
            ops = await _conditional_calls(root, {"if-none-match"})
            await root.create_object("o/1.json", b"first")
            with pytest.raises(ObjectExistsError):
                await root.create_object("o/1.json", b"second")
            assert await root.get_object("o/1.json") == b"first"
        # Conditional writes switched off without the single-writer declaration: the probe's
        # policy refuses every write, this one included, before anything is sent.
        blind = S3Root(f"s3://{s3_bucket}/p", s3_server.storage_options, conditional_writes=False)
        async with blind:
            with pytest.raises(UnsafeBackendError, match="single_writer"):
                await blind.create_object("o/2.json", b"x")
            with pytest.raises(SegmentNotFoundError):
                await blind.get_object("o/2.json")  # nothing written
        # Single-writer mode: no precondition is relied on, but a later creator is still told.
        single = S3Root(
            f"s3://{s3_bucket}/q", s3_server.storage_options, conditional_writes=False, single_writer=True
        )
        async with single:
            assert single.supports_create_object
            await single.create_object("o/3.json", b"mine")
            with pytest.raises(ObjectExistsError):
                await single.create_object("o/3.json", b"theirs")
            assert await single.get_object("o/3.json") == b"mine"
        return ops

    ops = _run(main())
    assert [op for op in ops if op[0] == "PutObject"][:2] == [("PutObject", True), ("PutObject", True)]


class _Stream:
    """A response body without aiohttp's stream underneath: read in pieces."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    async def read(self, n: int) -> bytes:
        piece, self.data = self.data[:n], self.data[n:]
        return piece


def test_a_get_body_is_received_into_the_buffer_and_never_past_it() -> None:
    out = bytearray(b"." * 12)
    with pytest.raises(CorruptionError, match="longer than the 10 bytes"):
        _run(receive_into(_Stream(b"x" * 10 + b"y" * 5), memoryview(out)[:10]))
    assert out[10:] == b".."  # nothing written beyond the view
    assert _run(receive_into(_Stream(b"abc"), memoryview(out))) == 3  # short: the caller decides
    assert out[:3] == b"abc"
