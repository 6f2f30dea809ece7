"""Configuration: defaults → TOML → TIERD_<SECTION>__<KEY> environment overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

from tierd import TierdConfig
from tierd.config import SECTIONS, GiB, MiB
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
