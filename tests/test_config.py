"""Configuration: defaults → TOML → TIERD_<SECTION>__<KEY> environment overrides."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tierd import TierdConfig
from tierd.config import SECTIONS, GiB, KiB, MiB, StoreConfig
from tierd.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


def test_defaults_match_the_design() -> None:
    cfg = TierdConfig()
    assert cfg.store.commitlog_file_size == GiB
    assert cfg.store.max_message_size == 4 * MiB
    assert cfg.store.flush == "async"
    assert cfg.tiered.group_commit_count == 4096
    assert cfg.tiered.group_commit_size == 4 * MiB
    assert cfg.tiered.read_ahead_size == 16 * MiB
    assert cfg.tiered.storage_level == "NOT_IN_DISK"
    assert cfg.backend.name == "posix"
    assert (cfg.server.host, cfg.server.port) == ("127.0.0.1", 8080)


def test_every_key_is_documented() -> None:
    for name, section in SECTIONS.items():
        for key, field in section.model_fields.items():
            assert field.description, f"[{name}] {key} has no description"


def test_rocketmq_names_are_recorded_where_they_exist() -> None:
    from tierd.config import TieredConfig

    extra = TieredConfig.model_fields["group_commit_count"].json_schema_extra
    assert extra == {"rocketmq": "tieredStoreGroupCommitCount"}


def test_shipped_local_profile_loads() -> None:
    cfg = TierdConfig.load(REPO / "conf" / "local.toml", env={})
    assert cfg.store.dir == Path("data/hot")
    assert cfg.backend.url == "data/cold"


@pytest.mark.parametrize("profile", sorted(p.name for p in (REPO / "conf").glob("*.toml")))
def test_every_shipped_profile_loads(profile: str) -> None:
    cfg = TierdConfig.load(REPO / "conf" / profile, env={})
    assert cfg.backend.name in ("posix", "s3")
    if cfg.backend.name == "s3":
        assert cfg.backend.url.startswith("s3://")
        assert "aws_secret_access_key" not in str(cfg.backend.storage_options).lower()


def test_toml_then_environment(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        '[store]\nflush = "sync"\ndefault_queues = 8\n[backend]\nstorage_options = {region_name = "eu"}\n'
    )
    cfg = TierdConfig.load(
        path,
        env={
            "TIERD_STORE__DEFAULT_QUEUES": "2",
            "TIERD_STORE__DIR": "/var/tierd",
            "TIERD_SERVER__TOKEN": "s3cret",
            "UNRELATED": "x",
        },
    )
    assert cfg.store.flush == "sync"
    assert cfg.store.default_queues == 2
    assert cfg.store.dir == Path("/var/tierd")
    assert cfg.server.token == "s3cret"
    assert cfg.backend.storage_options == {"region_name": "eu"}


@pytest.mark.parametrize(
    ("toml", "env", "match"),
    [
        ("[nope]\na = 1\n", {}, r"unknown config section \[nope\]"),
        ("[store]\nflsh = 'sync'\n", {}, "flsh"),
        ("[store]\nflush = 'sometimes'\n", {}, "store.flush"),
        ("[store]\ndefault_queues = 0\n", {}, "default_queues"),
        ("store = 3\n", {}, "must be a table"),
        ("[store\n", {}, "not valid TOML"),
        ("", {"TIERD_NOPE__X": "1"}, "unknown section 'nope'"),
        ("", {"TIERD_STORE__NOPE": "1"}, "unknown key 'nope'"),
        ("", {"TIERD_STORE__DEFAULT_QUEUES": "many"}, "default_queues"),
    ],
)
def test_bad_configuration_is_rejected_with_the_offending_key(
    tmp_path: Path, toml: str, env: dict[str, str], match: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError, match=match):
        TierdConfig.load(path, env=env)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        TierdConfig.load(tmp_path / "absent.toml", env={})


def test_with_overrides_validates() -> None:
    cfg = TierdConfig().with_overrides(store={"flush": "sync"})
    assert cfg.store.flush == "sync"
    with pytest.raises(ConfigError):
        cfg.with_overrides(store={"flush": 3})


def test_configuration_reference_is_up_to_date() -> None:
    from tierd.config import reference_markdown

    current = (REPO / "docs" / "configuration.md").read_text()
    assert current == reference_markdown(), "run: python -m tierd.docgen > docs/configuration.md"


def _segment_config(max_message_size: int, segment_size: int) -> dict[str, dict[str, int]]:
    return {
        "store": {"max_message_size": max_message_size},
        "tiered": {"commitlog_segment_size": segment_size},
    }


@pytest.mark.parametrize("max_message_size", [1, 4 * KiB, 4 * MiB])
def test_a_cold_segment_must_hold_the_largest_record(max_message_size: int) -> None:
    """A flat commitlog segment smaller than the largest record would leave a queue holding such
    a record untiered for good (and its hot files unfreeable): refused, naming both settings."""
    minimum = StoreConfig(max_message_size=max_message_size).max_record_size
    assert minimum > max_message_size  # headers, topic and properties come on top of the body
    with pytest.raises(ConfigError, match=r"tiered\.commitlog_segment_size") as caught:
        TierdConfig.from_dict(_segment_config(max_message_size, minimum - 1))
    message = str(caught.value)
    assert f"{minimum - 1}" in message
    assert f"store.max_message_size {max_message_size}" in message
    assert f"at least {minimum}" in message
    assert caught.value.detail == {
        "commitlog_segment_size": minimum - 1,
        "minimum": minimum,
        "max_message_size": max_message_size,
    }
    cfg = TierdConfig.from_dict(_segment_config(max_message_size, minimum))
    assert cfg.tiered.commitlog_segment_size == minimum


def test_raising_the_body_limit_past_the_segment_is_refused_too() -> None:
    """The rule holds whichever of the two settings moves: here the body limit."""
    cfg = TierdConfig.from_dict(_segment_config(4 * KiB, MiB))
    with pytest.raises(ConfigError, match=r"tiered\.commitlog_segment_size") as caught:
        cfg.with_overrides(store={"max_message_size": MiB})
    assert caught.value.detail["max_message_size"] == MiB


def test_serve_refuses_a_cold_segment_too_small_in_one_line(tmp_path: Path) -> None:
    """The operator's view: ``tierd serve`` exits non-zero with one line naming the value, the
    minimum and both settings — before it creates or opens anything."""
    max_message_size = 4 * KiB
    minimum = StoreConfig(max_message_size=max_message_size).max_record_size
    path = tmp_path / "tierd.toml"
    path.write_text(
        f'[store]\ndir = "{tmp_path / "hot"}"\nmax_message_size = {max_message_size}\n'
        f"[tiered]\ncommitlog_segment_size = {minimum - 1}\n"
        f'[backend]\nurl = "{tmp_path / "cold"}"\n'
    )
    proc = subprocess.run(
        [sys.executable, "-c", "from tierd.cli import main; main()", "--config", str(path), "serve"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"tierd: error: tiered.commitlog_segment_size {minimum - 1} ")
    assert f"store.max_message_size {max_message_size}" in lines[0]
    assert f"at least {minimum}" in lines[0]
    assert not (tmp_path / "hot").exists()
