"""What an S3-compatible server really does: a capability probe, and the write policy it implies.

"S3-compatible" servers differ exactly where tierd's safety lives. Some accept
``If-None-Match: *`` on an existing key with a 200 and overwrite it, ignore ``If-Match`` with a
wrong ETag, answer 501 to ``UploadPartCopy``, or return the whole object for ``Range: bytes=0-0``.
Each chunk carries its own CRC32C, so an overwritten chunk still verifies: a server that ignores
preconditions can silently replace committed bytes. Hence, before the first write through an
:class:`~tierd.drivers.s3.S3Root`, :func:`probe_server` tries each behaviour tierd relies on, in a
scratch key under the root's prefix (names that listings hide, removed at the end):

1. a create-only PUT (``If-None-Match: *``) over an existing object must be refused (412, or 409
   for a concurrent conflict) and leave the original bytes;
2. a PUT with ``If-Match`` and a wrong ETag must be refused the same way;
3. user metadata (``x-amz-meta-tierd-crc32c``) must come back from ``HeadObject``;
4. ``Range: bytes=0-0`` must return one byte (and a middle range the right bytes);
5. ``ListMultipartUploads`` must list an upload in progress;
6. a one-part ``UploadPartCopy`` must compose the object (else a plain multipart upload must);
7. ``DeleteObjects`` must delete a batch.

About 14 requests: well under a second on any reachable server. Verdicts are cached per
endpoint and bucket for the life of the process (:func:`cached_probe`).

:func:`decide` turns a verdict and the ``[backend]`` settings into a :class:`WritePolicy`: which
safety features the driver uses, and whether writing is refused. A server that ignores
preconditions is refused — one :class:`~tierd.errors.UnsafeBackendError` naming what it did and
the opt-out — unless the operator declares single-writer mode (``single_writer = true``); missing
server-side copy selects the download-and-reupload seal; a whole-object answer to a range is
worked around (the driver slices it); wrong range bytes, or no multipart uploads, are refused.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from tierd.drivers._chunks import ChunkConflictError, crc32c
from tierd.drivers._objects import TEMP_MARKER
from tierd.errors import BackendError, SegmentNotFoundError

if TYPE_CHECKING:
    from tierd.drivers.s3 import S3Root

__all__ = [
    "RangeBehaviour",
    "S3Capabilities",
    "WritePolicy",
    "cached_probe",
    "decide",
    "forget_probes",
    "probe_server",
]

#: ``exact``: ranges honoured; ``whole-object``: the server ignores ``Range`` and sends everything
#: (worked around by slicing); ``wrong``: other bytes come back (refused).
RangeBehaviour = Literal["exact", "whole-object", "wrong"]
#: User metadata key holding a chunk's CRC32C (mirrors ``tierd.drivers.s3.CRC_META``).
CRC_META = "tierd-crc32c"
#: S3 error codes / HTTP statuses meaning "this server does not implement that", as opposed to a
#: fault worth retrying (those propagate and nothing is cached).
_UNSUPPORTED_CODES = frozenset(
    {"NotImplemented", "InvalidRequest", "InvalidArgument", "MethodNotAllowed", "UnsupportedOperation"}
)
_UNSUPPORTED_STATUS = frozenset({400, 405, 501})
_BODY = b"tierd capability probe 0123456789 abcdefghij"
_WRONG_ETAG = '"00000000000000000000000000000000"'

_cache: dict[tuple[str, str], S3Capabilities] = {}


@dataclass(frozen=True, slots=True)
class S3Capabilities:
    """The probe's verdict on one server (endpoint) and bucket. Plain data: pickles and renders
    as JSON (:meth:`as_dict`)."""

    endpoint: str
    bucket: str
    #: ``If-None-Match: *`` on an existing object is refused and the original bytes kept.
    conditional_create: bool
    #: ``If-Match`` with a wrong ETag is refused and the original bytes kept.
    conditional_replace: bool
    #: ``x-amz-meta-*`` written with an object come back from ``HeadObject``.
    user_metadata: bool
    range_reads: RangeBehaviour
    #: Multipart uploads work at all (needed to seal segments over 5 MiB).
    multipart_upload: bool
    #: ``ListMultipartUploads`` lists an upload in progress (cleanup of crashed seals).
    multipart_listing: bool
    #: ``UploadPartCopy`` composes objects on the server.
    server_side_copy: bool
    #: ``DeleteObjects`` deletes a batch.
    batch_delete: bool
    #: Wall time of the probe and when it ran (epoch seconds).
    seconds: float
    probed_at: float
    #: One sentence per deviation from S3, naming what the server did.
    findings: tuple[str, ...] = field(default=())

    @property
    def preconditions(self) -> bool:
        """Both preconditions tierd sends are enforced: conditional writes can be trusted."""
        return self.conditional_create and self.conditional_replace

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["findings"] = list(self.findings)
        out["preconditions"] = self.preconditions
        return out


@dataclass(frozen=True, slots=True)
class WritePolicy:
    """How a root writes, given a verdict and the ``[backend]`` settings (see :func:`decide`)."""

    #: Send ``If-None-Match``/``If-Match`` on chunk PUTs (and allow blind first writes).
    conditional_writes: bool
    server_side_copy: bool
    batch_delete: bool
    #: Trust the CRC32C stored in chunk metadata at seal time (else recompute by downloading).
    trust_crc_metadata: bool
    #: ``multi-writer``: preconditions protect committed bytes against any other writer;
    #: ``single-writer``: the operator promised one writer (``backend.single_writer``);
    #: ``refused``: writing would risk committed data (:attr:`refusal` says why).
    mode: Literal["multi-writer", "single-writer", "refused"]
    refusal: str | None = None
    warnings: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["warnings"] = list(self.warnings)
        return out


# ---------------------------------------------------------------------------------- the probe
def _status(err: BaseException) -> int | None:
    seen: BaseException | None = err
    for _ in range(5):
        if seen is None:
            return None
        response = getattr(seen, "response", None)
        if isinstance(response, dict):
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            return int(status) if status is not None else None
        seen = seen.__cause__
    return None


def _unsupported(err: BackendError) -> bool:
    """True when ``err`` says the server does not implement a request (vs. a fault)."""
    if isinstance(err, SegmentNotFoundError):
        return False
    return str(err.detail.get("s3_code", "")) in _UNSUPPORTED_CODES or _status(err) in _UNSUPPORTED_STATUS


def _describe(err: BackendError) -> str:
    status = _status(err)
    code = err.detail.get("s3_code") or type(err).__name__
    return f"HTTP {status} {code}" if status else str(code)


async def _read(root: S3Root, key: str, range_header: str | None = None) -> bytes:
    kwargs: dict[str, Any] = {"Range": range_header} if range_header else {}
    resp = await root.call("get_object", key=key, **kwargs)
    body = resp["Body"]
    try:
        data: bytes = await body.read()
    finally:
        body.close()
    return data


async def _conditional_put(root: S3Root, key: str, body: bytes, **condition: Any) -> str:
    """PUT with a precondition that must fail; returns ``refused``, ``accepted`` or ``unsupported``
    (with the reason)."""
    try:
        await root.call("put_object", key=key, Body=body, **condition)
    except ChunkConflictError:
        return "refused"
    except BackendError as e:
        if e.detail.get("s3_code") == "ConditionalRequestConflict":
            return "refused"
        if _unsupported(e):
            return f"unsupported ({_describe(e)})"
        raise
    return "accepted"


async def probe_server(root: S3Root) -> S3Capabilities:
    """Probe the server behind ``root`` (see the module docstring). Faults that are not "not
    implemented" answers (unreachable endpoint, AccessDenied, missing bucket) propagate as the
    usual :class:`~tierd.errors.BackendError`; the scratch objects are removed either way."""
    started, wall = time.perf_counter(), time.time()
    token = uuid.uuid4().hex
    base = f"{root.prefix}/" if root.prefix else ""
    obj, copy = (f"{base}tierd-probe-{role}{TEMP_MARKER}{token}" for role in ("object", "copy"))
    findings: list[str] = []
    upload_id: str | None = None
    try:
        crc = f"{crc32c(_BODY):08x}"
        first = await _conditional_put(root, obj, _BODY, IfNoneMatch="*", Metadata={CRC_META: crc})
        if first != "accepted":
            # The header itself is rejected: store the object plainly so the other checks run.
            await root.call("put_object", key=obj, Body=_BODY, Metadata={CRC_META: crc})
        head = await root.call("head_object", key=obj)
        user_metadata = (head.get("Metadata") or {}).get(CRC_META) == crc
        if not user_metadata:
            findings.append("drops user metadata (x-amz-meta-*): seal recomputes chunk CRCs by downloading")

        create_body, replace_body = b"probe: create-only PUT over it", b"probe: PUT with a wrong If-Match"
        create = await _conditional_put(root, obj, create_body, IfNoneMatch="*")
        replace = await _conditional_put(root, obj, replace_body, IfMatch=_WRONG_ETAG)
        current = await _read(root, obj)
        conditional_create = create == "refused" and current != create_body
        conditional_replace = replace == "refused" and current != replace_body
        if create != "refused":
            what = "answered 200 and overwrote it" if create == "accepted" else f"rejected it: {create}"
            findings.append(f"ignores If-None-Match: * on an existing object ({what})")
        elif not conditional_create:
            findings.append("answered 412 to If-None-Match: * but changed the object anyway")
        if replace != "refused":
            what = "answered 200 and overwrote it" if replace == "accepted" else f"rejected it: {replace}"
            findings.append(f"ignores If-Match with a wrong ETag ({what})")
        elif not conditional_replace:
            findings.append("answered 412 to a wrong If-Match but changed the object anyway")

        range_reads: RangeBehaviour = "exact"
        for header, want in (("bytes=0-0", current[:1]), ("bytes=2-4", current[2:5])):
            got = await _read(root, obj, header)
            if got == want:
                continue
            if got == current:
                range_reads = "whole-object"
                findings.append(f"returns the whole object for Range: {header} (worked around by slicing)")
            else:
                range_reads = "wrong"
                findings.append(f"returns {len(got)} wrong bytes for Range: {header}")
                break

        multipart_upload = multipart_listing = server_side_copy = False
        try:
            upload_id = str((await root.call("create_multipart_upload", key=copy))["UploadId"])
            multipart_upload = True
        except BackendError as e:
            if not _unsupported(e):
                raise
            findings.append(f"refuses multipart uploads ({_describe(e)}): segments cannot be sealed")
        if upload_id is not None:
            try:
                listed = await root.call("list_multipart_uploads", Prefix=copy)
                multipart_listing = any(u.get("UploadId") == upload_id for u in listed.get("Uploads", []))
                if not multipart_listing:
                    findings.append("ListMultipartUploads does not list an upload in progress")
            except BackendError as e:
                if not _unsupported(e):
                    raise
                findings.append(f"does not implement ListMultipartUploads ({_describe(e)})")
            server_side_copy, part = await _compose_one_part(root, obj, copy, upload_id, current, findings)
            await root.call(
                "complete_multipart_upload",
                key=copy,
                UploadId=upload_id,
                MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part}]},
            )
            upload_id = None
            composed = await _read(root, copy)
            if composed != current:
                server_side_copy = False
                multipart_upload = False
                findings.append("multipart upload composed wrong bytes: segments cannot be sealed")

        batch_delete = True
        try:
            batch = {"Objects": [{"Key": obj}, {"Key": copy}], "Quiet": True}
            resp = await root.call("delete_objects", Delete=batch)
            if resp.get("Errors"):
                batch_delete = False
        except BackendError as e:
            if not _unsupported(e):
                raise
            batch_delete = False
        if batch_delete:
            try:
                await root.call("head_object", key=obj)
                batch_delete = False
            except SegmentNotFoundError:
                pass
        if not batch_delete:
            findings.append("DeleteObjects does not delete a batch: objects are deleted one by one")
    finally:
        with contextlib.suppress(Exception):
            if upload_id is not None:
                await root.call("abort_multipart_upload", key=copy, UploadId=upload_id)
        for key in (obj, copy):
            with contextlib.suppress(Exception):
                await root.call("delete_object", key=key)
    return S3Capabilities(
        endpoint=root.endpoint_url or "aws",
        bucket=root.bucket,
        conditional_create=conditional_create,
        conditional_replace=conditional_replace,
        user_metadata=user_metadata,
        range_reads=range_reads,
        multipart_upload=multipart_upload,
        multipart_listing=multipart_listing,
        server_side_copy=server_side_copy,
        batch_delete=batch_delete,
        seconds=round(time.perf_counter() - started, 4),
        probed_at=wall,
        findings=tuple(findings),
    )


async def _compose_one_part(
    root: S3Root, source: str, dest: str, upload_id: str, data: bytes, findings: list[str]
) -> tuple[bool, str]:
    """Part 1 of ``dest``: an ``UploadPartCopy`` of ``source`` if the server does it (True), else
    an uploaded part (False). Returns (copied on the server, part ETag)."""
    try:
        r = await root.call(
            "upload_part_copy",
            key=dest,
            UploadId=upload_id,
            PartNumber=1,
            CopySource={"Bucket": root.bucket, "Key": source},
        )
        return True, str(r["CopyPartResult"]["ETag"])
    except BackendError as e:
        if not _unsupported(e):
            raise
        findings.append(f"does not implement UploadPartCopy ({_describe(e)}): seals download and re-upload")
    r = await root.call("upload_part", key=dest, UploadId=upload_id, PartNumber=1, Body=data)
    return False, str(r["ETag"])


async def cached_probe(root: S3Root) -> S3Capabilities:
    """The verdict for ``root``'s endpoint and bucket: probed once per process, then cached."""
    key = (root.endpoint_url or "", root.bucket)
    found = _cache.get(key)
    if found is None:
        found = await probe_server(root)
        _cache[key] = found
    return found


def forget_probes() -> None:
    """Drop every cached verdict (tests, or after a server was upgraded in place)."""
    _cache.clear()


# --------------------------------------------------------------------------------- the policy
def decide(
    caps: S3Capabilities,
    *,
    conditional_writes: bool | None = None,
    server_side_copy: bool | None = None,
    single_writer: bool = False,
    url: str = "",
) -> WritePolicy:
    """The :class:`WritePolicy` for a verdict and the ``[backend]`` settings (``None`` = follow
    the probe). Refuses — :attr:`WritePolicy.refusal` set — when writing could overwrite or
    misread committed bytes and the operator did not accept it."""
    where = f"S3 server {caps.endpoint} (bucket {caps.bucket!r})"
    refusals: list[str] = []
    warnings: list[str] = []
    if caps.range_reads == "wrong":
        refusals.append(f"{where} returns wrong bytes for ranged reads; tierd cannot read segments from it")
    if not caps.multipart_upload:
        refusals.append(f"{where} refuses multipart uploads, which sealing segments needs")
    cw = caps.preconditions if conditional_writes is None else conditional_writes
    behaviour = "; ".join(f for f in caps.findings if "If-" in f) or "ignores preconditions"
    if conditional_writes and not caps.preconditions:
        refusals.append(
            f"backend.conditional_writes = true, but {where} {behaviour}. Remove the setting and, if "
            "exactly one tierd process ever writes under this prefix, set backend.single_writer = true"
        )
    elif not cw and not single_writer:
        if caps.preconditions:
            refusals.append(
                "backend.conditional_writes = false turns off tierd's protection against overwriting "
                "committed chunks; set backend.single_writer = true to accept that (one writer only)"
            )
        else:
            refusals.append(
                f"{where} {behaviour}. Without preconditions a second writer — or a delayed retry — can "
                "overwrite committed segment bytes and nothing would notice, so tierd will not tier to it. "
                f"If exactly one tierd process ever writes under {url or 'backend.url'}, set "
                "backend.single_writer = true (TIERD_BACKEND__SINGLE_WRITER=true) to accept it"
            )
    elif not cw:
        warnings.append(
            f"{where} {behaviour}: single-writer mode (backend.single_writer = true) — every write lists "
            "first and nothing protects committed bytes against a second writer"
        )
    ssc = caps.server_side_copy if server_side_copy is None else server_side_copy
    if server_side_copy and not caps.server_side_copy:
        warnings.append(f"backend.server_side_copy = true, but {where} failed a one-part UploadPartCopy")
    if caps.range_reads == "whole-object":
        warnings.append(f"{where} ignores Range headers: every read downloads whole objects")
    if refusals:
        mode: Literal["multi-writer", "single-writer", "refused"] = "refused"
    else:
        mode = "single-writer" if single_writer or not cw else "multi-writer"
    return WritePolicy(
        conditional_writes=cw and not refusals,
        server_side_copy=ssc,
        batch_delete=caps.batch_delete,
        trust_crc_metadata=caps.user_metadata,
        mode=mode,
        refusal=" — and ".join(refusals) if refusals else None,
        warnings=tuple(warnings),
    )
