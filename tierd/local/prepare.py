"""Turn user :class:`~tierd.message.Message` objects into encodable columns, outside the lock.

Everything that does not depend on the commitlog position — validation, properties encoding,
CRC, sizes, queue choice — happens here so the commitlog lock is held only for offset assignment
and the copy. The result is column-oriented (numpy arrays + parallel lists) so the batch encoder
and the dispatcher work on whole columns.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from operator import attrgetter, ne
from typing import TYPE_CHECKING, Any, Final, NamedTuple

import numpy as np
import numpy.typing as npt

from tierd.errors import InvalidArgumentError, MessageTooLargeError
from tierd.format.compiled import records
from tierd.format.cq_unit import tags_code
from tierd.format.host import encode_host
from tierd.format.key_hash import key_hash
from tierd.format.layout import (
    BODY_CRC_MASK,
    HEADER_FIXED,
    HOST_V4,
    PROPERTIES_LENGTH_WIDTH,
    header_length,
    max_record_size,
    position,
)
from tierd.format.properties import MAX_PROPERTIES_LENGTH, PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_KEY
from tierd.format.record import crc32, encode_record, place_record, topic_field
from tierd.local.validation import (
    INT32_MAX,
    INT32_MIN,
    TOPIC_CACHE_MAX,
    build_properties,
    check_body,
    check_born_timestamp,
    check_flag,
    check_queue,
    check_topic,
)
from tierd.message import Message

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from tierd.local.dispatch import SingleRecord

log = logging.getLogger(__name__)

GroupKey = tuple[str, int]

_TOPIC, _BODY, _KEYS = attrgetter("topic"), attrgetter("body"), attrgetter("keys")
#: The fields a plain batch (:meth:`Preparer._prepare_plain`) leaves at their defaults, read in
#: one pass per message, and their defaults — taken from a message built without them, so the
#: comparison finds the very same objects (identity first); an empty mapping still equals every
#: empty mapping, ``0`` equals ``False``, as the general path reads them.
_PLAIN_FIELDS = attrgetter("queue_id", "tags", "born_host", "born_timestamp", "flag", "properties")
_PLAIN_DEFAULTS: tuple[object, ...] = _PLAIN_FIELDS(Message(topic="", body=b""))
_KEYS_PREFIX = PROPERTY_KEYS.encode() + b"\x01"


#: One message ready to append (the single-put path), as a plain tuple: at 100k puts/s a
#: NamedTuple's ``__new__`` (0.3 µs, a Python call) is measurable, a tuple display is not.
#: (queue key, record, tags code, index hashes, position of STORETIMESTAMP in the record, record
#: size). The *record* is complete but for its placement — queue offset, physical offset and
#: store timestamp are zero — which :func:`place` writes under the commitlog lock. *Index hashes*
#: are the key index's hashes of the ``topic#key`` strings: one ``int`` for a message with
#: exactly one key (the usual case: no tuple per put for the collector to track), else a tuple.
PreparedOne = tuple[GroupKey, bytes, int, "int | tuple[int, ...]", int, int]


@dataclass(slots=True)
class PreparedBatch:
    bodies: list[bytes]
    #: Everything after the body: topic field, properties length, properties.
    tails: list[bytes]
    topic_parts: list[bytes]
    magics: npt.NDArray[np.uint32]
    crcs: npt.NDArray[np.uint32]
    queue_ids: npt.NDArray[np.int32]
    flags: npt.NDArray[np.int32]
    born_timestamps: npt.NDArray[np.int64]
    born_hosts: list[bytes]
    body_lengths: npt.NDArray[np.int64]
    sizes: npt.NDArray[np.int64]
    tags_codes: npt.NDArray[np.int64]
    #: (topic, queue id) → message indices; a single group covers the whole batch in order.
    groups: list[tuple[GroupKey, npt.NDArray[np.intp]]]
    index_keys: list[str]
    index_messages: list[int]
    #: All records have IPv4 born/store hosts and one born host: the numpy encoder applies.
    uniform_v4: bool


@dataclass(slots=True)
class EncodedBatch:
    """A batch already encoded by the C encoder (:mod:`tierd.format.compiled`): the records
    back to back in one buffer, complete but for their queue offset, physical offset and store
    timestamp, which the commitlog writes under its lock (:func:`stamp`) right before the buffer
    goes to the file. Any shape: several topics and queues (``groups``), tags, properties, born
    hosts, IPv6 hosts."""

    records: bytearray
    sizes: npt.NDArray[np.int64]
    queue_ids: npt.NDArray[np.int32]
    tags_codes: npt.NDArray[np.int64]
    groups: list[tuple[GroupKey, npt.NDArray[np.intp]]]
    #: The key index's hashes of the ``topic#key`` strings, which are never made as strings.
    index_hashes: npt.NDArray[np.uint32]
    index_messages: list[int]


class _Encoder(NamedTuple):
    """The C encoder's calls (see ``tierd/format/_records.pyi``)."""

    encode: Callable[
        ..., tuple[bytearray, bytes, bytes, bytes, bytes, list[GroupKey], bytes, bytes, bytes] | None
    ]
    stamp: Callable[..., int]
    encode_one: Callable[..., PreparedOne | None]


def _bind_encoder() -> _Encoder | None:
    """The C encoder (:mod:`tierd.format.compiled`'s extension, whose body CRC is bound there)
    bound to :class:`Message`, the host encoder and a message's default properties; None where
    it is not built (the extension is optional: no compiler at install time) or does not fit
    the class — then the Python passes below do the same work."""
    if records is None:
        return None
    try:
        records.bind_encoder(Message, encode_host, Message(topic="", body=b"").properties)
    except TypeError as e:
        log.warning("the C encoder does not fit Message (%s): put and put_batch encode in Python", e)
        return None
    return _Encoder(records.encode, records.stamp, records.encode_one)


_encoder = _bind_encoder()
#: The C encoder copies a batch's bodies into one buffer: a batch whose records exceed this many
#: bytes is written from its own bodies by the Python path instead, so a huge batch never needs
#: twice its size in memory (a 1,000-message batch of 1 KiB bodies is ~1.1 MiB).
ENCODE_BUFFER_LIMIT = 32 << 20


def stamp(
    records: bytearray,
    start: int,
    queue_offsets: npt.NDArray[np.int64],
    first_phys: int,
    store_ts: int,
) -> int:
    """Write the placement of the records of an :class:`EncodedBatch` from byte ``start`` (one
    per queue offset; physical offsets from ``first_phys``, the store timestamp); return the
    byte after the last one."""
    assert _encoder is not None  # an EncodedBatch exists only when the encoder does
    q = np.ascontiguousarray(queue_offsets, np.int64)
    return int(_encoder.stamp(records, start, q, len(q), first_phys, store_ts))


def _bind_place() -> Callable[[Any, int, bytes, int, int, int, int], None]:
    """Where a single put's record goes into the commitlog: the C extension's ``place`` (one
    call: the copy and the three placement fields), else :func:`place_record`."""
    return place_record if _encoder is None else records.place


#: ``place(buffer, position, record, queue offset, physical offset, store timestamp, position of
#: STORETIMESTAMP in the record)``: a :data:`PreparedOne`'s record into the commitlog mapping.
place: Final = _bind_place()


def _same(record: SingleRecord) -> SingleRecord:
    return record


#: ``untracked(record)``: a single put's dispatch record, off the cyclic collector's lists (it
#: holds only numbers and the cached key tuple, so it can never be in a cycle). Each one lives
#: until the dispatcher takes it; tracked, young collections promote thousands a second, and
#: their count is what starts the collector's full pass over the application's whole heap
#: (0.27 s for a 1.5 M-object heap; docs/performance.md, "Single put and the collector").
untracked: Final[Callable[[SingleRecord], SingleRecord]] = (
    _same if _encoder is None else records.untrack_tuple
)

#: Whether ``put_batch`` is checked and encoded by the C extension (~0.15 µs a 1 KiB message
#: against ~0.85-3 µs for the Python passes and the numpy header build).
ACCELERATED: Final = _encoder is not None


class Preparer:
    """Validates messages and chooses queues. Thread-safe (see :meth:`_next_queue`)."""

    def __init__(self, *, max_body: int, max_queues: int, default_queues: int, store_host: bytes) -> None:
        self.max_body = max_body
        self.max_queues = max_queues
        self.default_queues = default_queues
        self.store_host = store_host
        self._topics: dict[str, tuple[int, bytes]] = {}
        self._round_robin: dict[str, tuple[itertools.count[int], list[GroupKey]]] = {}
        #: Queue counts of topics created with their own (tierd.topics); others: default_queues.
        self.queue_counts: dict[str, int] = {}
        #: The limits the C encoder checks a single put against (see ``encode_one``).
        self._limits = (max_queues, max_body, max_record_size(max_body), MAX_PROPERTIES_LENGTH)

    def _topic(self, topic: str) -> tuple[int, bytes]:
        entry = self._topics.get(topic)
        if entry is None:
            check_topic(topic)
            entry = topic_field(topic.encode())
            if len(self._topics) < TOPIC_CACHE_MAX:
                self._topics[topic] = entry
        return entry

    def _next_key(self, topic: str) -> GroupKey:
        """The next ``(topic, queue id)`` round-robin, as one of the topic's cached key tuples
        (no tuple per put: it would live until dispatched and feed the collector).

        No lock (0.16 µs a put): ``dict.setdefault`` and ``next`` on an ``itertools.count``
        are each one C call, atomic under the GIL, so concurrent producers never get the same
        number."""
        counter, keys = self._round_robin.get(topic) or self._keys_of(topic)
        return keys[next(counter) % len(keys)]

    def _keys_of(self, topic: str) -> tuple[itertools.count[int], list[GroupKey]]:
        """``topic``'s round-robin counter and its cached ``(topic, queue id)`` tuples, one per
        queue (also handed to the encoder for messages that name their own queue)."""
        keys = [(topic, q) for q in range(self.queue_counts.get(topic, self.default_queues))]
        return self._round_robin.setdefault(topic, (itertools.count(), keys))

    def set_queue_count(self, topic: str, queues: int | None) -> None:
        """Round-robin ``topic`` over ``queues`` queues from now on (None: default_queues)."""
        if queues is None:
            self.queue_counts.pop(topic, None)
        else:
            self.queue_counts[topic] = queues
        self._round_robin.pop(topic, None)

    def _next_queue(self, topic: str) -> int:
        return self._next_key(topic)[1]

    def prepare_one(self, m: Message, now_ms: int) -> PreparedOne:
        """One message's record for :meth:`~tierd.local.commitlog.CommitLog.append_one`, written
        by the same encoder as a batch's (the C extension; a message it declines — a rule broken,
        values of other types — and every message where it is not built: :func:`encode_record`,
        the same bytes)."""
        enc = _encoder
        if enc is not None and type(m) is Message:
            topic = m.topic
            entry = self._topics.get(topic) or self._topic(topic)
            counter, keys = self._round_robin.get(topic) or self._keys_of(topic)
            key = keys[next(counter) % len(keys)] if m.queue_id is None else None
            p = enc.encode_one(m, topic, entry, key, self._limits, self.store_host, now_ms, keys)
            return p if p is not None else self._prepare_one_python(m, now_ms, key)
        return self._prepare_one_python(m, now_ms, None)

    def _prepare_one_python(self, m: Message, now_ms: int, key: GroupKey | None) -> PreparedOne:
        """:meth:`prepare_one` in Python: every rule checked with its typed error; ``key`` is the
        queue already chosen for a message without a queue id (the round-robin moves once)."""
        if not isinstance(m, Message):
            raise InvalidArgumentError(f"expected a tierd.Message, got {type(m).__name__}")
        topic = m.topic
        magic, topic_part = self._topics.get(topic) or self._topic(topic)
        body = m.body
        if type(body) is not bytes or len(body) > self.max_body:
            body = check_body(body, self.max_body)
        keys, tag, props = m.keys, m.tags, m.properties
        pb = build_properties(keys, tag, props) if (keys or tag is not None or props) else b""
        qid = m.queue_id
        if qid is not None:
            key = (topic, check_queue(qid, self.max_queues))
        elif key is None:
            key = self._next_key(topic)
        flag = m.flag
        if type(flag) is not int or not INT32_MIN <= flag <= INT32_MAX:
            flag = check_flag(flag) if flag else 0  # a falsy flag is 0, as on the batch paths
        born_ts = m.born_timestamp
        born_ts = now_ms if born_ts is None else check_born_timestamp(born_ts)
        born_host = self.store_host if m.born_host is None else encode_host(m.born_host)
        size = header_length(len(born_host), len(self.store_host)) + len(body) + len(topic_part)
        size += PROPERTIES_LENGTH_WIDTH + len(pb)
        if size > max_record_size(self.max_body):
            raise MessageTooLargeError(
                f"message encodes to {size} bytes, over the record limit {max_record_size(self.max_body)}",
                size=size,
            )
        # The placement (queue offset, physical offset, store timestamp) stays 0: place() writes it.
        record = encode_record(
            body, topic_part, magic, pb, key[1], flag, 0, 0, 0, born_ts, born_host, 0, self.store_host
        )
        if tag is None and props:
            tag = props.get(PROPERTY_TAGS)
        # RocketMQ's IndexService order: the UNIQ_KEY's item, then each key's.
        indexed = [f"{topic}#{props[PROPERTY_UNIQ_KEY]}"] if props and props.get(PROPERTY_UNIQ_KEY) else []
        if keys:
            indexed += [f"{topic}#{k}" for k in keys]
        hashes = tuple(map(key_hash, indexed))
        return (
            key,
            record,
            tags_code(tag) if tag else 0,
            hashes[0] if len(hashes) == 1 else hashes,
            position("store_timestamp", len(born_host), len(self.store_host)),
            size,
        )

    def prepare(self, messages: Sequence[Message], now_ms: int) -> PreparedBatch | EncodedBatch:
        """Columns for ``messages`` (or, for the usual batch, its records already encoded).
        Messages without a queue id go, per topic, to one queue chosen round-robin per call (a
        batch lands in one queue, as RocketMQ's batch send does)."""
        n = len(messages)
        if n == 0:
            raise InvalidArgumentError("put_batch needs at least one message")
        encoded = self._encode(messages, now_ms) if _encoder is not None else None
        if encoded is not None:
            return encoded
        plain = self._prepare_plain(messages, now_ms)
        return plain if plain is not None else self._prepare_general(messages, now_ms)

    def _encode(self, messages: Sequence[Message], now_ms: int) -> EncodedBatch | None:
        """Any batch the Python paths accept, checked and encoded by the C encoder; None for a
        batch breaking a rule (the Python path then raises the precise typed error) — the C code
        applies the same rules, and tests hold both to byte-identical records."""
        assert _encoder is not None
        try:
            # Validates every topic (the cache keeps them); a bad one: the Python path names it
            # in message order.
            topics = {t: self._topic(t) for t in set(map(_TOPIC, messages))}
        except (InvalidArgumentError, TypeError):
            return None
        out = _encoder.encode(
            messages,
            topics,
            self._next_queue,
            self.max_queues,
            self.max_body,
            max_record_size(self.max_body),
            MAX_PROPERTIES_LENGTH,
            self.store_host,
            now_ms,
            ENCODE_BUFFER_LIMIT,
        )
        if out is None:
            return None
        records, raw_sizes, raw_qids, raw_order, raw_bounds, group_keys, raw_tags, raw_hashes, raw_msgs = out
        # The encoder grouped the messages by (topic, queue id) with a counting sort: no argsort
        # here for batches of several queues or topics.
        order = np.frombuffer(raw_order, np.intp)
        bounds = np.frombuffer(raw_bounds, np.intp).tolist()
        groups = [(key, order[bounds[g] : bounds[g + 1]]) for g, key in enumerate(group_keys)]
        return EncodedBatch(
            records=records,
            sizes=np.frombuffer(raw_sizes, np.int64),
            queue_ids=np.frombuffer(raw_qids, np.int32),
            tags_codes=np.frombuffer(raw_tags, np.int64),
            groups=groups,
            index_hashes=np.frombuffer(raw_hashes, np.uint32),
            index_messages=np.frombuffer(raw_msgs, np.int64).tolist(),
        )

    def _prepare_general(self, messages: Sequence[Message], now_ms: int) -> PreparedBatch:
        """Any batch, one message at a time: every rule checked, every field honoured."""
        n = len(messages)
        max_body = self.max_body
        bodies: list[bytes] = [b""] * n
        tails: list[bytes] = [b""] * n
        topic_parts: list[bytes] = [b""] * n
        magics = np.empty(n, np.uint32)
        qids = np.empty(n, np.int32)
        flags = np.zeros(n, np.int32)
        born_ts = np.full(n, now_ms, np.int64)
        tags = np.zeros(n, np.int64)
        born_hosts: list[bytes] = []
        index_keys: list[str] = []
        index_msgs: list[int] = []
        chosen: dict[str, int] = {}
        first_key: GroupKey | None = None
        mixed = False
        for j, m in enumerate(messages):
            if not isinstance(m, Message):
                raise InvalidArgumentError(f"expected a tierd.Message, got {type(m).__name__}")
            topic = m.topic
            magic, topic_part = self._topic(topic)
            body = m.body
            if type(body) is not bytes or len(body) > max_body:
                body = check_body(body, max_body)
            keys, tag, props = m.keys, m.tags, m.properties
            pb = build_properties(keys, tag, props) if (keys or tag is not None or props) else b""
            qid = m.queue_id
            if qid is None:
                qid = chosen.get(topic)
                if qid is None:
                    qid = chosen[topic] = self._next_queue(topic)
            else:
                check_queue(qid, self.max_queues)
            key = (topic, qid)
            if first_key is None:
                first_key = key
            elif key != first_key:
                mixed = True
            bodies[j] = body
            topic_parts[j] = topic_part
            tails[j] = topic_part + len(pb).to_bytes(PROPERTIES_LENGTH_WIDTH, "big") + pb
            magics[j] = magic
            qids[j] = qid
            if m.flag:
                flags[j] = check_flag(m.flag)
            if m.born_timestamp is not None:
                born_ts[j] = check_born_timestamp(m.born_timestamp)
            if m.born_host is not None:
                born_hosts.append(encode_host(m.born_host))
            if tag is None and props:
                tag = props.get(PROPERTY_TAGS)
            if tag:
                tags[j] = tags_code(tag)
            if props:  # RocketMQ's IndexService order: the UNIQ_KEY's item, then each key's
                uniq = props.get(PROPERTY_UNIQ_KEY)
                if uniq:
                    index_keys.append(f"{topic}#{uniq}")
                    index_msgs.append(j)
            if keys:
                for k in keys:
                    index_keys.append(f"{topic}#{k}")
                    index_msgs.append(j)
        assert first_key is not None
        if mixed:
            group_of: dict[GroupKey, list[int]] = {}
            for j, m in enumerate(messages):
                group_of.setdefault((m.topic, int(qids[j])), []).append(j)
            groups = [(k, np.asarray(v, np.intp)) for k, v in group_of.items()]
        else:
            groups = [(first_key, np.arange(n, dtype=np.intp))]
        if born_hosts and len(born_hosts) != n:
            born_hosts = [encode_host(m.born_host) if m.born_host else self.store_host for m in messages]
        hosts = born_hosts or [self.store_host]
        uniform_v4 = len(self.store_host) == HOST_V4 and len(set(hosts)) == 1 and len(hosts[0]) == HOST_V4
        body_lengths = np.fromiter(map(len, bodies), np.int64, count=n)
        sizes = body_lengths + np.fromiter(map(len, tails), np.int64, count=n) + HEADER_FIXED
        sizes += (
            np.fromiter(map(len, hosts), np.int64, count=len(hosts)) if len(hosts) == n else len(hosts[0])
        )
        sizes += len(self.store_host)
        limit = max_record_size(max_body)
        if int(sizes.max()) > limit:
            j = int(np.argmax(sizes))
            raise MessageTooLargeError(
                f"message {j} encodes to {int(sizes[j])} bytes, over the record limit {limit}",
                size=int(sizes[j]),
                limit=limit,
            )
        crcs = np.fromiter(map(crc32, bodies), np.uint32, count=n) & np.uint32(BODY_CRC_MASK)
        return PreparedBatch(
            bodies=bodies,
            tails=tails,
            topic_parts=topic_parts,
            magics=magics,
            crcs=crcs,
            queue_ids=qids,
            flags=flags,
            born_timestamps=born_ts,
            born_hosts=hosts,
            body_lengths=body_lengths,
            sizes=sizes,
            tags_codes=tags,
            groups=groups,
            index_keys=index_keys,
            index_messages=index_msgs,
            uniform_v4=uniform_v4,
        )

    def _prepare_plain(self, messages: Sequence[Message], now_ms: int) -> PreparedBatch | None:
        """The usual batch, built column by column with C-level passes (``map``, ``zip``,
        ``str.join``, numpy) instead of a Python loop per message: one topic; bodies of type
        ``bytes``; keys in tuples or lists, every message with at least one or none at all;
        no queue id, tags, properties, flag, born host or born timestamp; an IPv4 store host.

        Returns None for any other batch — and for any batch a rule would reject — so that
        :meth:`prepare`'s general loop handles it and raises its precise errors: this path
        never accepts what that loop would refuse, and encodes byte-identical records."""
        n = len(messages)
        if len(self.store_host) != HOST_V4 or set(map(type, messages)) != {Message}:
            return None
        # One list per field (no tuple per message: at 1,000 messages a call, short-lived
        # tuples would trigger collections that scan every object the caller holds).
        topics = list(map(_TOPIC, messages))
        if topics.count(topics[0]) != n:
            return None
        # One tuple per message, each freed before the next is made (``any`` over ``map``).
        if any(map(ne, map(_PLAIN_FIELDS, messages), itertools.repeat(_PLAIN_DEFAULTS))):
            return None
        bodies = list(map(_BODY, messages))
        keys_col = list(map(_KEYS, messages))
        if set(map(type, bodies)) != {bytes} or not set(map(type, keys_col)) <= {tuple, list}:
            return None
        topic = topics[0]
        magic, topic_part = self._topic(topic)  # validates the topic
        body_lengths = np.fromiter(map(len, bodies), np.int64, count=n)
        if int(body_lengths.max()) > self.max_body:
            return None
        counts = np.fromiter(map(len, keys_col), np.intp, count=n)
        all_keys: list[str] = list(itertools.chain.from_iterable(keys_col))
        if not all_keys:
            tails = [topic_part + bytes(PROPERTIES_LENGTH_WIDTH)] * n
            tail_lengths: npt.NDArray[np.int64] | int = len(tails[0])
            index_keys: list[str] = []
            index_msgs: list[int] = []
        else:
            joined = " ".join(all_keys) if set(map(type, all_keys)) == {str} else None
            if (
                joined is None
                or int(counts.min()) == 0  # some messages with keys, some without
                or joined.count(" ") != len(all_keys) - 1  # a key with a space
                or "\x01" in joined
                or "\x02" in joined
                or "" in all_keys
            ):
                return None
            per_message = all_keys if len(all_keys) == n else list(map(" ".join, keys_col))
            # Each message's KEYS value and its 0x02 terminator, encoded in one call; 0x01
            # cannot occur in a key (checked above), so it splits them apart again.
            try:
                pieces = ("\x02\x01".join(per_message) + "\x02").encode().split(b"\x01")
            except UnicodeEncodeError:
                return None  # a lone surrogate in a key: the general path names it
            piece_lengths = list(map(len, pieces))
            if max(piece_lengths) + len(_KEYS_PREFIX) > MAX_PROPERTIES_LENGTH:
                return None
            heads = {
                length: topic_part
                + (len(_KEYS_PREFIX) + length).to_bytes(PROPERTIES_LENGTH_WIDTH, "big")
                + _KEYS_PREFIX
                for length in set(piece_lengths)
            }
            tails = list(map(bytes.__add__, map(heads.__getitem__, piece_lengths), pieces))
            tail_lengths = np.fromiter(piece_lengths, np.int64, count=n) + (
                len(topic_part) + PROPERTIES_LENGTH_WIDTH + len(_KEYS_PREFIX)
            )
            index_keys = list(map((topic + "#").__add__, all_keys))
            index_msgs = list(range(n)) if len(all_keys) == n else np.repeat(np.arange(n), counts).tolist()
        sizes = body_lengths + tail_lengths + header_length(len(self.store_host), len(self.store_host))
        if int(sizes.max()) > max_record_size(self.max_body):
            return None
        qid = self._next_queue(topic)
        return PreparedBatch(
            bodies=bodies,
            tails=tails,
            topic_parts=[topic_part] * n,
            magics=np.full(n, magic, np.uint32),
            crcs=np.fromiter(map(crc32, bodies), np.uint32, count=n) & np.uint32(BODY_CRC_MASK),
            queue_ids=np.full(n, qid, np.int32),
            flags=np.zeros(n, np.int32),
            born_timestamps=np.full(n, now_ms, np.int64),
            born_hosts=[self.store_host],
            body_lengths=body_lengths,
            sizes=sizes,
            tags_codes=np.zeros(n, np.int64),
            groups=[((topic, qid), np.arange(n, dtype=np.intp))],
            index_keys=index_keys,
            index_messages=index_msgs,
            uniform_v4=True,
        )
