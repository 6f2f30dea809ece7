"""Messages between the protocol's ``Message`` and tierd's :class:`~tierd.message.Message` /
:class:`~tierd.format.message_ext.MessageExt`, so that a message sent over gRPC reads back over
HTTP, the CLI and Spark with the same id, keys, tag and properties, and the reverse.

What goes where (RocketMQ's own property names, as its broker stores them):

* the client's message id → the ``UNIQ_KEY`` property (HTTP ``/query`` finds it by that key);
  a message produced without one is delivered with its offset message id;
* tag → ``TAGS``, keys → ``KEYS``, message group → ``__SHARDINGKEY``;
* user properties → the remaining properties (names the store reserves are refused).
"""

from __future__ import annotations

import gzip
import zlib
from typing import TYPE_CHECKING, Any

from google.protobuf import duration_pb2, timestamp_pb2
from rocketmq.grpc_protocol import definition_pb2 as pb

from tierd.consumption.inflight import PROPERTY_MESSAGE_GROUP
from tierd.errors import InvalidPropertiesError
from tierd.format.properties import KEY_SEPARATOR, PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_KEY
from tierd.grpc.codes import UnsupportedFeatureError
from tierd.message import Message

if TYPE_CHECKING:
    from tierd.format.message_ext import MessageExt

#: Properties the store or the protocol gives a meaning: never user properties.
SYSTEM_PROPERTIES = frozenset({PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_KEY, PROPERTY_MESSAGE_GROUP})
#: TRANSACTION: a half message (the servicer hands it to the transaction coordinator).
SUPPORTED_TYPES = frozenset({pb.NORMAL, pb.FIFO, pb.TRANSACTION, pb.MESSAGE_TYPE_UNSPECIFIED})


def body_of(m: Any) -> bytes:
    encoding = m.system_properties.body_encoding
    if encoding == pb.GZIP:
        try:
            return gzip.decompress(m.body)
        except (OSError, EOFError, zlib.error) as e:
            raise UnsupportedFeatureError(f"GZIP body does not decompress: {e}") from e
    return bytes(m.body)


def to_message(m: Any, queue_id: int | None) -> Message:
    """The protocol message as tierd stores it (validation of names and sizes is the store's).

    Runs per message of every send: each field is read once (a protobuf field read builds a
    Python object each time), and unset optional strings read as ``""``, so no ``HasField``."""
    sp = m.system_properties
    if sp.message_type not in SUPPORTED_TYPES:
        raise UnsupportedFeatureError(
            f"message type {pb.MessageType.Name(sp.message_type)} is not supported by tierd yet "
            "(NORMAL, FIFO and TRANSACTION are)",
            message_type=pb.MessageType.Name(sp.message_type),
        )
    if sp.HasField("delivery_timestamp"):
        raise UnsupportedFeatureError("delayed delivery (delivery_timestamp) is not supported by tierd yet")
    user = m.user_properties
    properties = {name: user[name] for name in user}  # dict(user) iterates in Python: 2× slower
    if not SYSTEM_PROPERTIES.isdisjoint(properties):
        name = next(n for n in properties if n in SYSTEM_PROPERTIES)
        raise InvalidPropertiesError(f"user property {name!r} is reserved by the store", property=name)
    if message_id := sp.message_id:
        properties[PROPERTY_UNIQ_KEY] = message_id
    if group := sp.message_group:
        properties[PROPERTY_MESSAGE_GROUP] = group
    born = sp.born_timestamp
    born_ms = born.seconds * 1000 + born.nanos // 1_000_000
    return Message(
        topic=m.topic.name,
        body=body_of(m) if sp.body_encoding == pb.GZIP else m.body,
        queue_id=queue_id,
        keys=tuple(sp.keys),
        tags=sp.tag or None,
        properties=properties,
        born_timestamp=born_ms if born_ms > 0 else None,
    )


def _timestamp(ms: int) -> Any:
    return timestamp_pb2.Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def to_protocol(ext: MessageExt, handle: str, attempt: int, invisible: float) -> Any:
    """A stored message as a consumer receives it."""
    props = ext.properties
    group = props.get(PROPERTY_MESSAGE_GROUP)
    sp = pb.SystemProperties(
        message_id=props.get(PROPERTY_UNIQ_KEY) or ext.msg_id,
        body_digest=pb.Digest(type=pb.CRC32, checksum=format(zlib.crc32(ext.body) & 0xFFFFFFFF, "08X")),
        body_encoding=pb.IDENTITY,
        message_type=pb.FIFO if group else pb.NORMAL,
        born_timestamp=_timestamp(ext.born_timestamp),
        born_host=ext.born_host,
        store_timestamp=_timestamp(ext.store_timestamp),
        store_host=ext.store_host,
        receipt_handle=handle,
        queue_id=ext.queue_id,
        queue_offset=ext.queue_offset,
        invisible_duration=duration_pb2.Duration(seconds=int(invisible), nanos=int(invisible % 1 * 1e9)),
        delivery_attempt=attempt,
    )
    if tag := props.get(PROPERTY_TAGS):
        sp.tag = tag
    if keys := props.get(PROPERTY_KEYS):
        sp.keys.extend(k for k in keys.split(KEY_SEPARATOR) if k)
    if group:
        sp.message_group = group
    return pb.Message(
        topic=pb.Resource(name=ext.topic),
        user_properties={k: v for k, v in props.items() if k not in SYSTEM_PROPERTIES},
        system_properties=sp,
        body=ext.body,
    )
