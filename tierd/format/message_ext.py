"""The stored message: what decoding a record yields, from either tier.

It is the read side of the record format, built by :mod:`tierd.format.record` and
:mod:`tierd.format.batch` millions of times per second on cold reads, hence here, below every
layer that returns it (the public name is ``tierd.MessageExt``).
"""

from __future__ import annotations

import binascii
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from tierd.format.host import encode_host
from tierd.format.message_id import offset_msg_id
from tierd.format.properties import (
    KEY_SEPARATOR,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    decode_properties,
    encode_properties,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

_EMPTY: Mapping[str, str] = MappingProxyType({})


@dataclass(slots=True)
class MessageExt:
    """A stored message as read back from either tier. (Not frozen: reads build millions of
    these, and frozen dataclasses pay an ``object.__setattr__`` per field.)

    ``commitlog_offset`` is the record's PHYSICALOFFSET field: the hot commitlog offset for hot
    reads, the queue's flat commitlog offset for cold reads (FORMATS §2.2). ``msg_id`` is the
    offset message id derived from STOREHOST and that offset.

    ``raw_properties`` is the record's PROPERTIES field as stored (UTF-8, checked when read;
    ``name 0x01 value 0x02`` per pair); :attr:`properties` parses it on first access. Most
    consumers never look at properties; a lazy mapping object per message cost ~0.15 µs more
    per decoded message (~7 %) and one more object for the garbage collector to scan.
    """

    topic: str
    queue_id: int
    queue_offset: int
    body: bytes
    raw_properties: bytes
    store_timestamp: int
    born_timestamp: int
    born_host: str
    store_host: str
    commitlog_offset: int
    size: int
    flag: int = 0
    sys_flag: int = 0
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    body_crc: int = 0
    _properties: Mapping[str, str] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def properties(self) -> Mapping[str, str]:
        """The properties as a read-only mapping (parsed once, on first access)."""
        if self._properties is None:
            if self.raw_properties:
                self._properties = MappingProxyType(decode_properties(self.raw_properties))
            else:
                self._properties = _EMPTY
        return self._properties

    @property
    def msg_id(self) -> str:
        """Offset message id (STOREHOST hex + PHYSICALOFFSET), computed on demand: most readers
        never look at it, and formatting it costs as much as decoding the rest."""
        return offset_msg_id(encode_host(self.store_host), self.commitlog_offset)

    @property
    def keys(self) -> tuple[str, ...]:
        raw = self.properties.get(PROPERTY_KEYS, "")
        return tuple(k for k in raw.split(KEY_SEPARATOR) if k)

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(PROPERTY_UNIQ_KEY)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> MessageExt:
        """A message from its :meth:`to_json` form (what the CLI receives from a daemon): keys,
        tags and the message id follow from the properties and offsets, as for a message read
        from disk."""
        return cls(
            topic=doc["topic"],
            queue_id=doc["queue_id"],
            queue_offset=doc["queue_offset"],
            body=binascii.a2b_base64(doc["body"]),
            raw_properties=encode_properties(doc.get("properties") or {}),
            store_timestamp=doc["store_timestamp"],
            born_timestamp=doc["born_timestamp"],
            born_host=doc["born_host"],
            store_host=doc["store_host"],
            commitlog_offset=doc["commitlog_offset"],
            size=doc["size"],
            flag=doc["flag"],
            sys_flag=doc["sys_flag"],
            reconsume_times=doc["reconsume_times"],
            prepared_transaction_offset=doc["prepared_transaction_offset"],
            body_crc=doc["body_crc"],
        )

    def to_json(self) -> dict[str, Any]:
        """Every field, JSON-ready (body in standard base64): the one shape both the HTTP API
        and ``tierd --output json`` use for a message."""
        return {
            "topic": self.topic,
            "queue_id": self.queue_id,
            "queue_offset": self.queue_offset,
            "body": binascii.b2a_base64(self.body, newline=False).decode("ascii"),
            "keys": list(self.keys),
            "tags": self.tags,
            "properties": dict(self.properties),
            "msg_id": self.msg_id,
            "store_timestamp": self.store_timestamp,
            "born_timestamp": self.born_timestamp,
            "born_host": self.born_host,
            "store_host": self.store_host,
            "commitlog_offset": self.commitlog_offset,
            "size": self.size,
            "flag": self.flag,
            "sys_flag": self.sys_flag,
            "reconsume_times": self.reconsume_times,
            "prepared_transaction_offset": self.prepared_transaction_offset,
            "body_crc": self.body_crc,
        }
