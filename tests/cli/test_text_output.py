"""Text output: what people read, written as it is.

Tables and lines used to go through rich's console, which read every cell and line as rich
markup with emoji codes: a message body ``[red]x[/red] :smile:`` showed as ``x 😄`` — a wrong
body on the screen. Tables written to a pipe now skip rich (about 25 ms of a start,
docs/performance.md, "CLI start-up"), so the own layout must print exactly what rich prints.
"""

from __future__ import annotations

import io
import os
import pty
import random
import select
import subprocess
import sys
import time
from typing import TYPE_CHECKING

import pytest
from rich.console import Console

from tierd.cli.app import PIPE_WIDTH, plain_table, rich_table

from .test_remote import cli, ok

if TYPE_CHECKING:
    from pathlib import Path

#: A body and a key that rich would have read as markup and emoji codes.
BODY = "[red]x[/red] :smile: [b]"
KEY = "[b]k:smile:"


def _store(tmp_path: Path) -> dict[str, str]:
    cfg = tmp_path / "tierd.toml"
    cfg.write_text(f'[store]\ndir = "{tmp_path / "hot"}"\n[tiered]\nenabled = false\n')
    env = {"TIERD_CONFIG": str(cfg)}
    ok(cli("produce", "t", BODY, "-k", KEY, env=env))
    return env


def _on_a_terminal(env: dict[str, str], *args: str) -> str:
    """``tierd ARGS`` with stdout on a pseudo-terminal (as a person runs it); what it printed."""
    main, secondary = pty.openpty()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TIERD_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tierd.cli", *args],
        stdin=subprocess.DEVNULL,
        stdout=secondary,
        stderr=subprocess.PIPE,
        env={**clean, **env, "COLUMNS": "200", "TERM": "xterm"},
    )
    os.close(secondary)
    out = b""
    deadline = time.monotonic() + 60
    try:
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"no end of output within 60 s; so far {out!r}"
            ready, _, _ = select.select([main], [], [], min(left, 1.0))
            if not ready:
                continue
            try:
                chunk = os.read(main, 65536)
            except OSError:  # EIO: the process closed the terminal
                break
            if not chunk:
                break
            out += chunk
        assert proc.wait(60) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        os.close(main)
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        if proc.stderr is not None:
            proc.stderr.close()
    return out.decode()


def test_a_table_on_a_pipe_shows_the_body_as_it_is(tmp_path: Path) -> None:
    env = _store(tmp_path)
    text = ok(cli("consume", "t", "-n", "1", env=env))
    assert BODY in text
    assert "😄" not in text


def test_a_table_on_a_terminal_shows_the_body_as_it_is(tmp_path: Path) -> None:
    env = _store(tmp_path)
    text = _on_a_terminal(env, "consume", "t", "-n", "1")
    assert "\x1b[1m" in text  # rich's table, bold header and all
    assert BODY in text
    assert "😄" not in text


def test_a_line_shows_the_key_as_it_is(tmp_path: Path) -> None:
    env = _store(tmp_path)
    text = ok(cli("query", "t", KEY, env=env))
    assert f"with key {KEY!r}" in text
    terminal = _on_a_terminal(env, "query", "t", KEY)
    assert f"with key {KEY!r}" in terminal


def _rich(title: str | None, columns: list[str], rows: list[list[str]]) -> str:
    """What :func:`tierd.cli.app.emit_table` printed through rich to a pipe."""
    out = io.StringIO()
    console = Console(file=out, highlight=False, width=PIPE_WIDTH)
    console.print(rich_table(title, columns, rows))
    return out.getvalue()


def _random_text(rng: random.Random, longest: int, alphabet: str = "ab xyz0129-:[]/.") -> str:
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, longest)))


@pytest.mark.parametrize("seed", range(40))
def test_the_plain_layout_is_richs(seed: int) -> None:
    """Random ASCII tables — titles or none, empty cells, cells with spaces at either end,
    no rows, some too wide — print as rich prints them, or are left to rich (too wide, or a
    title rich would wrap or trim)."""
    rng = random.Random(seed)
    # Column names are the CLI's own words (no brackets); cells and titles are anybody's.
    columns = [_random_text(rng, 12, "ab xyz0129-()") or "c" for _ in range(rng.randint(1, 7))]
    longest = rng.choice([5, 20, 60])
    rows = [[_random_text(rng, longest) for _ in columns] for _ in range(rng.randint(0, 6))]
    title = rng.choice([None, "orders", _random_text(rng, 30) or None])
    plain = plain_table(title, columns, rows, PIPE_WIDTH)
    if plain is None:  # left to rich: only when it is too wide, or its title wider than it
        width = sum(max([len(c), *(len(r[i]) for r in rows)]) + 3 for i, c in enumerate(columns)) - 1
        assert width > PIPE_WIDTH or len(title or "") > width or title != (title or "").strip()
        return
    assert plain == _rich(title, columns, rows)


def test_the_plain_layout_leaves_what_rich_measures_to_rich() -> None:
    assert plain_table(None, ["body"], [["naïve"]], PIPE_WIDTH) is None  # not ASCII: rich measures it
    assert plain_table(None, ["body"], [["a\tb"]], PIPE_WIDTH) is None  # a tab: rich expands it
    assert plain_table(None, ["body"], [["x" * PIPE_WIDTH]], PIPE_WIDTH) is None  # rich folds it
    assert plain_table("t" * 20, ["q"], [["0"]], PIPE_WIDTH) is None  # a title wider than the table
    assert plain_table("t ", ["queue"], [["0"]], PIPE_WIDTH) is None  # rich trims the title
