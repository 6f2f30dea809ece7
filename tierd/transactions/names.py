"""What a transaction is made of on disk: system topics, property names, resolutions.

Storage keeps RocketMQ's shape so a RocketMQ-literate operator recognises it. A half message is
stored in :data:`HALF_TOPIC` (queue 0) with its real topic in ``REAL_TOPIC`` (and queue in
``REAL_QID`` when the producer chose one), ``TRAN_MSG=true`` and its producer group in
``PGROUP``. Every later fact about it — a check-back asked, a commit, a rollback — is one record
in :data:`OP_TOPIC` (RocketMQ's op-half topic) naming the transaction, written *before* the
answer is given. :data:`PROGRESS_TOPIC` holds where a restart begins reading both (the last
record wins), so a restart reads only what may still matter, not the whole history.

RocketMQ names its system topics ``RMQ_SYS_…``; tierd reserves the lower-case ``rmq_sys_``
prefix for its own files, which the upper-case names do not collide with.
"""

from __future__ import annotations

import enum
from typing import Final

from tierd.errors import InvalidArgumentError

#: Half messages (queue 0): RocketMQ's RMQ_SYS_TRANS_HALF_TOPIC.
HALF_TOPIC: Final = "RMQ_SYS_TRANS_HALF_TOPIC"
#: Resolution and check-back records (queue 0): RocketMQ's RMQ_SYS_TRANS_OP_HALF_TOPIC.
OP_TOPIC: Final = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
#: Restart progress (queue 0): where to begin reading the two topics above.
PROGRESS_TOPIC: Final = "RMQ_SYS_TRANS_PROGRESS"
SYSTEM_TOPICS: Final = frozenset({HALF_TOPIC, OP_TOPIC, PROGRESS_TOPIC})

#: RocketMQ's MessageConst names, on the half message.
PROPERTY_REAL_TOPIC: Final = "REAL_TOPIC"
PROPERTY_REAL_QID: Final = "REAL_QID"
PROPERTY_TRANSACTION_PREPARED: Final = "TRAN_MSG"
PROPERTY_PRODUCER_GROUP: Final = "PGROUP"
#: On the committed message (and on op records): the transaction it came from. With the
#: message's UNIQ_KEY (indexed) it is how a restart tells "committed already" from "pending".
PROPERTY_TRANSACTION_ID: Final = "__transactionId__"
#: Properties that belong to the half message, not to the committed one.
HALF_ONLY: Final = frozenset(
    {PROPERTY_REAL_TOPIC, PROPERTY_REAL_QID, PROPERTY_TRANSACTION_PREPARED, PROPERTY_PRODUCER_GROUP}
)

#: On op records: what happened (an :class:`Op` value), to which half, and why.
PROPERTY_OP: Final = "TRAN_OP"
PROPERTY_HALF_OFFSET: Final = "TRAN_HALF_OFFSET"
PROPERTY_CHECKS: Final = "TRANSACTION_CHECK_TIMES"
PROPERTY_REASON: Final = "TRAN_REASON"
#: RocketMQ tags an op-half record "d" (the half is done with).
OP_TAG: Final = "d"
#: On progress records: the first half offset and op offset a restart reads.
PROPERTY_HALF_FROM: Final = "HALF_FROM"
PROPERTY_OP_FROM: Final = "OP_FROM"


class Resolution(enum.Enum):
    """How a transaction ends (RocketMQ's TransactionResolution, less UNKNOWN: an unknown answer
    to a check-back leaves the transaction pending)."""

    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"

    @classmethod
    def parse(cls, value: object) -> Resolution:
        if isinstance(value, Resolution):
            return value
        try:
            return cls(str(value).upper())
        except ValueError:
            raise InvalidArgumentError(
                f"resolution must be COMMIT or ROLLBACK, got {value!r}", resolution=repr(value)
            ) from None


class Op(enum.Enum):
    """What an op record says about a half message."""

    CHECK = "CHECK"
    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"


class Reason(enum.Enum):
    """Why a transaction was resolved (kept on the op record, reported in logs and metrics)."""

    #: The producer said so (commit / rollback call, or its answer to a check-back).
    PRODUCER = "producer"
    #: Nobody answered ``transactions.check_max`` check-backs.
    CHECK_MAX = "check-max"
    #: A restart found the committed message written and its record missing (a crash between).
    RECOVERED = "recovered"
