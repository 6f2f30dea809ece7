"""Chunk and part PUTs hand their body to botocore and aiohttp as a :class:`RequestBody` (no
copies): the request must carry exactly what botocore would send for the same ``bytes`` —
length, payload hash, CRC32 checksum — on both real servers, and a rewound body must hash and
send the whole body again (botocore rewinds it before every retry)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import zlib
from typing import TYPE_CHECKING, Any

from tierd.drivers.s3 import RequestBody, S3Root
from tierd.drivers.segment import ByteRange

if TYPE_CHECKING:
    from tierd.testing.s3server import S3Server


def _crc32_b64(data: bytes) -> str:
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def test_a_chunk_put_carries_botocores_length_payload_hash_and_checksum(
    s3_server: S3Server, s3_bucket: str
) -> None:
    data = os.urandom(3 * 1024 * 1024 + 17)  # over aiohttp's 1 MiB "large body" mark
    sent: list[tuple[dict[str, str], object]] = []

    def before_send(request: Any, **_: Any) -> None:
        if request.method == "PUT" and ".chunks/" in request.url:
            headers = {
                k.lower(): v.decode() if isinstance(v, bytes) else v for k, v in request.headers.items()
            }
            sent.append((headers, request.body))

    async def main() -> bytes:
        async with S3Root(f"s3://{s3_bucket}/cold", s3_server.storage_options) as root:
            fs = await root.filesystem()
            fs.s3.meta.events.register("before-send.s3.PutObject", before_send)
            driver = root.driver("seg")
            await driver.write(0, data)
            return await driver.read(ByteRange(0, len(data)))

    stored = asyncio.run(main())
    assert stored == data
    assert len(sent) == 1
    headers, body = sent[0]
    assert isinstance(body, RequestBody)
    assert int(headers["content-length"]) == len(data)
    assert headers["x-amz-content-sha256"] == hashlib.sha256(data).hexdigest()
    assert headers["x-amz-checksum-crc32"] == _crc32_b64(data)


def test_a_rewound_body_reads_and_hashes_the_whole_body_again() -> None:
    data = os.urandom(2 * 1024 * 1024 + 5)
    body = RequestBody(data)
    assert len(body) == len(data)
    first = b"".join(bytes(p) for p in iter(lambda: body.read(1 << 20), b""))
    assert first == data
    assert len(body.read(10)) == 0  # at the end (botocore stops on an empty read)
    assert body.tell() == len(data)
    body.seek(0)  # what botocore's reset_stream does before a retry
    again = hashlib.sha256()
    for piece in iter(lambda: body.read(1 << 20), b""):
        again.update(piece)
    assert again.hexdigest() == hashlib.sha256(data).hexdigest()
    assert body.seek(-5, os.SEEK_END) == len(data) - 5
    assert bytes(body.read()) == data[-5:]
    assert body.seek(3) == 3
    assert bytes(body.read(4)) == data[3:7]
    assert body.size == len(data)
