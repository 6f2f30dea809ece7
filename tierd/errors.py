"""Typed errors for every layer of tierd.

Every error tierd raises on purpose derives from :class:`TierdError` *and* from the builtin
exception a Python caller would naturally catch (``ValueError`` for bad input,
``FileNotFoundError`` for missing objects, ``OSError`` for backend faults, ...). Callers can
therefore write ``except ValueError`` without knowing tierd, or ``except TierdError`` to catch
all of ours. Messages name the parameter, what was expected and the value received; the CLI and
HTTP layers print ``str(err)`` and never a stack trace.

Each class has a stable ``code`` (used as the ``error`` field of HTTP error bodies and in JSON
CLI output) and an ``http_status``.
"""

from __future__ import annotations

from typing import Any, ClassVar


class TierdError(Exception):
    """Root of all tierd errors."""

    code: ClassVar[str] = "tierd_error"
    http_status: ClassVar[int] = 500

    def __init__(self, message: str, **detail: Any) -> None:
        super().__init__(message)
        self.message = message
        #: Structured context (offending value, path, offsets, ...) for logs and JSON output.
        self.detail: dict[str, Any] = detail

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:
        # Keep errors picklable (they cross process boundaries in Spark and subprocess tests).
        return (_rebuild_error, (type(self), self.message, self.detail))


def _rebuild_error(cls: type[TierdError], message: str, detail: dict[str, Any]) -> TierdError:
    err = cls.__new__(cls)
    TierdError.__init__(err, message, **detail)
    return err


# --------------------------------------------------------------------------- input validation
class InvalidArgumentError(TierdError, ValueError):
    """A caller passed a value outside the documented limits."""

    code = "invalid_argument"
    http_status = 400


class InvalidTopicError(InvalidArgumentError):
    """Topic name violates the naming rules (see docs/limits.md)."""

    code = "invalid_topic"


class MessageTooLargeError(InvalidArgumentError):
    """Body larger than ``store.max_message_size`` or record larger than the record limit."""

    code = "message_too_large"
    http_status = 413


class InvalidPropertiesError(InvalidArgumentError):
    """Properties too long, empty, or containing the reserved separator bytes 0x01/0x02."""

    code = "invalid_properties"


class InvalidQueueError(InvalidArgumentError):
    """Queue id out of range for the topic."""

    code = "invalid_queue"


class InvalidRangeError(InvalidArgumentError):
    """A byte or offset range that is negative, empty or overflowing."""

    code = "invalid_range"


class ConfigError(InvalidArgumentError):
    """Configuration file or environment override is invalid."""

    code = "config_error"


# --------------------------------------------------------------------------- store state
class StoreClosedError(TierdError, RuntimeError):
    """Operation on a store (or segment) that has been closed."""

    code = "store_closed"
    http_status = 503


class NotReadyError(TierdError, TimeoutError):
    """An answer needs a part of the store that has not finished loading (the cold tier's
    metadata at start-up, or the store itself while it recovers). Retriable: the same call
    succeeds once loading is done. ``detail["retry_after"]`` suggests a pause in seconds
    (HTTP: 503 ``not_ready`` with a ``Retry-After`` header)."""

    code = "not_ready"
    http_status = 503

    @property
    def retry_after(self) -> int:
        return max(1, int(self.detail.get("retry_after", 1)))


class StoreLockedError(TierdError, BlockingIOError):
    """Another process holds the store directory's lock file."""

    code = "store_locked"
    http_status = 503


class StoreFullError(TierdError, OSError):
    """Writes refused: the disk is nearly full and history may not be dropped."""

    code = "store_full"
    http_status = 507


class ResourceExhaustedError(TierdError, OSError):
    """The process ran out of an operating-system resource (open files, memory maps). Retrying
    later may succeed; the message names the limit and the setting that bounds tierd's use."""

    code = "resource_exhausted"
    http_status = 503


# --------------------------------------------------------------------------- data integrity
class CorruptionError(TierdError, ValueError):
    """Bytes on disk or in the bucket do not decode: bad magic, bad length, CRC mismatch, gaps."""

    code = "corruption"


class CorruptRecordError(CorruptionError):
    """One commitlog record failed validation. ``detail`` names the position and the reason."""

    code = "corrupt_record"


class LostMessagesError(CorruptionError):
    """Queue offsets whose messages were lost to damage found in the hot commitlog before they
    were tiered (a quarantined *hole*, see docs/hot-store.md). ``detail``: ``first`` and
    ``count`` of the consecutive lost offsets."""

    code = "lost_messages"

    @property
    def count(self) -> int:
        return int(self.detail.get("count", 1))


# --------------------------------------------------------------------------- backend / segments
class BackendError(TierdError, OSError):
    """A storage backend failed (network, permission, server error). Usually retryable."""

    code = "backend_error"
    http_status = 502


class UnsafeBackendError(BackendError):
    """The backend behaves in a way that would let tierd overwrite or lose committed data (an S3
    server that ignores ``If-None-Match``/``If-Match``, returns wrong bytes for ranged reads, ...).
    Tiering is refused until the configuration accepts the risk explicitly; the message names
    what the server did and the setting that opts out. Not retryable by waiting."""

    code = "backend_unsafe"


class CredentialsError(BackendError):
    """The backend refused or could not sign a request: no credentials, or ones it rejects.
    Not retryable until the environment changes; the message names where credentials come from."""

    code = "backend_credentials"


class SegmentNotFoundError(TierdError, FileNotFoundError):
    """The backend has no object/file for the segment."""

    code = "segment_not_found"
    http_status = 404


class SegmentReadError(InvalidRangeError):
    """A read outside a segment's committed bytes (past the end, negative, empty)."""

    code = "segment_read_out_of_range"


class SegmentSealedError(TierdError, PermissionError):
    """A write to a segment that has been sealed (immutable)."""

    code = "segment_sealed"
    http_status = 409


class ConcurrentCommitError(TierdError, RuntimeError):
    """A commit was attempted while another commit of the same segment is in flight."""

    code = "concurrent_commit"
    http_status = 409


class ObjectExistsError(TierdError, FileExistsError):
    """A conditional create (:meth:`~tierd.drivers.segment.DriverRoot.create_object`) found an
    object already stored at the path: another writer created it first."""

    code = "object_exists"
    http_status = 409


class UnsupportedOperationError(ConfigError):
    """The configured backend cannot do what was asked with the guarantee tierd needs (e.g. an
    atomic create-if-absent); ``detail`` names the backend and the operation."""

    code = "unsupported_operation"


class PrefixOwnedError(TierdError, PermissionError):
    """The cold tier's ``{cluster}/{broker}`` prefix is owned by another store: this store must
    not write there. ``detail`` names the owner (store id, host, since when, epoch)."""

    code = "prefix_owned"
    http_status = 409


class ReadOnlyError(TierdError, PermissionError):
    """A write through a bucket opened read-only (``tierd --bucket URL ...``, a DR drill): it
    reads the cold tier and never writes or claims anything. ``detail`` names the operation."""

    code = "read_only"
    http_status = 409


class DriverNotFoundError(ConfigError):
    """No segment driver registered under the configured name."""

    code = "driver_not_found"


class DriverDependencyError(ConfigError, ImportError):
    """A driver is registered but its optional dependency is not installed."""

    code = "driver_dependency_missing"


class NotFoundError(TierdError, LookupError):
    """A topic, queue or message does not exist."""

    code = "not_found"
    http_status = 404


class MessageNotFoundError(NotFoundError):
    """No stored message has this message id (``tierd message``): neither a record at the hot
    commitlog position an offset id names, nor a message whose UNIQ_KEY is the id. The detail
    names the id and, where it tells the operator something, why (an expired position)."""

    code = "message_not_found"


class AmbiguousMessageIdError(TierdError, LookupError):
    """More than one stored message answers to a message id (a producer's retry stored the same
    UNIQ_KEY twice, or the same id in two topics): the detail lists them as
    ``topic/queue@offset`` so the operator reads the one meant by position, or narrows by topic."""

    code = "ambiguous_message_id"
    http_status = 409


# --------------------------------------------------------------------------- consumers
class InvalidSubscriptionError(InvalidArgumentError):
    """A tag subscription expression that does not parse (``tags="paid || refunded"``)."""

    code = "invalid_subscription"


class InvalidGroupError(InvalidArgumentError):
    """A consumer group name that breaks the naming rules, or one group too many."""

    code = "invalid_group"


class OffsetOutOfRangeError(InvalidRangeError):
    """An offset to commit or reset to lies outside the queue's readable range."""

    code = "offset_out_of_range"


# --------------------------------------------------------------------------- topic admin
class TopicExistsError(TierdError, FileExistsError):
    """``create`` of a topic that is already there (declared, or holding messages)."""

    code = "topic_exists"
    http_status = 409


class TopicInUseError(TierdError, RuntimeError):
    """``delete`` of a topic a consumer group or a pending tiering round still needs (use
    ``force`` to delete anyway)."""

    code = "topic_in_use"
    http_status = 409


class TopicDeletingError(TopicInUseError):
    """A write to a topic whose delete is under way (resumed at start, or its cold part waiting
    for the bucket): refused until the delete has finished, so the topic is not made anew
    halfway through it."""

    code = "topic_deleting"


class QueueShrinkError(InvalidArgumentError):
    """A topic's queue count can only grow: a queue taken away would strand its messages and
    move message groups to other queues, out of order."""

    code = "queue_count_shrink"


# --------------------------------------------------------------------------- scheduled messages
class DeliveryTimeError(InvalidArgumentError):
    """A scheduled message's delivery time is in the past or beyond the longest delay the store
    accepts (``scheduled.max_delay``), or its delay level is not one of ``scheduled.delay_levels``
    (docs/scheduled.md). The detail names the value and the bound."""

    code = "invalid_delivery_time"


class UnknownHandleError(NotFoundError):
    """A recall names a handle this store never gave out (or one whose message retention has
    already dropped)."""

    code = "unknown_handle"


class AlreadyDeliveredError(TierdError, RuntimeError):
    """A recall came too late: the scheduled message is already in its topic (or being written
    there). Consumers may have read it; nothing is taken back."""

    code = "already_delivered"
    http_status = 409


# --------------------------------------------------------------------------- transactional messages
class UnknownTransactionError(NotFoundError):
    """A commit or rollback names a transaction this store has no half message for: never begun
    here, a typo, or resolved so long ago that the store no longer remembers it
    (docs/transactions.md). The detail names the transaction id."""

    code = "unknown_transaction"


class TransactionResolvedError(TierdError, RuntimeError):
    """A commit or rollback of a transaction that is already resolved. ``detail["resolution"]``
    says how (``COMMIT`` or ``ROLLBACK``): a producer retrying a commit whose answer it lost
    learns that it did commit, and the message was written once."""

    code = "transaction_resolved"
    http_status = 409
