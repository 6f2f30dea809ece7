"""The PROPERTIES field (FORMATS §1.1): ``name 0x01 value 0x02`` per pair, UTF-8, at most
32767 bytes — and the property names with a meaning to the store (RocketMQ's MessageConst)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Mapping

PROP_NAME_SEP: Final = "\x01"
PROP_SEP: Final = "\x02"
MAX_PROPERTIES_LENGTH: Final = 32767

#: Property names with a meaning to the store (RocketMQ's MessageConst).
PROPERTY_KEYS: Final = "KEYS"
PROPERTY_TAGS: Final = "TAGS"
PROPERTY_UNIQ_KEY: Final = "UNIQ_KEY"
#: KEYS holds a message's keys separated by this.
KEY_SEPARATOR: Final = " "


def encode_properties(props: Mapping[str, str]) -> bytes:
    """``name 0x01 value 0x02`` per pair, UTF-8. Validation (separators, length) is the caller's
    (see :mod:`tierd.local.validation`) so the hot path checks once."""
    return "".join(f"{k}\x01{v}\x02" for k, v in props.items()).encode()


def decode_properties(raw: bytes | str) -> dict[str, str]:
    """Split on 0x02, then on the first 0x01; pieces without a name or value are ignored, as
    RocketMQ does."""
    text = raw.decode() if isinstance(raw, bytes | bytearray | memoryview) else raw
    out: dict[str, str] = {}
    for item in text.split(PROP_SEP):
        name, sep, value = item.partition(PROP_NAME_SEP)
        if sep and name and value:
            out[name] = value
    return out
