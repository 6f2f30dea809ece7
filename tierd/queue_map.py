"""A dict keyed by ``(topic, queue id)`` that also keeps each topic's highest queue id.

The hot store's consume queues and the cold tier's flat files are each such a dict, and a store
may hold tens of thousands of queues. "How many queues does this topic spread over?" is asked
on every produce that places a message group (gRPC ``SendMessage``, HTTP ``message_group``);
answered by a pass over every queue of every topic it cost milliseconds a request at 10,000
queues. Here it is one lookup. Reads (``get``, ``[]``, iteration) are the plain dict's; the
writes that change the key set keep the index (the others are refused).
"""

from __future__ import annotations

from typing import Any, NoReturn, TypeVar, overload

_V = TypeVar("_V")
_T = TypeVar("_T")

QueueKey = tuple[str, int]
_MISSING: Any = object()


class QueueMap(dict[QueueKey, _V]):
    """``(topic, queue id)`` → value, with :meth:`highest_queue` per topic.

    Callers that insert from several threads already serialise their writes (the hot store's
    queue lock, the event loop); a reader on another thread sees each topic's entry as a whole
    (one dict lookup)."""

    __slots__ = ("_highest",)

    def __init__(self) -> None:
        super().__init__()
        self._highest: dict[str, int] = {}

    def highest_queue(self, topic: str) -> int | None:
        """The highest queue id ``topic`` has here, None when it has none."""
        return self._highest.get(topic)

    def __setitem__(self, key: QueueKey, value: _V) -> None:
        super().__setitem__(key, value)
        topic, queue_id = key
        if queue_id > self._highest.get(topic, -1):
            self._highest[topic] = queue_id

    def __delitem__(self, key: QueueKey) -> None:
        super().__delitem__(key)
        self._recount(key[0])

    @overload
    def pop(self, key: QueueKey, /) -> _V: ...
    @overload
    def pop(self, key: QueueKey, default: _V, /) -> _V: ...
    @overload
    def pop(self, key: QueueKey, default: _T, /) -> _V | _T: ...
    def pop(self, key: QueueKey, default: Any = _MISSING, /) -> Any:
        if key not in self:
            if default is _MISSING:
                raise KeyError(key)
            return default
        value = super().pop(key)
        self._recount(key[0])
        return value

    def _recount(self, topic: str) -> None:
        """After a removal (rare: a topic deleted, a queue rolled back): ``topic``'s highest id
        from its remaining keys. ``list(self)`` copies the keys in one C call, under the GIL."""
        ids = [q for t, q in list(self) if t == topic]
        if ids:
            self._highest[topic] = max(ids)
        else:
            self._highest.pop(topic, None)

    def _refuse(self, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError("QueueMap keeps an index: set items with [] and remove them with del or pop")

    setdefault = update = popitem = clear = __ior__ = _refuse
