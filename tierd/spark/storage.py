"""Synchronous, read-only access to a cold tier through fsspec — what Spark tasks need.

Why not the async segment drivers: a Spark task is one short synchronous function in a worker
process that holds nothing but the bucket URL and the storage options. fsspec's sync API (s3fs
runs its own I/O thread) fits that shape; an event loop per task and the drivers' write-side
machinery would not. What *is* shared with the drivers is the layout knowledge: paths come
from :mod:`tierd.drivers.paths` / :mod:`tierd.tiered.manifest`, and the chunk scheme of open
segments on object stores (FORMATS §2.3) is validated by :meth:`tierd.drivers.Layout.build`,
so a gap or an overlap between chunks is reported exactly as the drivers report it.

Instances are made inside ``partitions()``/``read()`` and never pickled; the plain data needed to
make one (URL + options) is what travels to workers.
"""

from __future__ import annotations

import bisect
import json
import os
import socket
import threading
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

from tierd.drivers import CHUNK_DIR_SUFFIX, Layout, Listing, ObjectInfo
from tierd.errors import (
    BackendError,
    CorruptionError,
    CredentialsError,
    InvalidArgumentError,
    SegmentNotFoundError,
    TierdError,
)

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

__all__ = ["STATS_ENV", "ColdStorage", "SegmentSource", "credentials_advice", "open_storage", "report_stats"]

#: Diagnostics: when set to a file path, every planning and every task appends one JSON line
#: with the requests it sent and the bytes it read (``bench/spark_read.py`` uses it).
STATS_ENV: Final = "TIERD_SPARK_STATS"
#: botocore's names for "no usable credentials" (raised before any request is sent).
_NO_CREDENTIALS = frozenset({"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"})
#: S3 error codes that mean "these credentials are not accepted".
_REJECTED = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken", "AccessDenied")

#: Protocols whose data lives in one process: a Spark worker could never see it.
_PROCESS_LOCAL = frozenset({"memory"})
#: Object stores whose fsspec ``find`` takes a key prefix (one listing per segment).
_PREFIX_LISTING = frozenset({"s3", "s3a"})


def _missing(url: str) -> SegmentNotFoundError:
    """A segment the manifest names is not stored (any more)."""
    return SegmentNotFoundError(
        f"segment {url} does not exist (deleted by cold retention since planning, or the manifest is stale)",
        path=url,
    )


class SegmentSource:
    """One commitlog or consume-queue segment as it is stored *now*: a single object (sealed, or
    a posix file still being appended to) or the committed chunks of an open segment."""

    def __init__(
        self, storage: ColdStorage, path: str, layout: Layout | None, size: int, *, listed: bool = True
    ) -> None:
        self.storage = storage
        #: Full fsspec path of the segment (the sealed object's key).
        self.path = path
        self._layout = layout
        #: Bytes readable right now (for a sealed segment taken on the manifest's word: its size).
        self.size = size
        #: False when nothing was asked of the store yet (a sealed segment known from its manifest).
        self.listed = listed

    @property
    def url(self) -> str:
        """Where the segment is, for error messages."""
        return self.storage.display(self.path)

    def read_end(self, start: int, limit: int, end: int) -> int:
        """Where a read from ``start`` of about ``limit`` bytes should stop (at most ``end``).

        A sealed object is cut anywhere. An open segment is cut at a chunk boundary when one
        lies in ``(start, start + limit]``: each chunk is one commit of whole records, so such a
        read is whole objects — no GET of part of a chunk, no record cut across reads. A chunk
        larger than ``limit`` is read in ``limit`` slices."""
        hi = min(end, start + limit)
        if self._layout is None or hi >= end:
            return hi
        positions = self._layout.positions
        i = bisect.bisect_right(positions, hi) - 1  # last chunk starting at or before hi
        return positions[i] if positions[i] > start else hi

    def read(self, start: int, end: int, *, records: bool = False) -> bytes:
        """Bytes ``[start, end)``; a short read is corruption (the object shrank or lied).

        The chunks of an open segment that the span touches are fetched concurrently (one
        fsspec ``cat_ranges``) and joined only if there are several. ``records``: the bytes are
        commitlog records that the caller checks record by record (see
        :meth:`ColdStorage.records_fs`)."""
        if end <= start:
            return b""
        spans = self.spans(start, end)
        try:
            if len(spans) == 1:
                data = self.storage.cat(*spans[0], records=records)
            else:
                data = b"".join(self.storage.cat_spans(spans, records=records))
        except SegmentNotFoundError as e:
            if self._layout is not None and self._sealed_since():
                return self.read(start, end, records=records)
            raise _missing(self.url) from e
        except BackendError:
            self._check_size()  # a range past the end of a shorter object fails on S3 (416)
            raise
        self.expect(start, end, data)
        return data

    def expect(self, start: int, end: int, data: bytes) -> None:
        """``data``, read as bytes ``[start, end)``, must be that long: a short read is
        corruption (the object shrank or lied)."""
        if len(data) != end - start:
            self._check_size()
            raise CorruptionError(
                f"{self.url}: read of bytes [{start}, {end}) returned {len(data)} bytes",
                path=self.url,
                start=start,
                end=end,
            )

    def _sealed_since(self) -> bool:
        """Sealing composes the chunks into one object, then deletes them: a chunk that vanished
        under a read may mean the segment is sealed now. If so, read the sealed object from here
        on (the same bytes: sealing verified them)."""
        now = self.storage.segment(self.storage.relative(self.path))
        if now._layout is not None or now.size < self.size:
            return False
        self._layout = None
        return True

    def spans(self, start: int, end: int) -> list[tuple[str, int, int]]:
        """Bytes ``[start, end)`` of the segment as ``(object path, start, end)`` ranges of the
        objects that hold them: the sealed object, or the chunks the span touches."""
        if self._layout is None:
            return [(self.path, start, end)]
        return self._layout.pieces(start, end)

    def _check_size(self) -> None:
        """A sealed segment read on its manifest's word: does the object hold what was promised?"""
        if self.listed:
            return
        actual = self.storage.segment(self.storage.relative(self.path)).size
        if actual < self.size:
            raise CorruptionError(
                f"{self.url}: the manifest promises at least {self.size} bytes, the segment holds {actual}",
                path=self.url,
                promised=self.size,
                size=actual,
            )


class ColdStorage:
    """A cold-tier root (``s3://bucket/prefix``, ``file:///dir``, any fsspec URL) opened for reading."""

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        from fsspec.core import url_to_fs

        scheme = urlsplit(url).scheme
        if scheme in _PROCESS_LOCAL:
            raise InvalidArgumentError(
                f"option path: {url!r} lives in one process's memory, which Spark workers cannot "
                "see; write the cold tier to s3:// or file:// instead",
                path=url,
            )
        options = dict(storage_options or {})
        if scheme in ("s3", "s3a"):
            # Listings must be fresh: the daemon keeps writing while we plan (NOTES: s3fs caches).
            options.setdefault("skip_instance_cache", True)
        try:
            fs, root = url_to_fs(url, **options)
        except (TypeError, ValueError) as e:
            raise InvalidArgumentError(
                f"option storage_options is not valid for {scheme or 'file'}:// ({e})",
                options=sorted(options),
            ) from e
        except ImportError as e:
            raise InvalidArgumentError(
                f"option path: no filesystem installed for {url!r} ({e}); pip install 'tierd[spark]'",
                path=url,
            ) from e
        self.url = url.rstrip("/")
        self.fs: Any = fs
        self.root = root.rstrip("/")
        self.scheme = scheme or "file"
        self._options = options
        self._records_fs: Any = None
        #: Requests sent and bytes read so far (this process; diagnostics and benchmarks).
        self.requests = 0
        self.bytes_read = 0

    # ------------------------------------------------------------------ naming
    def full(self, rel: str) -> str:
        """fsspec path of ``rel`` (a cold-tier path such as a manifest or segment path)."""
        return f"{self.root}/{rel}" if self.root else rel

    def relative(self, full: str) -> str:
        """The cold-tier path of fsspec path ``full`` (inverse of :meth:`full`)."""
        return full[len(self.root) :].lstrip("/") if full.startswith(self.root) else full

    def display(self, full: str) -> str:
        """A URL for messages: the user's URL plus the path below the root."""
        return f"{self.url}/{self.relative(full)}"

    # ------------------------------------------------------------------ primitives
    def _fail(self, op: str, path: str, err: Exception) -> TierdError:
        if isinstance(err, TierdError):
            return err
        if isinstance(err, FileNotFoundError):
            return SegmentNotFoundError(f"{self.display(path)} does not exist", path=self.display(path))
        if _is_credentials_problem(err, self.scheme in ("s3", "s3a")):
            host = socket.gethostname()
            failure = f"{op} of {self.display(path)} failed on host {host}: {type(err).__name__}: {err}"
            return CredentialsError(
                f"{failure}. {credentials_advice()}", path=self.display(path), failure=failure
            )
        return BackendError(
            f"{op} of {self.display(path)} failed: {type(err).__name__}: {err}", path=self.display(path)
        )

    def _count(self, requests: int, data: int) -> None:
        self.requests += requests
        self.bytes_read += data

    def credentials_source(self) -> str | None:
        """Where this process's S3 client took its credentials from (botocore's name for it:
        ``env``, ``shared-credentials-file``, ``iam-role``, ``container-role``,
        ``assume-role-with-web-identity``, ``explicit`` ...); None before any request or
        for other filesystems."""
        if self.scheme not in ("s3", "s3a"):
            return None
        from fsspec.asyn import sync

        from tierd.drivers.s3fastget import signing_credentials

        try:
            self.fs.s3  # noqa: B018 - connects: the client and its credentials exist from then on
            creds = sync(self.fs.loop, signing_credentials, self.fs)
        except Exception:  # not connected (it will say why at the first request)
            return None
        method = getattr(creds, "method", None)
        return str(method) if method else None

    @property
    def records_fs(self) -> Any:
        """The filesystem that reads commitlog records (:meth:`SegmentSource.read` with
        ``records``): on S3, one whose client does not validate response checksums.

        Why that is safe: every record read this way is checked by the decoder — its framing
        (the TOTALSIZE chain, magic, every length), its PHYSICALOFFSET, topic and queue id, the
        UTF-8 of its properties and the CRC of its body — before any row is returned. And S3
        returns no checksum for a ranged GET (every read here is one), so against S3 nothing
        changes; the S3 driver's lean GET does not ask for one either. What it saves is the
        CRC32 that botocore computes in Python's ``binascii`` over every byte of a response
        when a server sends a whole-object checksum anyway (moto does): ~0.1 s of a Spark
        worker's CPU per 200 MB read (docs/performance.md, P6). Manifests, listings, consume
        queue units and key index files — bytes without a CRC of their own — keep the regular
        client and its validation. A ``response_checksum_validation`` the user set in
        ``config_kwargs`` is kept. The two clients share one botocore session (credentials
        and settings are the same: both are made from the same storage options)."""
        if self._records_fs is None:
            if self.scheme not in ("s3", "s3a"):
                self._records_fs = self.fs
            else:
                from fsspec.core import url_to_fs

                options = dict(self._options)
                config = dict(options.get("config_kwargs") or {})
                config.setdefault("response_checksum_validation", "when_required")
                options["config_kwargs"] = config
                # On the regular client's botocore session: its loaded service model and
                # endpoint rules are shared (a client of its own held ~35,000 more objects,
                # which PySpark's gc.collect() after every task walks: +15 ms per task).
                self.fs.s3  # noqa: B018 - connects: the session exists from then on
                options.setdefault("session", self.fs.session)
                self._records_fs = url_to_fs(self.url, **options)[0]
        return self._records_fs

    def cat(self, path: str, start: int, end: int, *, records: bool = False) -> bytes:
        """Bytes ``[start, end)`` of the object at full path ``path`` (``records``: commitlog
        records, read through :attr:`records_fs`)."""
        fs = self.records_fs if records else self.fs
        try:
            data: bytes = fs.cat_file(path, start=start, end=end)
        except Exception as e:
            raise self._fail("read", path, e) from e
        self._count(1, len(data))
        return data

    def cat_spans(self, spans: Sequence[tuple[str, int, int]], *, records: bool = False) -> list[bytes]:
        """Byte ranges ``(full path, start, end)`` of several objects, fetched concurrently
        (``records``: as for :meth:`cat`)."""
        if not spans:
            return []
        fs = self.records_fs if records else self.fs
        try:
            got = fs.cat_ranges(
                [p for p, _, _ in spans], [a for _, a, _ in spans], [b for _, _, b in spans], on_error="raise"
            )
        except Exception as e:
            raise self._fail("read", spans[0][0], e) from e
        out = [bytes(d) if not isinstance(d, bytes) else d for d in got]
        self._count(len(out), sum(len(d) for d in out))
        return out

    def read_object(self, rel: str) -> bytes:
        """A whole small object (a manifest); :class:`SegmentNotFoundError` if it is missing.

        Asked as the range ``[0, end)``: for a whole object s3fs first sends a HEAD (to split a
        large download), a second round trip per manifest."""
        path = self.full(rel)
        try:
            data: bytes = self.fs.cat_file(path, start=0)
        except Exception as e:
            raise self._fail("read", path, e) from e
        self._count(1, len(data))
        return data

    def read_objects(self, rels: Sequence[str]) -> list[bytes | None]:
        """Whole small objects (queue manifests), read concurrently (one fsspec ``cat`` of all
        paths: a bucket with a thousand queues plans in a few round trips, not a thousand);
        None for a missing object."""
        if not rels:
            return []
        paths = [self.full(rel) for rel in rels]
        try:
            got: dict[str, Any] = self.fs.cat(paths, on_error="return", start=0)  # no HEADs
        except Exception as e:
            raise self._fail("read", paths[0], e) from e
        out: list[bytes | None] = []
        for path in paths:
            data = got.get(self.fs._strip_protocol(path), FileNotFoundError(path))
            if isinstance(data, FileNotFoundError):
                out.append(None)
            elif isinstance(data, Exception):
                raise self._fail("read", path, data) from data
            else:
                out.append(bytes(data))
        self._count(len(paths), sum(len(d) for d in out if d is not None))
        return out

    def list_dir(self, rel: str) -> list[tuple[str, int, bool]]:
        """``(name, size, is_dir)`` of the entries directly below ``rel`` (one delimiter listing,
        never recursive); ``[]`` if there is nothing there."""
        path = self.full(rel) if rel else self.root
        self._count(1, 0)
        try:
            self.fs.invalidate_cache(path)
            entries = self.fs.ls(path, detail=True)
        except FileNotFoundError:
            return []
        except Exception as e:
            raise self._fail("list", path, e) from e
        out: list[tuple[str, int, bool]] = []
        for entry in entries:
            name = str(entry["name"]).rstrip("/").rsplit("/", 1)[-1]
            out.append((name, int(entry.get("size") or 0), entry.get("type") == "directory"))
        return out

    def segment(self, rel: str) -> SegmentSource:
        """The segment at cold-tier path ``rel`` as stored now.

        An open segment on an object store is its chunks (validated: they must tile the
        segment); once sealed — possibly since planning — it is one object, which wins over any
        leftover chunks, as for the drivers. A posix-written open segment is a plain file.
        """
        path = self.full(rel)
        if self.scheme in _PREFIX_LISTING:
            listing = self._list_segment(path)
        else:
            listing = self._stat_segment(path)
        if listing.sealed is None and not listing.chunks:
            raise _missing(self.display(path))
        if listing.sealed is not None:
            return SegmentSource(self, path, None, listing.sealed.size)
        layout = Layout.build(path, listing)
        return SegmentSource(self, path, layout, layout.size)

    def sealed_segment(self, rel: str, size: int) -> SegmentSource:
        """A sealed segment holding at least ``size`` bytes (its manifest says so), without a
        request: each range of it is then one GET. A missing or shorter object is reported when
        it is read."""
        return SegmentSource(self, self.full(rel), None, size, listed=False)

    def _list_segment(self, path: str) -> Listing:
        """Sealed object and chunks in one prefix listing (``{path}`` and ``{path}.chunks/…``
        share the prefix; segment names have a fixed length, so no sibling does)."""
        parent, _, name = path.rpartition("/")
        self._count(1, 0)
        try:
            found: dict[str, Any] = self.fs.find(parent, prefix=name, detail=True)
        except FileNotFoundError:
            found = {}
        except Exception as e:
            raise self._fail("list", path, e) from e
        finally:
            # s3fs caches what find saw as the directory's listing: a partial one here.
            self.fs.invalidate_cache(parent)
        chunk_prefix = path + CHUNK_DIR_SUFFIX
        sealed: ObjectInfo | None = None
        chunks: list[ObjectInfo] = []
        for key, entry in found.items():
            key = key.rstrip("/")
            if entry.get("type") == "directory":
                continue
            if key == path:
                sealed = ObjectInfo(key, int(entry.get("size") or 0))
            elif key.startswith(chunk_prefix):
                chunks.append(ObjectInfo(key, int(entry.get("size") or 0)))
        return Listing(sealed, tuple(chunks))

    def _stat_segment(self, path: str) -> Listing:
        """Filesystems without prefix listings: stat the segment, else list its chunk directory."""
        chunk_dir = path + CHUNK_DIR_SUFFIX.rstrip("/")
        self._count(1, 0)
        try:
            self.fs.invalidate_cache(path)
            info = self.fs.info(path)
            if info.get("type") != "directory":
                return Listing(ObjectInfo(path, int(info["size"])))
        except FileNotFoundError:
            pass
        except Exception as e:
            raise self._fail("stat", path, e) from e
        try:
            self.fs.invalidate_cache(chunk_dir)
            entries = self.fs.ls(chunk_dir, detail=True)
        except FileNotFoundError:
            entries = []
        except Exception as e:
            raise self._fail("list", chunk_dir, e) from e
        return Listing(
            None,
            tuple(
                ObjectInfo(str(e["name"]).rstrip("/"), int(e.get("size") or 0))
                for e in entries
                if e.get("type") != "directory"
            ),
        )

    def read_units(self, requests: Sequence[tuple[str, int, int]]) -> list[bytes]:
        """Small ranged reads ``(rel, start, end)`` of segments, batched (s3fs runs them
        concurrently): the consume-queue units that planning splits segments at."""
        if not requests:
            return []
        sources: dict[str, SegmentSource] = {}
        wanted: list[tuple[SegmentSource, int, int, int]] = []  # (source, start, end, spans)
        spans: list[tuple[str, int, int]] = []
        for rel, start, end in requests:
            src = sources.get(rel)
            if src is None:
                src = sources[rel] = self.segment(rel)
            if end > src.size:
                raise CorruptionError(
                    f"{src.url}: the manifest promises bytes up to {end}, the segment holds {src.size}",
                    path=src.url,
                )
            mine = src.spans(start, end)  # one chunk, or two when a unit straddles chunks
            wanted.append((src, start, end, len(mine)))
            spans.extend(mine)
        try:
            got = iter(self.cat_spans(spans))
        except SegmentNotFoundError:
            # A chunk gone since the listing: its segment was sealed (or deleted) meanwhile. Read
            # unit by unit through the sources, which follow a seal and name a deletion.
            return [src.read(start, end) for src, start, end, _ in wanted]
        out: list[bytes] = []
        for src, start, end, count in wanted:
            data = b"".join(next(got) for _ in range(count))
            src.expect(start, end, data)
            out.append(data)
        return out


_OPEN: dict[tuple[str, str], ColdStorage] = {}
_OPEN_LOCK = threading.Lock()
#: Bound on cached roots per process (a long-lived worker may serve many reads).
_OPEN_MAX = 8


def open_storage(url: str, storage_options: Mapping[str, Any] | None = None) -> ColdStorage:
    """A :class:`ColdStorage` for ``url``, reused within this process.

    Spark reuses Python workers across tasks, and creating an s3fs client (session, credential
    chain, connection pool) costs far more than reading a small range; one per task made short
    tasks several times slower. Only the filesystem object is shared — every listing still
    invalidates fsspec's cache first, so nothing stale is read.
    """
    key = (url, json.dumps(dict(storage_options or {}), sort_keys=True, default=str))
    with _OPEN_LOCK:
        found = _OPEN.get(key)
        if found is None:
            if len(_OPEN) >= _OPEN_MAX:
                _OPEN.pop(next(iter(_OPEN)))
            found = _OPEN[key] = ColdStorage(url, storage_options)
        return found


def _is_credentials_problem(err: BaseException, s3: bool) -> bool:
    """No credentials, or credentials an S3 server rejects (anywhere in the exception chain;
    s3fs turns S3's AccessDenied family into PermissionError)."""
    seen: BaseException | None = err
    for _ in range(8):
        if seen is None:
            return False
        if type(seen).__name__ in _NO_CREDENTIALS:
            return True
        if s3 and (isinstance(seen, PermissionError) or any(code in str(seen) for code in _REJECTED)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def credentials_advice(driver_source: str | None = None) -> str:
    """How to give a Spark process S3 credentials — the fix, named in every credentials error."""
    planned = (
        f"The driver planned this read with credentials from {driver_source!r}; executors do not "
        "inherit them. "
        if driver_source
        else ""
    )
    return (
        f"{planned}Every process that reads the bucket needs its own credentials: on a cluster "
        "set them in the executors' environment (spark.executorEnv.AWS_ACCESS_KEY_ID and "
        "spark.executorEnv.AWS_SECRET_ACCESS_KEY, or AWS_PROFILE with the file on every node), "
        "use an instance profile (EC2, EMR) or IRSA / EKS Pod Identity (Kubernetes), or pass "
        "key and secret in option storage_options (see docs/spark.md, 'Credentials on a cluster')"
    )


def report_stats(storage: ColdStorage, phase: str, before: tuple[int, int]) -> None:
    """Append this phase's requests and bytes to the file named by :data:`STATS_ENV`, if set."""
    target = os.environ.get(STATS_ENV)
    if not target:
        return
    line = json.dumps(
        {
            "phase": phase,
            "pid": os.getpid(),
            "requests": storage.requests - before[0],
            "bytes": storage.bytes_read - before[1],
        }
    )
    fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)
