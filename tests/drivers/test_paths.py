"""Cold-tier path naming against RocketMQ's verified vectors (FORMATS §2.1, ROCKETMQ §3.3)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tierd.drivers.paths import (
    cluster_dir,
    get_hash,
    index_segment_path,
    parse_segment_name,
    queue_path,
    segment_name,
    segment_path,
)
from tierd.drivers.segment import FileType
from tierd.errors import InvalidArgumentError


def test_rocketmq_hash_vectors() -> None:
    assert get_hash("DefaultCluster") == "212d6b50"
    assert get_hash("TieredStorageDailyTest") == "161c08ff"
    assert cluster_dir("DefaultCluster") == "212d6b50_DefaultCluster"


@pytest.mark.parametrize(
    ("offset", "name"),
    [
        (0, "cfcd208400000000000000000000"),
        (1_073_741_775, "1f329fef00000000001073741775"),
        (4_294_937_144, "b10da56800000000004294937144"),
    ],
)
def test_segment_name_vectors(offset: int, name: str) -> None:
    assert segment_name(offset) == name
    assert len(name) == 28
    assert parse_segment_name(name) == offset


@given(st.integers(0, 10**20 - 1))
def test_segment_name_round_trip(offset: int) -> None:
    assert parse_segment_name(segment_name(offset)) == offset


@pytest.mark.parametrize("offset", [-1, 10**20])
def test_segment_name_rejects_offsets_that_do_not_fit(offset: int) -> None:
    with pytest.raises(InvalidArgumentError):
        segment_name(offset)


@pytest.mark.parametrize(
    "name",
    [
        "",
        "cfcd20840000000000000000000",
        "CFCD208400000000000000000000",
        "cfcd2084000000000000000000x0",
        "00000000" + "0" * 20,
    ],  # wrong hash prefix for offset 0
)
def test_parse_segment_name_rejects_foreign_names(name: str) -> None:
    with pytest.raises(InvalidArgumentError):
        parse_segment_name(name)


def test_segment_paths() -> None:
    assert (
        segment_path("", "DefaultCluster", "broker-a", "TopicTest", 3, FileType.COMMIT_LOG, 0)
        == "212d6b50_DefaultCluster/broker-a/TopicTest/3/COMMIT_LOG/cfcd208400000000000000000000"
    )
    assert (
        segment_path("/bucket-prefix/", "DefaultCluster", "b", "t", 0, FileType.CONSUME_QUEUE, 1_073_741_775)
        == "bucket-prefix/212d6b50_DefaultCluster/b/t/0/CONSUME_QUEUE/1f329fef00000000001073741775"
    )
    assert (
        index_segment_path("", "DefaultCluster", "broker-a", 0)
        == "212d6b50_DefaultCluster/broker-a/rmq_sys_INDEX/0/INDEX/cfcd208400000000000000000000"
    )
    assert queue_path("broker-a", "orders", 7) == "broker-a/orders/7"


@pytest.mark.parametrize(
    ("broker", "topic", "queue_id"), [("", "t", 0), ("b", "a/b", 0), ("b", "..", 0), ("b", "t", -1)]
)
def test_bad_path_components_are_rejected(broker: str, topic: str, queue_id: int) -> None:
    with pytest.raises(InvalidArgumentError):
        queue_path(broker, topic, queue_id)


def test_file_type_codes() -> None:
    assert [t.value for t in FileType] == [0, 1, 2]
    assert FileType.from_code(1) is FileType.CONSUME_QUEUE
    assert FileType.from_code(99) is FileType.COMMIT_LOG  # RocketMQ's fallback
