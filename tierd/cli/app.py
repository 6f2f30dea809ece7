"""The Typer application, its global options and what every command shares: opening the store,
rendering text or JSON, progress bars, and the one error handler.

Commands are thin: they parse options, call the facade and render. A
:class:`~tierd.errors.TierdError` becomes one line on stderr and exit code 1; usage errors exit 2
(click's convention); a command that finds problems (``verify``) exits 1 after listing them.
"""

from __future__ import annotations

import enum
import functools
import importlib.metadata
import json
import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from tierd import BlockingMessageStore, TierdConfig
from tierd.errors import StoreLockedError, TierdError

log = logging.getLogger("tierd")
P = ParamSpec("P")
R = TypeVar("R")

app = typer.Typer(
    name="tierd",
    help=(
        "tierd: a RocketMQ-style message store with tiered storage.\n\n"
        "Start the service with `tierd --config conf/local.toml serve`; inspect and operate a store "
        "with the other commands (they open the store directory, so run them while the daemon is "
        "stopped — or read a bucket directly with `segments ls --backend-url`)."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


class Output(enum.StrEnum):
    text = "text"
    json = "json"


@dataclass
class Context:
    config_path: Path | None
    output: Output
    log_level: str | None
    #: Short-lived commands log warnings and errors only unless --log-level says otherwise;
    #: ``serve`` logs at the configured level.
    quiet_logs: bool = True
    _cfg: TierdConfig | None = None

    def config(self) -> TierdConfig:
        if self._cfg is None:
            self._cfg = TierdConfig.load(self.config_path)
            setup_logging(self._cfg, self.log_level, self.quiet_logs)
        return self._cfg

    @property
    def json(self) -> bool:
        return self.output is Output.json

    @contextmanager
    def store(self, *, finish_tiering: bool = False) -> Iterator[BlockingMessageStore]:
        """Open the configured store. Read-only commands close without waiting to commit pending
        messages to the cold tier (``finish_tiering=False``); the daemon does that on its own."""
        with store_lock_hint():
            store = BlockingMessageStore.open(self.config())
        try:
            store.wait_ready()  # commands show both tiers, so the cold one must have loaded
            yield store
        finally:
            store.close(grace=None if finish_tiering else 0.0)


@contextmanager
def store_lock_hint() -> Iterator[None]:
    """A store held by a running daemon: say what to do instead of only that it is locked."""
    try:
        yield
    except StoreLockedError as e:
        raise StoreLockedError(
            f"{e}. Is `tierd serve` running on it? Use its HTTP API (docs/http.md), or read the "
            "bucket directly with `tierd segments ls --backend-url URL`",
            **e.detail,
        ) from e


def obj(ctx: typer.Context) -> Context:
    c: Context = ctx.obj
    return c


def _version(value: bool) -> None:
    if value:
        typer.echo(f"tierd {importlib.metadata.version('tierd')}")
        raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            help="TOML config file, e.g. conf/local.toml (default: built-in defaults + TIERD_* env).",
            dir_okay=False,
        ),
    ] = None,
    output: Annotated[
        Output, typer.Option("--output", "-o", help="text for people, json for scripts.")
    ] = Output.text,
    log_level: Annotated[
        str | None, typer.Option("--log-level", help="DEBUG, INFO, WARNING or ERROR (default: [log] level).")
    ] = None,
    version: Annotated[
        bool,
        typer.Option("--version", help="Print the tierd version and exit.", is_eager=True, callback=_version),
    ] = False,
) -> None:
    if log_level is not None and log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise typer.BadParameter(
            f"must be DEBUG, INFO, WARNING or ERROR, got {log_level!r}", param_hint="--log-level"
        )
    ctx.obj = Context(config, output, log_level)


def setup_logging(cfg: TierdConfig, override: str | None, quiet: bool = False) -> None:
    level = (override or ("WARNING" if quiet else cfg.log.level)).upper()
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    if quiet:  # a short-lived command: its own error line says what an ERROR record would
        _held_errors.active = True
        for handler in logging.getLogger().handlers:
            if _held_errors not in handler.filters:
                handler.addFilter(_held_errors)


class _HeldErrors(logging.Filter):
    """ERROR records of a short-lived command, held until it ends: one that only restates the
    error the command then fails with (the cold tier's start-up failure, logged by the store
    and raised by the command) is dropped — the command's ``tierd: error:`` line says it once;
    the others are written out then, before that line."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list[tuple[logging.Handler, logging.LogRecord]] = []
        #: Holding (from the command's logging set-up until it ends); then records pass.
        self.active = False

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.active or record.levelno < logging.ERROR:
            return True
        handler = next(h for h in logging.getLogger().handlers if self in h.filters)
        self.held.append((handler, record))
        return False

    def release(self, error: BaseException | None) -> None:
        said = [str(x) for x in (error, error.__cause__ if error is not None else None) if x is not None]
        held, self.held = self.held, []
        self.active = False
        for handler, record in held:
            text = record.getMessage()
            if not any(len(s) >= 20 and s in text for s in said):
                handler.handle(record)


_held_errors = _HeldErrors()


def handle_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn a tierd error into one clean line on stderr and exit code 1 (no stack trace)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            out = fn(*args, **kwargs)
        except TierdError as e:
            _held_errors.release(e)
            typer.echo(f"tierd: error: {e}", err=True)
            raise typer.Exit(1) from None
        except BaseException:
            _held_errors.release(None)
            raise
        _held_errors.release(None)
        return out

    return wrapper


# ---------------------------------------------------------------------------------- rendering
# Wide enough for tables when stdout is a pipe (rich would assume 80 columns).
_console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
_err_console = Console(stderr=True, highlight=False)


def emit_json(value: Any) -> None:
    """One JSON document on stdout (sorted keys, stable for scripts)."""
    typer.echo(json.dumps(value, indent=2, sort_keys=True, default=str))


def emit_table(title: str | None, columns: list[str], rows: list[list[Any]]) -> None:
    table = Table(title=title, show_edge=False, header_style="bold")
    for col in columns:
        table.add_column(col, overflow="fold")
    for row in rows:
        table.add_row(*("" if v is None else str(v) for v in row))
    _console.print(table)


def echo(text: str) -> None:
    _console.print(text, markup=False)


@contextmanager
def progress_bar(description: str, *, bytes_: bool = False, quiet: bool = False) -> Iterator[Progress]:
    """A rich progress bar on stderr — only on a terminal, and not with ``--output json``
    (scripts and log collectors want lines, not cursor movements)."""
    columns: list[Any] = [TextColumn("{task.description}"), BarColumn()]
    columns.append(DownloadColumn() if bytes_ else MofNCompleteColumn())
    columns.append(TimeRemainingColumn())
    with Progress(
        *columns, console=_err_console, transient=True, disable=quiet or not _err_console.is_terminal
    ) as bar:
        bar.add_task(description, total=None)
        yield bar
