"""The cold tier as Arrow record batches: :func:`dataset` and :func:`read`.

Everything below the batches is the Spark source's, called rather than copied: bucket access
(:mod:`tierd.spark.storage`, read-only — nothing is written, no owner record is looked at or
claimed), planning from the manifests, the key lookup through the cold index and the tag filter
through the consume queue (:mod:`tierd.spark.parts`), and the one decoder
(:mod:`tierd.spark.decode`, in C where built). So the columns, their meaning and the rows a
restriction selects are the Spark source's by construction; :data:`SCHEMA` *is*
``ARROW_SCHEMA``.

What is Arrow-specific is small: a dataset-shaped object (``schema``, ``to_batches``,
``to_table``, ``head``, ``count_rows``, ``scanner``, ``__arrow_c_stream__``) that Polars'
``scan_pyarrow_dataset`` and DuckDB accept, restrictions given as keyword arguments or as a
pyarrow filter expression (pruned from where its shape allows, see
:mod:`tierd.arrow.expressions`, and always applied to the decoded rows), and a projection that
decodes only the columns asked for plus those the filter needs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

import pyarrow as pa

from tierd.arrow.expressions import conjuncts
from tierd.errors import InvalidArgumentError
from tierd.spark.decode import ARROW_SCHEMA
from tierd.spark.filters import Constraints
from tierd.spark.options import ReadOptions
from tierd.spark.parts import READ_AHEAD_PARTS, plan_parts, read_parts
from tierd.spark.storage import ColdStorage

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping

    import pyarrow.compute as pc

__all__ = ["SCHEMA", "TierdDataset", "TierdScanner", "dataset", "read"]

#: The columns, in order, with the Spark source's types and meaning (docs/spark.md, "Schema").
SCHEMA: Final = ARROW_SCHEMA
#: Spark cuts large segments into partitions to read them in parallel; one reader reads the
#: ranges one after another, so a cut would only cost its consume-queue reads.
_NO_SPLIT: Final = 2**62
#: pyarrow scan options that tune how a scan runs, never which rows or columns it returns:
#: accepted (callers written for ``pyarrow.dataset`` pass them) and ignored — except
#: ``fragment_readahead``, pyarrow's "files to read ahead": here the parts read ahead at most
#: (0: one part at a time), within the read-ahead's byte bound.
_TUNING: Final = frozenset(
    {"batch_readahead", "fragment_readahead", "fragment_scan_options", "use_threads", "cache_metadata"}
)
_EPOCH: Final = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)

Names = str | Sequence[str]
Time = dt.datetime | int


def _names(arg: str, value: Names | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    names = (value,) if isinstance(value, str) else tuple(value)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise InvalidArgumentError(
            f"{arg} must be a non-empty string or list of them, got {value!r}", **{arg: value}
        )
    return tuple(dict.fromkeys(names))


def _ints(arg: str, value: int | Sequence[int] | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    ints = (value,) if isinstance(value, int) else tuple(value)
    if not ints or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ints):
        raise InvalidArgumentError(
            f"{arg} must be an integer >= 0 or a list of them, got {value!r}", **{arg: value}
        )
    return tuple(sorted(set(ints)))


def _instant(arg: str, value: Time) -> dt.datetime:
    """An aware datetime for a ``store_time`` bound: epoch milliseconds or an aware datetime (a
    naive one names no instant)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return _EPOCH + dt.timedelta(milliseconds=value)
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value
    raise InvalidArgumentError(
        f"{arg} bounds must be epoch milliseconds or datetimes with a time zone, got {value!r}",
        **{arg: value},
    )


def _interval(arg: str, value: tuple[Any, Any] | None) -> tuple[Any, Any]:
    if value is None:
        return None, None
    if not isinstance(value, tuple | list) or len(value) != 2:
        raise InvalidArgumentError(
            f"{arg} must be a pair (start, end), either None, got {value!r}", **{arg: value}
        )
    return value[0], value[1]


@dataclasses.dataclass(frozen=True, slots=True)
class _Restrictions:
    """The keyword restrictions of a dataset, validated, as the pushes they make."""

    options: ReadOptions
    pushes: tuple[tuple[str, str, object], ...]
    keys: frozenset[str] | None

    def constraints(self, extra: Iterable[tuple[str, str, object]] = ()) -> Constraints:
        c = Constraints.from_options(self.options)
        if self.keys is not None:
            c.keys = self.keys
            c.row_filters = True
        for column, op, value in self.pushes:
            if not c.push(column, op, value):  # every keyword restriction is pushable exactly
                raise InvalidArgumentError(
                    f"cannot restrict {column} {op} {value!r}", column=column, value=value
                )
        for column, op, value in extra:
            c.push(column, op, value)  # not taken: the filter applied to the rows enforces it
        return c


def _columns(columns: Sequence[str] | None) -> list[str]:
    if columns is None:
        return list(SCHEMA.names)
    if isinstance(columns, str) or not all(isinstance(c, str) for c in columns):
        raise InvalidArgumentError(
            f"columns must be a list of column names, got {columns!r}", columns=columns
        )
    unknown = [c for c in columns if c not in SCHEMA.names]
    if unknown:
        raise InvalidArgumentError(
            f"columns {unknown} are not tierd columns; the columns are {SCHEMA.names}", columns=unknown
        )
    if len(set(columns)) != len(columns):
        raise InvalidArgumentError(f"columns {list(columns)} name a column twice", columns=list(columns))
    return list(columns)


def _needed(expr: pc.Expression) -> set[str]:
    """The columns ``expr`` refers to: those without which it cannot be bound to the schema."""
    out = set()
    for name in SCHEMA.names:
        rest = pa.schema([f for f in SCHEMA if f.name != name])
        try:
            rest.empty_table().filter(expr)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            out.add(name)
    return out


class TierdScanner:
    """One scan of a :class:`TierdDataset`: its columns, filter and batch size, fixed. Planned
    when its batches are first asked for, so it reads the bucket as it is then."""

    def __init__(
        self,
        ds: TierdDataset,
        columns: Sequence[str] | None = None,
        filter: pc.Expression | None = None,
        batch_size: int | None = None,
        **tuning: Any,
    ) -> None:
        unknown = sorted(set(tuning) - _TUNING)
        if unknown:
            raise InvalidArgumentError(f"unknown scan option(s) {unknown}", options=unknown)
        if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
            raise InvalidArgumentError(
                f"batch_size must be an integer >= 1, got {batch_size!r}", batch_size=batch_size
            )
        self.dataset = ds
        self.columns = _columns(columns)
        self.filter = filter if filter is not None else ds._filter
        if filter is not None and ds._filter is not None:
            self.filter = ds._filter & filter
        self.batch_size = batch_size
        ahead = tuning.get("fragment_readahead")
        if ahead is not None and (not isinstance(ahead, int) or isinstance(ahead, bool) or ahead < 0):
            raise InvalidArgumentError(
                f"fragment_readahead must be an integer >= 0, got {ahead!r}", fragment_readahead=ahead
            )
        #: Parts read ahead at most (``fragment_readahead``; see :func:`~tierd.spark.parts.read_parts`).
        self.read_ahead = min(ahead, READ_AHEAD_PARTS) if ahead is not None else READ_AHEAD_PARTS
        #: The schema of the batches: the selected columns, in the order asked.
        self.projected_schema = pa.schema([SCHEMA.field(c) for c in self.columns])

    def to_batches(self) -> Iterator[pa.RecordBatch]:
        """The rows, batch by batch, the next parts read ahead (:func:`~tierd.spark.parts.read_parts`:
        memory holds a few 16 MiB pieces, whatever the size of the read)."""
        ds, expr = self.dataset, self.filter
        pushed = conjuncts(expr) if expr is not None else []
        needed = set(self.columns) | (_needed(expr) if expr is not None else set())
        decoded = pa.schema([f for f in SCHEMA if f.name in needed] or [SCHEMA.field("queue_offset")])
        c = ds._restrictions.constraints(pushed or ())
        storage = ds._storage
        parts = plan_parts(storage, ds._restrictions.options, c)
        # Closed explicitly when the scan stops early: the parts read ahead stop then, not
        # whenever the garbage collector gets to them.
        with contextlib.closing(
            read_parts(storage, parts, c, decoded, ahead_parts=self.read_ahead)
        ) as batches:
            for batch in batches:
                if expr is not None:
                    batch = batch.filter(expr)
                if not batch.num_rows:
                    continue
                batch = batch.select(self.columns)
                if self.batch_size is None:
                    yield batch
                    continue
                for at in range(0, batch.num_rows, self.batch_size):
                    yield batch.slice(at, self.batch_size)

    def to_reader(self) -> pa.RecordBatchReader:
        return pa.RecordBatchReader.from_batches(self.projected_schema, self.to_batches())

    def to_table(self) -> pa.Table:
        return pa.Table.from_batches(list(self.to_batches()), self.projected_schema)

    def head(self, num_rows: int) -> pa.Table:
        """The first ``num_rows`` rows (reading stops once they are decoded)."""
        got: list[pa.RecordBatch] = []
        left = num_rows
        for batch in self.to_batches() if left > 0 else ():
            got.append(batch.slice(0, left))
            left -= got[-1].num_rows
            if left <= 0:
                break
        return pa.Table.from_batches(got, self.projected_schema)

    def count_rows(self) -> int:
        return sum(b.num_rows for b in self.to_batches())

    def __arrow_c_stream__(self, requested_schema: object = None) -> object:
        return self.to_reader().__arrow_c_stream__(requested_schema)


class TierdDataset:
    """The messages of a cold tier, restricted as :func:`dataset` was told — shaped like a
    ``pyarrow.dataset.Dataset`` where Polars and DuckDB look: ``schema``, ``to_batches``,
    ``to_table``, ``head``, ``count_rows``, ``scanner``, ``filter`` and the Arrow C stream.

    Read-only and stateless between scans: every scan plans from the bucket's manifests anew.
    :attr:`requests` and :attr:`bytes_read` count what its scans sent and read."""

    def __init__(
        self,
        storage: ColdStorage,
        restrictions: _Restrictions,
        filter: pc.Expression | None = None,
    ) -> None:
        self._storage = storage
        self._restrictions = restrictions
        self._filter = filter

    @property
    def schema(self) -> pa.Schema:
        return SCHEMA

    @property
    def url(self) -> str:
        return self._restrictions.options.url

    @property
    def requests(self) -> int:
        """Requests sent to the cold tier by this dataset's scans so far (listings included)."""
        return self._storage.requests

    @property
    def bytes_read(self) -> int:
        """Bytes read from the cold tier by this dataset's scans so far (manifests included)."""
        return self._storage.bytes_read

    def filter(self, expression: pc.Expression) -> TierdDataset:
        """This dataset with ``expression`` applied to its rows as well."""
        combined = expression if self._filter is None else self._filter & expression
        return TierdDataset(self._storage, self._restrictions, combined)

    def scanner(
        self,
        columns: Sequence[str] | None = None,
        filter: pc.Expression | None = None,
        batch_size: int | None = None,
        **tuning: Any,
    ) -> TierdScanner:
        return TierdScanner(self, columns, filter, batch_size, **tuning)

    def to_batches(
        self,
        columns: Sequence[str] | None = None,
        filter: pc.Expression | None = None,
        batch_size: int | None = None,
        **tuning: Any,
    ) -> Iterator[pa.RecordBatch]:
        return self.scanner(columns, filter, batch_size, **tuning).to_batches()

    def to_reader(
        self,
        columns: Sequence[str] | None = None,
        filter: pc.Expression | None = None,
        batch_size: int | None = None,
        **tuning: Any,
    ) -> pa.RecordBatchReader:
        return self.scanner(columns, filter, batch_size, **tuning).to_reader()

    def to_table(
        self,
        columns: Sequence[str] | None = None,
        filter: pc.Expression | None = None,
        batch_size: int | None = None,
        **tuning: Any,
    ) -> pa.Table:
        return self.scanner(columns, filter, batch_size, **tuning).to_table()

    def head(
        self,
        num_rows: int,
        columns: Sequence[str] | None = None,
        filter: pc.Expression | None = None,
        batch_size: int | None = None,
        **tuning: Any,
    ) -> pa.Table:
        return self.scanner(columns, filter, batch_size, **tuning).head(num_rows)

    def count_rows(
        self,
        filter: pc.Expression | None = None,
        batch_size: int | None = None,
        **tuning: Any,
    ) -> int:
        return self.scanner([], filter, batch_size, **tuning).count_rows()

    def __arrow_c_stream__(self, requested_schema: object = None) -> object:
        """The whole dataset as an Arrow C stream (DuckDB's ``FROM ds``, ``pl.DataFrame(ds)``,
        ``pandas.DataFrame.from_arrow(ds)``); each call is a new scan."""
        return self.scanner().__arrow_c_stream__(requested_schema)

    def __repr__(self) -> str:
        return f"TierdDataset({self.url!r})"


def dataset(
    url: str,
    *,
    storage_options: Mapping[str, Any] | None = None,
    topic: Names | None = None,
    queues: int | Sequence[int] | None = None,
    offsets: tuple[int | None, int | None] | None = None,
    store_time: tuple[Time | None, Time | None] | None = None,
    tags: Names | None = None,
    keys: Names | None = None,
    cluster: Names | None = None,
    broker: Names | None = None,
    include_open_segments: bool = True,
) -> TierdDataset:
    """The messages of the cold tier at ``url`` (``s3://bucket/prefix``, ``file:///dir`` or an
    absolute directory; the ``backend.url`` tierd writes to), opened read-only.

    Every restriction prunes what is read, and each row is checked against it:

    * ``topic``, ``queues``, ``cluster``, ``broker``: only those (a topic that is not there is an
      error naming the topics that are);
    * ``offsets=(start, end)``: queue offsets ``start <= o < end``; ``store_time=(start, end)``:
      store times ``start <= t < end`` (aware datetimes or epoch milliseconds); either bound None
      for unbounded — segments outside the bounds are not read;
    * ``tags``: messages with one of these tags, read record by record through the consume
      queue's tag hash codes;
    * ``keys``: messages with one of these keys (a KEYS token or the UNIQ_KEY), found through the
      cold key index with two small ranged reads per index file.

    ``storage_options`` go to fsspec (``{"endpoint_url": ..., "key": ..., "secret": ...}``).
    Nothing is read until a scan starts."""
    base = ReadOptions.parse({"path": url}).require_path()
    opts = dataclasses.replace(
        base,
        storage_options=dict(storage_options or {}),
        topics=_names("topic", topic),
        queue_ids=_ints("queues", queues),
        clusters=_names("cluster", cluster),
        brokers=_names("broker", broker),
        include_open_segments=bool(include_open_segments),
        max_partition_bytes=_NO_SPLIT,
    )
    pushes: list[tuple[str, str, object]] = []
    lo, hi = _interval("offsets", offsets)
    for bound, op in ((lo, ">="), (hi, "<")):
        if bound is not None:
            if not isinstance(bound, int) or isinstance(bound, bool):
                raise InvalidArgumentError(
                    f"offsets bounds must be integers, got {offsets!r}", offsets=offsets
                )
            pushes.append(("queue_offset", op, bound))
    lo, hi = _interval("store_time", store_time)
    for bound, op in ((lo, ">="), (hi, "<")):
        if bound is not None:
            pushes.append(("store_timestamp", op, _instant("store_time", bound)))
    tag_names = _names("tags", tags)
    if tag_names is not None:
        pushes.append(("tags", "in", tag_names))
    key_names = _names("keys", keys)
    restrictions = _Restrictions(opts, tuple(pushes), frozenset(key_names) if key_names is not None else None)
    return TierdDataset(ColdStorage(opts.url, opts.storage_options), restrictions)


def read(
    url: str,
    *,
    columns: Sequence[str] | None = None,
    filter: pc.Expression | None = None,
    batch_size: int | None = None,
    **restrictions: Any,
) -> pa.RecordBatchReader:
    """``dataset(url, **restrictions).to_reader(columns, filter, batch_size)``: one streaming
    read (DuckDB: ``FROM reader``; pandas: ``reader.read_pandas()``)."""
    return dataset(url, **restrictions).to_reader(columns, filter, batch_size)
