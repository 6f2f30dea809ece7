"""``s3`` driver: segments on Amazon S3 or any S3-compatible server, via s3fs/aiobotocore.

S3 objects cannot be appended to, so an open segment is a run of immutable chunk objects and
sealing composes them into one object (the scheme and its safety rules: ``tierd/drivers/_chunks.py``
and FORMATS §2.3). What is S3-specific lives here:

* **Conditional PUTs.** Each chunk is written ``If-None-Match: *`` (replacing the empty create
  marker: ``If-Match: <etag>``), so a retried or delayed request can never overwrite a chunk.
  Servers without conditional writes: ``S3Root(..., conditional_writes=False)``.
* **Compose on the server.** :meth:`S3Driver.seal` builds the sealed object with one multipart
  upload whose parts are ``UploadPartCopy`` of whole chunks (or chunk ranges) when they are at
  least 5 MiB, and normal parts made by downloading and concatenating runs of smaller chunks —
  S3 rejects non-last parts under 5 MiB (``EntityTooSmall``). A small run before a big chunk
  borrows just enough of that chunk's head to reach 5 MiB; the rest is still copied on the
  server. The result is verified (size, CRC32C of every chunk's range against the CRC stored in
  the chunk's ``x-amz-meta-tierd-crc32c`` at write time) before the chunks are deleted; the
  multipart upload is aborted on any failure. :meth:`S3Root.list_uploads` and
  :meth:`S3Root.abort_uploads` clean up uploads left by a crashed process.
* **Errors are translated once**, in :func:`map_s3_error`: a missing bucket, rejected
  credentials or an unreachable endpoint become one :class:`~tierd.errors.BackendError` that
  names what to set; secrets never appear in messages or ``repr``.
* **No listing cache.** Every listing is a direct ``ListObjectsV2`` call on an s3fs instance
  created with ``skip_instance_cache=True``; s3fs's directory cache is never consulted.
* **Whole objects** (:meth:`S3Root.put_object` & co., for manifests) are plain, unconditional
  ``PutObject``/``GetObject``/``DeleteObject`` calls — a single PUT is atomic in S3 — and
  :meth:`S3Root.list_objects` lists with ``ListObjectsV2``, reporting an open segment's chunks
  as the segment.

Configuration: ``[backend] url = "s3://bucket/prefix"``; ``storage_options`` go to
:class:`s3fs.S3FileSystem` (``endpoint_url``, ``key``/``secret``/``token``, ``profile``,
``client_kwargs``, ``config_kwargs``, ``s3_additional_kwargs`` for SSE, ...). Credentials are best
left to the environment (``AWS_ACCESS_KEY_ID``...) or the provider chain.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

import s3fs
from aiohttp.payload import Payload
from botocore.exceptions import (
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    PartialCredentialsError,
)

from tierd.drivers._chunks import (
    VERIFY_PIECE,
    Chunk,
    ChunkConflictError,
    ChunkedDriver,
    Layout,
    Listing,
    ObjectInfo,
    OverwriteDetectedError,
    chunk_key,
    crc32c,
)
from tierd.drivers._objects import listed_paths
from tierd.drivers.s3fastget import LeanGet, with_client_session
from tierd.drivers.s3probe import S3Capabilities, WritePolicy, cached_probe, decide
from tierd.drivers.segment import DriverRoot, validate_object_prefix, validate_segment_path
from tierd.errors import (
    BackendError,
    CorruptionError,
    CredentialsError,
    InvalidArgumentError,
    ObjectExistsError,
    SegmentNotFoundError,
    TierdError,
    UnsafeBackendError,
    UnsupportedOperationError,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping, Sequence

_T = TypeVar("_T")

__all__ = [
    "MAX_PART",
    "MIN_PART",
    "Part",
    "PendingUpload",
    "RequestBody",
    "S3Driver",
    "S3Root",
    "body_pieces",
    "fill_from",
    "map_s3_error",
    "plan_parts",
    "receive_into",
]

#: S3's minimum size of every multipart part but the last, and maximum size of any part.
MIN_PART = 5 * 1024 * 1024
MAX_PART = 5 * 1024 * 1024 * 1024
MAX_PARTS = 10_000
#: Largest part assembled in memory from downloaded chunks.
CONCAT_LIMIT = 16 * 1024 * 1024
#: User metadata key (``x-amz-meta-…``) holding a chunk's CRC32C as 8 hex digits.
CRC_META = "tierd-crc32c"
#: Directory names per page of :meth:`S3Root.expect_new_dirs` (S3's largest page).
NEW_DIRS_PAGE = 1000
_CREDENTIAL_CODES = frozenset(
    {
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "InvalidToken",
        "ExpiredToken",
        "TokenRefreshRequired",
        "InvalidClientTokenId",
        "AuthorizationHeaderMalformed",
    }
)
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
_PARALLEL = 8
#: Piece size when a GET body is received into the caller's buffer without aiohttp's stream.
RECEIVE_PIECE = 256 * 1024
log = logging.getLogger(__name__)


def _client_error(err: BaseException) -> ClientError | None:
    # s3fs re-raises ClientError as a builtin OSError whose __cause__ is the original.
    seen: BaseException | None = err
    for _ in range(3):
        if isinstance(seen, ClientError):
            return seen
        if seen is None:
            return None
        seen = seen.__cause__
    return None


def _is_connection_error(err: BaseException) -> bool:
    seen: BaseException | None = err
    for _ in range(4):
        if seen is None:
            return False
        if isinstance(seen, (EndpointConnectionError, ConnectTimeoutError, ConnectionError)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def map_s3_error(
    err: BaseException, *, op: str, bucket: str, key: str | None = None, endpoint: str | None = None
) -> TierdError:
    """Translate an s3fs/botocore/aiohttp exception into the tierd error callers handle.

    The one place where S3 error codes are interpreted. Configuration mistakes get a message
    naming the setting to fix; the rest keep the S3 code. Never includes credentials.
    """
    if isinstance(err, TierdError):
        return err
    where = f"s3://{bucket}/{key}" if key else f"s3://{bucket}"
    server = endpoint or "the default AWS endpoint"
    ce = _client_error(err)
    code = str(ce.response.get("Error", {}).get("Code", "")) if ce is not None else ""
    if code in _NOT_FOUND_CODES:
        return SegmentNotFoundError(f"{where} does not exist", bucket=bucket, key=key)
    if code == "NoSuchBucket":
        return BackendError(
            f"S3 bucket {bucket!r} does not exist at {server}: create it, or set backend.url to "
            "s3://<existing-bucket>/<prefix>",
            bucket=bucket,
            s3_code=code,
        )
    if isinstance(err, (NoCredentialsError, PartialCredentialsError)):
        # Found before any request (e.g. an optional Secret that does not exist): say they are
        # missing, not that S3 rejected them.
        return CredentialsError(
            f"no S3 credentials found ({type(err).__name__}) for {op} on s3://{bucket} at {server}: "
            "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, a web identity "
            "token, a container credentials endpoint) in the environment, or "
            "backend.storage_options.key / .secret",
            bucket=bucket,
            s3_code=type(err).__name__,
        )
    if code in _CREDENTIAL_CODES:
        return BackendError(
            f"S3 at {server} rejected the credentials ({code or type(err).__name__}) for {op} on "
            f"s3://{bucket}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) in "
            "the environment, or backend.storage_options.key / .secret",
            bucket=bucket,
            s3_code=code or type(err).__name__,
        )
    if code in ("AccessDenied", "AllAccessDisabled"):
        return BackendError(
            f"S3 at {server} denied {op} on {where} (AccessDenied): grant the credentials in use "
            "access to the bucket, or set other ones via AWS_ACCESS_KEY_ID / AWS_PROFILE",
            bucket=bucket,
            s3_code=code,
        )
    if code == "PreconditionFailed":
        return ChunkConflictError(f"conditional {op} of {where} failed: the object already exists", key=key)
    if ce is None and _is_connection_error(err):
        return BackendError(
            f"cannot connect to the S3 endpoint {server} ({type(err).__name__}): set "
            "backend.storage_options.endpoint_url (or AWS_ENDPOINT_URL) to a reachable S3 server",
            endpoint=endpoint,
        )
    message = str(ce.response.get("Error", {}).get("Message", "")) if ce is not None else str(err)
    return BackendError(
        f"S3 {op} on {where} failed: {code or type(err).__name__}: {message}",
        bucket=bucket,
        key=key,
        s3_code=code or type(err).__name__,
    )


class RequestBody(Payload):
    """The body of a chunk or part PUT, handed to botocore and aiohttp without a copy.

    botocore turns a ``bytes`` body into an ``io.BytesIO`` (PutObject, UploadPart), reads it in
    1 MiB copies twice (its CRC32 request checksum, SigV4's payload SHA-256 over plain HTTP), and
    aiohttp then calls ``BytesIO.getbuffer()`` on it — which copies the whole body, the buffer
    being shared with our ``bytes`` — and sends it in 64 KiB copies. This object is both what
    botocore expects of a file (``read``/``seek``/``tell``/``len``; reads are views of the
    body) and an aiohttp payload (written in one piece, as a view), so the body is hashed and
    sent straight from tierd's own buffer: 35-40 % less client CPU per MiB on moto and SeaweedFS
    (docs/performance.md, P2). The bytes on the wire, the headers and the checksums are the same
    as botocore's own: ``Content-Length``, ``Expect: 100-continue``, ``x-amz-checksum-crc32`` and
    the signed payload hash. Retries rewind it (``seek(0)``) and send it whole again."""

    _autoclose = True  # memory only: nothing to close

    def __init__(self, data: bytes) -> None:
        super().__init__(data, content_type="application/octet-stream")
        self._view = memoryview(data)
        self._size = len(data)  # aiohttp's Payload.size (the Content-Length it sends)
        self._pos = 0

    def __len__(self) -> int:
        return self._view.nbytes

    def read(self, size: int = -1) -> memoryview:
        start = self._pos
        end = self._view.nbytes if size is None or size < 0 else min(start + size, self._view.nbytes)
        self._pos = max(start, end)
        return self._view[start:end]

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self._view.nbytes}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return self._view.tobytes().decode(encoding, errors)

    async def write(self, writer: Any) -> None:
        await self.write_with_length(writer, None)

    async def write_with_length(self, writer: Any, content_length: int | None) -> None:
        view = self._view if content_length is None else self._view[:content_length]
        await writer.write(view)


@dataclass(frozen=True, slots=True)
class Part:
    """One part of the composed object: a server-side copy of ``[start, end)`` of one chunk, or
    the concatenation of several chunk ranges done on the client."""

    copy: bool
    pieces: tuple[tuple[Chunk, int, int], ...]

    @property
    def size(self) -> int:
        return sum(end - start for _, start, end in self.pieces)


def plan_parts(
    chunks: Sequence[Chunk], *, min_part: int = MIN_PART, max_part: int = MAX_PART, allow_copy: bool = True
) -> list[Part]:
    """Group chunks into multipart parts: every part but the last ≥ ``min_part``, none >
    ``max_part``; copy on the server whatever can be copied, download as little as possible.

    Greedy left to right. Small chunks accumulate into a run that becomes a concatenated part as
    soon as it reaches ``min_part``. A big chunk met with a run pending tops the run up with its
    head (a ranged download) and is copied from there on — unless the remainder would be too
    small to stand as a part, in which case the whole chunk joins the run. With
    ``allow_copy=False`` everything is concatenated (the download-and-reupload baseline).
    """
    limit = min(max(min_part, CONCAT_LIMIT), max_part)
    parts: list[Part] = []
    run: list[tuple[Chunk, int, int]] = []
    run_size = 0

    def flush() -> None:
        nonlocal run, run_size
        if run:
            parts.append(Part(False, tuple(run)))
        run, run_size = [], 0

    def add_copies(chunk: Chunk, start: int) -> None:
        remaining = chunk.length - start
        pieces = -(-remaining // max_part)  # ceil: equal pieces, each ≤ max_part and > max_part / 2
        step = -(-remaining // pieces)
        pos = start
        while pos < chunk.length:
            end = min(pos + step, chunk.length)
            parts.append(Part(True, ((chunk, pos, end),)))
            pos = end

    for c in chunks:
        if c.length == 0:
            continue
        start = 0
        if allow_copy and run_size and c.length >= min_part:
            need = min_part - run_size
            if c.length - need >= min_part:
                run.append((c, 0, need))
                flush()
                start = need
            # else: the remainder could not stand as a part; the whole chunk is concatenated below.
        if allow_copy and not run_size and c.length - start >= min_part:
            add_copies(c, start)
            continue
        # Concatenate; pieces are cut so that no concatenated part exceeds ``limit`` (memory bound).
        pos = start
        while pos < c.length:
            take = min(c.length - pos, limit - run_size)
            run.append((c, pos, pos + take))
            run_size += take
            pos += take
            if run_size >= min_part:
                flush()
    flush()
    return parts


@dataclass(frozen=True, slots=True)
class PendingUpload:
    """A multipart upload in progress (or abandoned): key, upload id, start time (epoch s)."""

    key: str
    upload_id: str
    initiated: float


class S3Root(DriverRoot):
    """A bucket and key prefix (``s3://bucket/prefix``) with one shared s3fs client.

    The client is created on first use inside the running event loop and must be released with
    :meth:`aclose` in that same loop (``async with root:``); after :meth:`aclose` the root
    reconnects lazily. Pickles to URL + options only.
    """

    def __init__(
        self,
        url: str,
        storage_options: Mapping[str, Any] | None = None,
        *,
        server_side_copy: bool | None = None,
        conditional_writes: bool | None = None,
        single_writer: bool = False,
        min_part_size: int = MIN_PART,
    ) -> None:
        super().__init__(url, storage_options)
        parts = urlsplit(url)
        if parts.scheme not in ("s3", "s3a") or not parts.netloc:
            raise InvalidArgumentError(
                f"backend.url for the s3 driver must look like s3://bucket/prefix, got {url!r}", url=url
            )
        self.bucket = parts.netloc
        self.prefix = parts.path.strip("/")
        self.min_part_size = min_part_size
        #: The settings as configured (None = follow the capability probe), and the operator's
        #: promise that one process writes under this prefix (``backend.single_writer``).
        self.requested_conditional_writes = conditional_writes
        self.requested_server_side_copy = server_side_copy
        self.single_writer = single_writer
        #: What the driver does, decided by :meth:`check_capabilities` before the first write
        #: (the values until then are only provisional): compose sealed objects with
        #: UploadPartCopy (False: download and re-upload), and send If-None-Match / If-Match on
        #: chunk PUTs.
        self.server_side_copy = True if server_side_copy is None else server_side_copy
        self.conditional_writes = True if conditional_writes is None else conditional_writes
        #: The probe's verdict on this endpoint and bucket (None until probed) and the write
        #: policy derived from it and the settings.
        self.capabilities: S3Capabilities | None = None
        self.policy: WritePolicy | None = None
        self._fs: s3fs.S3FileSystem | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock: asyncio.Lock | None = None
        self._probe_lock: asyncio.Lock | None = None
        #: Called with ``("GetObject", "/" + key)`` for every lean GET sent (see
        #: :class:`~tierd.drivers.s3fastget.LeanGet`; tests and benchmarks count requests).
        self.request_observers: list[Callable[[str, str], None]] = []
        self._lean: LeanGet | None = None
        #: Object-key directories (ending in ``/``) found holding nothing by this round's
        #: :meth:`expect_new_dirs`: first writes under them need no confirming listing.
        self._empty_dirs: set[str] = set()

    def apply_capability_settings(
        self,
        *,
        conditional_writes: bool | None = None,
        server_side_copy: bool | None = None,
        single_writer: bool = False,
    ) -> None:
        """Apply the ``[backend]`` capability settings (the registry calls this; ``None`` keeps
        the probe's verdict). Only before the first write."""
        self.requested_conditional_writes = conditional_writes
        self.requested_server_side_copy = server_side_copy
        self.single_writer = single_writer
        if conditional_writes is not None:
            self.conditional_writes = conditional_writes
        if server_side_copy is not None:
            self.server_side_copy = server_side_copy
        self.policy = None

    async def check_capabilities(self) -> dict[str, Any]:
        """Probe the server once (cached per endpoint and bucket, see :mod:`tierd.drivers.s3probe`),
        decide the write policy and apply it; every mutating driver call awaits this first.

        Raises :class:`~tierd.errors.UnsafeBackendError` — every time, without I/O after the
        first — when writing would put committed bytes at risk. Returns
        :meth:`capability_report`."""
        if self.policy is None:
            loop = asyncio.get_running_loop()
            if self._probe_lock is None or self._loop is not loop:
                await self.filesystem()  # binds this root (and its locks) to the running loop
                self._probe_lock = self._probe_lock or asyncio.Lock()
            async with self._probe_lock:
                if self.policy is None:
                    caps = await cached_probe(self)
                    self._adopt(
                        caps,
                        decide(
                            caps,
                            conditional_writes=self.requested_conditional_writes,
                            server_side_copy=self.requested_server_side_copy,
                            single_writer=self.single_writer,
                            url=self.url,
                        ),
                    )
        assert self.policy is not None
        if self.policy.refusal is not None:
            raise UnsafeBackendError(self.policy.refusal, bucket=self.bucket, endpoint=self.endpoint_url)
        return self.capability_report() or {}

    def _adopt(self, caps: S3Capabilities, policy: WritePolicy) -> None:
        self.capabilities, self.policy = caps, policy
        self.conditional_writes = policy.conditional_writes
        self.server_side_copy = policy.server_side_copy
        found = "; ".join(caps.findings) or "behaves like S3"
        if policy.refusal is not None:
            log.error("S3 capability probe of %s: %s — writing refused: %s", self, found, policy.refusal)
            return
        log.info(
            "S3 capability probe of %s (%.3f s): %s — %s mode, conditional writes %s, server-side copy %s",
            self,
            caps.seconds,
            found,
            policy.mode,
            "on" if policy.conditional_writes else "off",
            "on" if policy.server_side_copy else "off",
        )
        for warning in policy.warnings:
            log.warning("%s", warning)

    def distrust_preconditions(self, reason: str) -> None:
        """A write proved that the server did not enforce a precondition although the probe said
        it did: refuse every further write through this root."""
        if self.policy is None:
            return
        self.policy = dataclasses.replace(
            self.policy,
            conditional_writes=False,
            mode="refused",
            refusal=f"{reason} (S3 server {self.endpoint_url or 'aws'} passed the capability probe "
            "but did not enforce a precondition later; writing through it is refused)",
        )
        log.error("%s", self.policy.refusal)

    def capability_report(self) -> dict[str, Any] | None:
        """The probe's verdict and the policy in force, as JSON-able data (for ``/v1/status``,
        metrics and logs); None before the first write probed the server."""
        if self.capabilities is None or self.policy is None:
            return None
        return {"driver": "s3", **self.capabilities.as_dict(), "policy": self.policy.as_dict()}

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_fs"] = state["_loop"] = state["_lock"] = state["_probe_lock"] = None
        state["_lean"] = None
        state["request_observers"] = []
        state["_empty_dirs"] = set()  # one round's knowledge, not a copy's
        return state

    @property
    def endpoint_url(self) -> str | None:
        """The configured endpoint (for messages); None means AWS's default."""
        opts = self.storage_options
        client_kwargs = opts.get("client_kwargs") or {}
        return (
            opts.get("endpoint_url")
            or client_kwargs.get("endpoint_url")
            or os.environ.get("AWS_ENDPOINT_URL_S3")
            or os.environ.get("AWS_ENDPOINT_URL")
        )

    def key_for(self, path: str) -> str:
        """Object key of the segment at ``path``."""
        return f"{self.prefix}/{path}" if self.prefix else path

    def driver(self, path: str) -> S3Driver:
        # docstring inherited
        return S3Driver(self, path)

    async def filesystem(self) -> s3fs.S3FileSystem:
        """The s3fs instance bound to the running loop (created on first use)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            # Made in another (now finished) loop: its sessions cannot be used or closed here.
            self._fs, self._loop, self._lock, self._probe_lock = None, loop, asyncio.Lock(), asyncio.Lock()
        if self._fs is not None:
            return self._fs
        assert self._lock is not None
        async with self._lock:  # concurrent first calls must not each create (and leak) a client
            if self._fs is not None:
                return self._fs
            # On a session class that lets the lean GET find the client's own (s3fastget).
            options = with_client_session(s3fs_options(self.storage_options))
            options.update(asynchronous=True, skip_instance_cache=True, loop=loop)
            try:
                fs = s3fs.S3FileSystem(**options)
                await fs.set_session()
            except (TypeError, KeyError) as e:
                raise InvalidArgumentError(
                    f"backend.storage_options are not valid for s3fs: {e}",
                    options=sorted(self.storage_options),
                ) from e
            except Exception as e:
                raise map_s3_error(e, op="connect", bucket=self.bucket, endpoint=self.endpoint_url) from e
            # Set up with the client, before anyone can hook its events: the setup prepares
            # (never sends) one GetObject, which must not count as a request.
            self._lean = await LeanGet.setup(fs, self.bucket, self.request_observers)
            self._fs = fs
            return fs

    async def call(self, op: str, key: str | None = None, **kwargs: Any) -> Any:
        """Run one S3 API call (s3fs adds ``s3_additional_kwargs`` such as SSE settings and retries
        transient faults), translating failures with :func:`map_s3_error`."""
        fs = await self.filesystem()
        if key is not None:
            kwargs["Key"] = key
        try:
            return await fs._call_s3(op, Bucket=self.bucket, **kwargs)
        except Exception as e:
            raise map_s3_error(e, op=op, bucket=self.bucket, key=key, endpoint=self.endpoint_url) from e

    async def lean_get(self) -> LeanGet | None:
        """The lean ranged GET for this root's client (set up with the client), or None where
        the client's own GetObject needs more than a plain signed GET, or after the lean GET was
        switched off (see :mod:`tierd.drivers.s3fastget`)."""
        await self.filesystem()
        lean = self._lean
        return lean if lean is not None and lean.disabled is None else None

    async def aclose(self) -> None:
        # docstring inherited
        fs, self._fs, self._loop, self._lock, self._probe_lock = self._fs, None, None, None, None
        self._lean = None
        if fs is not None and fs._s3 is not None:
            client = fs._s3
            fs._s3 = None
            await client.close()

    async def list_uploads(self, prefix: str = "") -> list[PendingUpload]:
        """Multipart uploads in progress under ``prefix`` (relative to the root)."""
        full = self.key_for(prefix) if prefix else (self.prefix + "/" if self.prefix else "")
        found: list[PendingUpload] = []
        kwargs: dict[str, Any] = {"Prefix": full}
        while True:
            resp = await self.call("list_multipart_uploads", **kwargs)
            for u in resp.get("Uploads", []):
                found.append(PendingUpload(u["Key"], u["UploadId"], u["Initiated"].timestamp()))
            if not resp.get("IsTruncated"):
                return found
            kwargs["KeyMarker"] = resp.get("NextKeyMarker", "")
            kwargs["UploadIdMarker"] = resp.get("NextUploadIdMarker", "")

    async def abort_uploads(self, prefix: str = "", older_than: float | None = None) -> int:
        """Abort uploads under ``prefix`` started more than ``older_than`` seconds ago (all when
        None). Uploads of a seal still running elsewhere would fail, so pass an age in
        production. Returns how many were aborted."""
        now = time.time()
        count = 0
        for u in await self.list_uploads(prefix):
            if older_than is None or now - u.initiated >= older_than:
                with contextlib.suppress(SegmentNotFoundError):
                    await self.call("abort_multipart_upload", key=u.key, UploadId=u.upload_id)
                count += 1
        return count

    # ------------------------------------------------------------------ whole objects
    async def put_object(self, path: str, data: bytes) -> None:
        # docstring inherited
        key = self.key_for(validate_segment_path(path))
        await self.call("put_object", key=key, Body=bytes(data))

    @property
    def supports_create_object(self) -> bool:
        # docstring inherited
        return self.conditional_writes or self.single_writer

    async def create_object(self, path: str, data: bytes) -> None:
        # docstring inherited
        key = self.key_for(validate_segment_path(path))
        await self.check_capabilities()  # a server that ignores preconditions is refused here
        if self.conditional_writes:
            try:
                await self.call("put_object", key=key, Body=bytes(data), IfNoneMatch="*")
            except ChunkConflictError as e:  # 412 PreconditionFailed: the key is taken
                raise ObjectExistsError(f"s3://{self.bucket}/{key} already exists", path=path) from e
            return
        if not self.single_writer:
            raise UnsupportedOperationError(
                f"cannot create s3://{self.bucket}/{key} exclusively: conditional writes are off for "
                "this S3 root",
                backend=self.url,
                operation="create_object",
            )
        # Single-writer mode (the server ignores If-None-Match; the operator declared one writer):
        # a HEAD first still tells a *later* creator — a second store, a restore — that the name
        # is taken. Only simultaneous creators could both succeed, which that declaration excludes.
        try:
            await self.call("head_object", key=key)
        except SegmentNotFoundError:
            await self.call("put_object", key=key, Body=bytes(data))
            return
        raise ObjectExistsError(f"s3://{self.bucket}/{key} already exists", path=path)

    async def get_object(self, path: str) -> bytes:
        # docstring inherited
        key = self.key_for(validate_segment_path(path))
        resp = await self.call("get_object", key=key)
        body = resp["Body"]
        try:
            data: bytes = await body.read()
        except Exception as e:
            raise map_s3_error(
                e, op="get_object", bucket=self.bucket, key=key, endpoint=self.endpoint_url
            ) from e
        finally:
            body.close()
        return data

    async def delete_object(self, path: str) -> None:
        # docstring inherited
        key = self.key_for(validate_segment_path(path))
        with contextlib.suppress(SegmentNotFoundError):  # S3 answers 204 anyway; some servers 404
            await self.call("delete_object", key=key)

    async def expect_new_dirs(self, parent: str, names: Collection[str], *, max_requests: int) -> int:
        # docstring inherited: one delimited listing of ``parent`` — a page per 1,000 directory
        # names, however many objects each holds — instead of a confirming listing per segment
        # (10,000 new queues in topics of 8: 1,250 listings instead of 20,000).
        if not names or max_requests < 1:
            return 0
        parent = validate_object_prefix(parent)
        base = self.key_for(parent) + "/" if parent else (f"{self.prefix}/" if self.prefix else "")
        kwargs: dict[str, Any] = {"Prefix": base, "Delimiter": "/", "MaxKeys": NEW_DIRS_PAGE}
        taken: set[str] = set()
        last = ""  # the greatest name listed: every directory before it was seen, or is empty
        complete = False
        for _ in range(max_requests):
            resp = await self.call("list_objects_v2", **kwargs)
            listed = [str(p["Prefix"]) for p in resp.get("CommonPrefixes", [])]
            listed += [str(o["Key"]) for o in resp.get("Contents", [])]
            taken.update(k[len(base) :].split("/", 1)[0] for k in listed)
            last = max([last, *listed])
            if not resp.get("IsTruncated"):
                complete = True
                break
            kwargs["ContinuationToken"] = resp["NextContinuationToken"]
        dirs = {f"{base}{name}/" for name in names if name not in taken}
        empty = dirs if complete else {d for d in dirs if last > d}
        self._empty_dirs |= empty
        return len(empty)

    def forget_new_dirs(self) -> None:
        # docstring inherited
        self._empty_dirs.clear()

    def listed_empty(self, key: str) -> bool:
        """Whether ``key`` lies in a directory :meth:`expect_new_dirs` found empty."""
        dirs = self._empty_dirs
        if not dirs:
            return False
        cut = key.find("/")
        while cut >= 0:
            if key[: cut + 1] in dirs:
                return True
            cut = key.find("/", cut + 1)
        return False

    async def list_objects(self, prefix: str) -> list[str]:
        # docstring inherited
        prefix = validate_object_prefix(prefix)
        base = f"{self.prefix}/" if self.prefix else ""
        kwargs: dict[str, Any] = {"Prefix": f"{base}{prefix}/" if prefix else base}
        names: list[str] = []
        while True:
            resp = await self.call("list_objects_v2", **kwargs)
            names.extend(str(obj["Key"])[len(base) :] for obj in resp.get("Contents", []))
            if not resp.get("IsTruncated"):
                return listed_paths(names, prefix, chunked=True)
            kwargs["ContinuationToken"] = resp["NextContinuationToken"]

    def __repr__(self) -> str:
        return f"S3Root({self.url!r}, endpoint={self.endpoint_url!r})"


class S3Driver(ChunkedDriver):
    """Segment stored as chunk objects, sealed by server-side composition (see module doc)."""

    supports_append = False
    needs_seal = True
    root: S3Root

    def __init__(self, root: S3Root, path: str) -> None:
        super().__init__(root, path, root.key_for(path))
        # CRC32C of chunks this instance wrote, keyed by (key, ETag) so that a chunk replaced
        # behind our back is never matched: lets seal skip one HEAD per chunk.
        self._written_crcs: dict[tuple[str, str], int] = {}

    def __getstate__(self) -> dict[str, object]:
        state = super().__getstate__()
        state["_written_crcs"] = {}
        return state

    @classmethod
    def open_root(cls, url: str, storage_options: Mapping[str, Any] | None = None) -> S3Root:
        # docstring inherited
        return S3Root(url, storage_options)

    # ------------------------------------------------------------------ mutations: probe first
    async def create(self) -> None:
        # docstring inherited
        await self.root.check_capabilities()
        await super().create()

    async def write(self, position: int, data: bytes) -> None:
        # docstring inherited
        await self.root.check_capabilities()
        try:
            await super().write(position, data)
        except OverwriteDetectedError as e:
            self.root.distrust_preconditions(str(e))
            raise

    async def seal(self) -> None:
        # docstring inherited
        await self.root.check_capabilities()
        await super().seal()

    async def delete(self) -> None:
        # docstring inherited
        await self.root.check_capabilities()
        await super().delete()

    # ------------------------------------------------------------------ primitives
    async def _list(self) -> Listing:
        prefix = self.key + ".chunks/"
        sealed: ObjectInfo | None = None
        chunks: list[ObjectInfo] = []
        kwargs: dict[str, Any] = {"Prefix": self.key}
        while True:
            resp = await self.root.call("list_objects_v2", **kwargs)
            for obj in resp.get("Contents", []):
                k = obj["Key"]
                info = ObjectInfo(k, int(obj["Size"]), obj.get("ETag"))
                if k == self.key:
                    sealed = info
                elif k.startswith(prefix):
                    chunks.append(info)
                elif k > prefix:
                    # Listing is sorted: everything from here on is a sibling sharing our prefix.
                    return Listing(sealed, tuple(chunks))
            if not resp.get("IsTruncated"):
                return Listing(sealed, tuple(chunks))
            kwargs["ContinuationToken"] = resp["NextContinuationToken"]

    async def _put_chunk(self, position: int, data: bytes, replace: Chunk | None) -> Chunk:
        key = chunk_key(self.key, position)
        crc = crc32c(data)
        kwargs: dict[str, Any] = {"Body": RequestBody(data), "Metadata": {CRC_META: f"{crc:08x}"}}
        if self.root.conditional_writes:
            if replace is None:
                kwargs["IfNoneMatch"] = "*"
            elif replace.etag:
                kwargs["IfMatch"] = replace.etag
        resp = await self.root.call("put_object", key=key, **kwargs)
        etag = resp.get("ETag")
        if etag:
            self._written_crcs[(key, etag)] = crc
        return Chunk(position, len(data), key, etag)

    def _blind_first_write(self) -> bool:
        return self.root.conditional_writes

    def _listed_empty(self) -> bool:
        return self.root.listed_empty(self.key)

    async def _put_object(self, key: str, data: bytes) -> None:
        await self.root.call("put_object", key=key, Body=data)

    async def _get(self, key: str, start: int, end: int) -> bytes:
        if end <= start:
            return b""
        return await self._ranged_get(
            key,
            start,
            end - start,
            receive=functools.partial(self._read_lean, key, start, end),
            regular=functools.partial(self._get_regular, key, start, end),
        )

    async def _ranged_get(
        self,
        key: str,
        start: int,
        length: int,
        *,
        receive: Callable[[Any], Awaitable[_T]],
        regular: Callable[[], Awaitable[_T]],
    ) -> _T:
        """One ranged GET: tierd's lean GET where the client allows it (``receive`` takes its
        response), else ``regular()``, botocore's (see :meth:`LeanGet.get`)."""
        lean = await self.root.lean_get()
        if lean is None:
            return await regular()
        return await lean.get(key, start, length, receive=receive, regular=regular)

    async def _get_regular(self, key: str, start: int, end: int) -> bytes:
        resp = await self.root.call("get_object", key=key, Range=f"bytes={start}-{end - 1}")
        body = resp["Body"]
        try:
            data: bytes = await body.read()
        except Exception as e:
            raise map_s3_error(e, op="get_object", bucket=self.root.bucket, key=key) from e
        finally:
            body.close()
        return _cut(data, start, end, ranged=bool(resp.get("ContentRange")))

    async def _read_lean(self, key: str, start: int, end: int, response: Any) -> bytes:
        try:
            data: bytes = await response.read()
        except Exception as e:
            raise map_s3_error(e, op="get_object", bucket=self.root.bucket, key=key) from e
        return _cut(data, start, end, ranged="Content-Range" in response.headers)

    async def _get_into(self, key: str, start: int, out: memoryview) -> None:
        """The body of a ranged GET received piece by piece straight into ``out`` (the caller's
        reused memory), as aiohttp hands the pieces over. ``body.read()`` would keep every piece
        until the end and join them into a new object: the body's size in fresh memory twice per
        GET, ~2,000 page faults and 5-6 ms of system time for 4 MiB (docs/performance.md, P3).

        The request is tierd's lean GET where the client allows it (~1.1 ms less CPU per
        request than botocore's; :mod:`tierd.drivers.s3fastget`), botocore's otherwise and whenever a lean
        one is not served; the body is received, checked and its failures mapped the same way
        on both."""
        length = out.nbytes
        if length == 0:
            return
        received = await self._ranged_get(
            key,
            start,
            length,
            receive=functools.partial(self._receive_lean, key, start, out),
            regular=functools.partial(self._get_into_regular, key, start, out),
        )
        if received != length:
            raise CorruptionError(
                f"s3://{self.root.bucket}/{key}: ranged GET of {length} bytes at {start} returned {received}",
                key=key,
                start=start,
                length=length,
                received=received,
            )

    async def _get_into_regular(self, key: str, start: int, out: memoryview) -> int:
        length = out.nbytes
        resp = await self.root.call("get_object", key=key, Range=f"bytes={start}-{start + length - 1}")
        body = resp["Body"]
        try:
            ranged = bool(resp.get("ContentRange")) or resp.get("ContentLength") == length
            return await self._receive(key, start, out, ranged, body.read, body_pieces(body))
        finally:
            body.close()

    async def _receive_lean(self, key: str, start: int, out: memoryview, response: Any) -> int:
        ranged = "Content-Range" in response.headers or response.content_length == out.nbytes
        return await self._receive(key, start, out, ranged, response.read, response.content.readany)

    async def _receive(
        self,
        key: str,
        start: int,
        out: memoryview,
        ranged: bool,
        read_all: Callable[[], Awaitable[bytes]],
        pieces: Callable[[], Awaitable[bytes]],
    ) -> int:
        """A ranged GET's body into ``out``; returns the bytes it held. A server that ignores
        ``Range`` answers 200 with the whole object (no ``Content-Range``, another length; the
        probe reports it): that object is read and the range cut from it."""
        try:
            if not ranged:
                data = await read_all()
                out[:] = data[start : start + out.nbytes]
                return out.nbytes
            return await fill_from(pieces, out)
        except Exception as e:
            raise map_s3_error(e, op="get_object", bucket=self.root.bucket, key=key) from e

    async def _iter_object(self, key: str) -> AsyncIterator[bytes]:
        resp = await self.root.call("get_object", key=key)
        body = resp["Body"]
        try:
            while True:
                try:
                    piece: bytes = await body.read(VERIFY_PIECE)
                except Exception as e:
                    raise map_s3_error(e, op="get_object", bucket=self.root.bucket, key=key) from e
                if not piece:
                    return
                yield piece
        finally:
            body.close()

    async def _delete_keys(self, keys: Sequence[str]) -> None:
        if self.root.policy is not None and not self.root.policy.batch_delete:
            for key in keys:  # the server does not implement DeleteObjects (see the probe)
                with contextlib.suppress(SegmentNotFoundError):
                    await self.root.call("delete_object", key=key)
            return
        for i in range(0, len(keys), 1000):
            batch = keys[i : i + 1000]
            resp = await self.root.call(
                "delete_objects", Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True}
            )
            errors = [e for e in resp.get("Errors", []) if e.get("Code") != "NoSuchKey"]
            if errors:
                first = errors[0]
                raise BackendError(
                    f"S3 delete_objects failed for {len(errors)} keys, e.g. {first.get('Key')!r}: "
                    f"{first.get('Code')}: {first.get('Message')}",
                    bucket=self.root.bucket,
                )

    async def _chunk_crcs(self, chunks: Sequence[Chunk]) -> list[int]:
        sem = asyncio.Semaphore(_PARALLEL)

        async def one(c: Chunk) -> int:
            if c.length == 0:
                return 0
            if c.etag and (c.key, c.etag) in self._written_crcs:
                return self._written_crcs[(c.key, c.etag)]
            async with sem:
                trusted = self.root.policy is None or self.root.policy.trust_crc_metadata
                head = await self.root.call("head_object", key=c.key) if trusted else {}
                stored = (head.get("Metadata") or {}).get(CRC_META)
                if stored:
                    return int(stored, 16)
                # Written by something else (a backdoor, an older tool): compute it.
                return crc32c(await self._get(c.key, 0, c.length))

        return list(await asyncio.gather(*(one(c) for c in chunks)))

    async def _compose(self, layout: Layout) -> None:
        parts = plan_parts(
            layout.chunks, min_part=self.root.min_part_size, allow_copy=self.root.server_side_copy
        )
        if len(parts) > MAX_PARTS:
            raise BackendError(
                f"segment {self.path!r} would need {len(parts)} multipart parts (S3 allows {MAX_PARTS}); "
                "commit in larger batches",
                path=self.path,
            )
        # CRC of chunks we download whole comes for free; the others are read from metadata.
        known: dict[int, int] = {}
        if len(parts) == 1 and not parts[0].copy:
            data = await self._download(parts[0], known)
            await self.root.call("put_object", key=self.key, Body=RequestBody(data))
        else:
            await self._multipart(parts, known)
        rest = [c for c in layout.chunks if c.position not in known]
        for c, crc in zip(rest, await self._chunk_crcs(rest), strict=True):
            known[c.position] = crc
        try:
            self.sealed_crc32c = await self._verify(
                self.key, layout.chunks, [known[c.position] for c in layout.chunks], layout.size
            )
        except (CorruptionError, BackendError):
            with contextlib.suppress(BackendError, SegmentNotFoundError):
                await self._delete_keys([self.key])
            raise

    async def _download(self, part: Part, known: dict[int, int]) -> bytes:
        pieces = await asyncio.gather(*(self._get(c.key, s, e) for c, s, e in part.pieces))
        for (c, s, e), data in zip(part.pieces, pieces, strict=True):
            if s == 0 and e == c.length:
                known[c.position] = crc32c(data)
        return b"".join(pieces)

    async def _multipart(self, parts: Sequence[Part], known: dict[int, int]) -> None:
        resp = await self.root.call("create_multipart_upload", key=self.key)
        upload_id = resp["UploadId"]
        try:
            done: list[dict[str, Any]] = []
            for number, part in enumerate(parts, start=1):
                if part.copy:
                    chunk, start, end = part.pieces[0]
                    kwargs: dict[str, Any] = {"CopySource": {"Bucket": self.root.bucket, "Key": chunk.key}}
                    if start or end != chunk.length:
                        kwargs["CopySourceRange"] = f"bytes={start}-{end - 1}"
                    r = await self.root.call(
                        "upload_part_copy", key=self.key, UploadId=upload_id, PartNumber=number, **kwargs
                    )
                    etag = r["CopyPartResult"]["ETag"]
                else:
                    body = await self._download(part, known)
                    r = await self.root.call(
                        "upload_part",
                        key=self.key,
                        UploadId=upload_id,
                        PartNumber=number,
                        Body=RequestBody(body),
                    )
                    etag = r["ETag"]
                done.append({"PartNumber": number, "ETag": etag})
            await self.root.call(
                "complete_multipart_upload",
                key=self.key,
                UploadId=upload_id,
                MultipartUpload={"Parts": done},
            )
        except BaseException:
            with contextlib.suppress(Exception):
                await self.root.call("abort_multipart_upload", key=self.key, UploadId=upload_id)
            raise


def _cut(data: bytes, start: int, end: int, *, ranged: bool) -> bytes:
    """The bytes ``[start, end)`` of an object from a ranged GET's body ``data``: the body itself,
    unless the server ignored ``Range`` and answered 200 with the whole object (no
    ``Content-Range``, more bytes; the probe reports such servers)."""
    if len(data) != end - start and not ranged and len(data) >= end:
        return data[start:end]
    return data


def body_pieces(body: Any) -> Callable[[], Awaitable[bytes]]:
    """How to take a GET response body (botocore's ``StreamingBody``) piece by piece: the piece
    aiohttp received (``readany``) where the body is aiohttp's stream, :data:`RECEIVE_PIECE`
    bytes at a time otherwise (another HTTP backend)."""
    content = getattr(getattr(body, "raw_stream", None), "content", None)
    readany = getattr(content, "readany", None)
    if readany is not None:
        return readany  # type: ignore[no-any-return]
    return functools.partial(body.read, RECEIVE_PIECE)


async def receive_into(body: Any, out: memoryview) -> int:
    """Copy a GET response body into ``out`` as it arrives (:func:`fill_from` with
    :func:`body_pieces`); returns the bytes received."""
    return await fill_from(body_pieces(body), out)


async def fill_from(piece: Callable[[], Awaitable[bytes]], out: memoryview) -> int:
    """Copy the pieces ``piece()`` returns into ``out`` until an empty one; returns the bytes
    received (more than ``out`` holds is an error, never an overrun). Each piece is copied and
    dropped at once, so the transient memory is a few socket reads' worth, reused by the
    allocator from one piece to the next."""
    pos = 0
    while chunk := await piece():
        end = pos + len(chunk)
        if end > out.nbytes:
            raise CorruptionError(
                f"GET response body is longer than the {out.nbytes} bytes asked for",
                length=out.nbytes,
            )
        out[pos:end] = chunk
        pos = end
    return pos


#: botocore client settings operators write at the top level of ``storage_options`` (as in the
#: AWS CLI's config); s3fs wants them inside ``client_kwargs``.
CLIENT_KEYS = ("region_name", "verify", "use_ssl")


def s3fs_options(storage_options: Mapping[str, Any]) -> dict[str, Any]:
    """``storage_options`` as s3fs takes them: ``region_name`` (and the other botocore client
    settings in :data:`CLIENT_KEYS`) move into ``client_kwargs`` so the natural spelling works."""
    options = dict(storage_options)
    client = dict(options.pop("client_kwargs", None) or {})
    for key in CLIENT_KEYS:
        if key in options:
            client.setdefault(key, options.pop(key))
    if client:
        options["client_kwargs"] = client
    return options
