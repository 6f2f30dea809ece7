"""The Typer application, its global options and what every command shares: opening the store,
rendering text or JSON, progress bars, and the one error handler.

Start-up cost is part of the interface: every ``tierd`` invocation imports this module and every
command module (to register the commands), so those import only typer and what a command that
asks the daemon needs. The facade (numpy, the hot store, the tiering engine, about a second) is
imported inside the commands that open the directory themselves, rich only for a table on a
terminal and for progress bars, and such a command validates only the config's client sections
(``tests/cli/test_startup.py`` checks what ``--help`` and remote commands import).

Commands are thin: they parse options, call the facade and render. A
:class:`~tierd.errors.TierdError` becomes one line on stderr and exit code 1; usage errors exit 2
(click's convention); a command that finds problems (``verify``) exits 1 after listing them.
"""

from __future__ import annotations

import enum
import functools
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ParamSpec, TypeVar

import typer
from typer.core import TyperGroup

from tierd.cli.remote import HttpApi, RemoteStore, loopback_url
from tierd.errors import NotFoundError, StoreLockedError, TierdError
from tierd.lockfile import lock_holder
from tierd.logs import setup_logging as setup_process_logging

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from tierd.config import ClientConfig, TierdConfig
    from tierd.store import BlockingMessageStore

log = logging.getLogger("tierd")
P = ParamSpec("P")
R = TypeVar("R")

#: Global options that take a value; :class:`_GlobalOptionsGroup` accepts them after the command.
GLOBAL_VALUE_OPTIONS = frozenset({"--config", "-c", "--output", "-o", "--log-level", "--server", "--bucket"})
#: Entries whose presence makes a directory a tierd store (what ``open`` creates or ``restore`` writes).
STORE_MARKERS = ("checkpoint", "commitlog", "consumequeue", "config")


def hoist_global_options(args: list[str]) -> list[str]:
    """Move global options found after the command in front of it, so that
    ``tierd topics ls -o json`` means ``tierd -o json topics ls`` (as people type them). Stops
    at ``--``; only the options of :data:`GLOBAL_VALUE_OPTIONS` move (no command uses their names)."""
    head: list[str] = []
    i = 0
    while i < len(args) and args[i].startswith("-") and args[i] != "--":  # options before the command
        takes_value = args[i] in GLOBAL_VALUE_OPTIONS
        head += args[i : i + 1 + takes_value]
        i += 1 + takes_value
    moved: list[str] = []
    rest: list[str] = []
    while i < len(args):
        arg = args[i]
        if arg == "--":
            rest += args[i:]
            break
        name = arg.split("=", 1)[0]
        if name in GLOBAL_VALUE_OPTIONS and name.startswith("--") and "=" in arg:
            moved.append(arg)
        elif arg in GLOBAL_VALUE_OPTIONS and i + 1 < len(args):
            moved += args[i : i + 2]
            i += 1
        else:
            rest.append(arg)
        i += 1
    return head + moved + rest


class _GlobalOptionsGroup(TyperGroup):
    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        return super().parse_args(ctx, hoist_global_options(args))


app = typer.Typer(
    name="tierd",
    cls=_GlobalOptionsGroup,
    help=(
        "tierd: a RocketMQ-style message store with tiered storage.\n\n"
        "Start the service with `tierd --config conf/local.toml serve`. The other commands work "
        "on the configured store: while a daemon runs they ask it over its HTTP API (the address "
        "comes from the config, or --server); otherwise they open the store directory themselves. "
        "`segments ls --backend-url` reads a bucket directly. Global options may also follow the "
        "command (`tierd topics ls -o json`)."
    ),
    no_args_is_help=True,
    add_completion=True,
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
    #: ``--server`` / ``TIERD_SERVER_URL``: always talk to this daemon.
    server_url: str | None = None
    #: ``--bucket``: read this bucket's cold tier read-only instead of the store (DR drills).
    bucket_url: str | None = None
    #: Short-lived commands log warnings and errors only unless --log-level says otherwise;
    #: ``serve`` logs at the configured level.
    quiet_logs: bool = True
    _cfg: TierdConfig | None = None
    _client: ClientConfig | None = None

    def config(self) -> TierdConfig:
        """The whole configuration, every section validated: for the commands that open the
        store directory (or the bucket) themselves."""
        if self._cfg is None:
            from tierd.config import TierdConfig

            self._cfg = TierdConfig.load(self.config_path)
            if self._client is None:
                setup_logging(self._cfg, self.log_level, self.quiet_logs)
        return self._cfg

    def client(self) -> TierdConfig | ClientConfig:
        """The sections that find and ask a running daemon (``[store]``, ``[server]``,
        ``[log]``): a command the daemon answers validates only those (``load_client``); the
        other sections' validators are never built (docs/performance.md, "CLI start-up")."""
        if self._cfg is not None:
            return self._cfg
        if self._client is None:
            from tierd.config import load_client

            self._client = load_client(self.config_path)
            setup_logging(self._client, self.log_level, self.quiet_logs)
        return self._client

    @property
    def json(self) -> bool:
        return self.output is Output.json

    @property
    def config_source(self) -> str:
        """Where the configuration came from, for messages that name it."""
        return (
            f"config {self.config_path}"
            if self.config_path
            else "built-in defaults (no --config/TIERD_CONFIG)"
        )

    def remote(self) -> RemoteStore | None:
        """The running daemon to ask instead of opening the directory: the ``--server`` one, or
        the one the config names when the store directory is locked (a daemon holds it)."""
        cfg = self.client()
        token = cfg.server.bearer_token()
        if self.server_url:
            return RemoteStore(HttpApi(self.server_url, token))
        holder = lock_holder(cfg)
        if holder is None:
            return None
        held = f"store directory {cfg.store.dir} is in use by another process" + (
            f" (pid {holder})" if holder else ""
        )
        if cfg.server.port == 0:
            raise StoreLockedError(
                f"{held}, and server.port = 0 in {self.config_source} gives no address to ask it: "
                "pass --server URL (or TIERD_SERVER_URL)",
                path=str(cfg.store.dir),
            )
        url = loopback_url(cfg.server.host, cfg.server.port)
        why = f"{held}; the address is server.host/server.port of {self.config_source}; --server overrides it"
        return RemoteStore(HttpApi(url, token, why=why))

    def require_store(self, cfg: TierdConfig) -> None:
        """A command that only reads must not create an empty store by accident (wrong working
        directory, wrong config): a missing store is an error naming the path and the config."""
        root = Path(cfg.store.dir)
        if not any((root / name).exists() for name in STORE_MARKERS):
            raise NotFoundError(
                f"no tierd store at {root.absolute()} (store.dir from {self.config_source}); pass the "
                "daemon's config with --config or TIERD_CONFIG, or --server URL to ask a running daemon",
                path=str(root),
            )

    @contextmanager
    def store(
        self, *, create: bool = False, finish_tiering: bool = False
    ) -> Iterator[BlockingMessageStore | RemoteStore]:
        """The configured store: the running daemon over HTTP when there is one (see
        :meth:`remote`), else the directory opened here. Only ``create`` commands (produce) may
        create a missing store. Read-only commands close without waiting to commit pending
        messages to the cold tier (``finish_tiering=False``); the daemon does that on its own."""
        if self.bucket_url is not None:
            with self.bucket() as bucket:
                yield bucket
            return
        remote = self.remote()
        if remote is not None:
            yield remote
            return
        from tierd.store import BlockingMessageStore

        cfg = self.config()
        if not create:
            self.require_store(cfg)
        with store_lock_hint():
            store = BlockingMessageStore.open(cfg)
        try:
            store.wait_ready()  # commands show both tiers, so the cold one must have loaded
            yield store
        finally:
            store.close(grace=None if finish_tiering else 0.0)

    @contextmanager
    def bucket(self) -> Iterator[BlockingMessageStore]:
        """``--bucket URL``: the bucket's cold tier opened read-only — never the daemon, never
        store.dir, nothing written or claimed (``BlockingMessageStore.open_bucket``)."""
        from tierd.store import BlockingMessageStore

        assert self.bucket_url is not None
        store = BlockingMessageStore.open_bucket(self.config(), self.bucket_url)
        try:
            yield store
        finally:
            store.close()

    def local_only(self, command: str) -> TierdConfig:
        """For commands that need the directory itself (``verify``, ``gc``): no HTTP route does
        their work, so with a daemon running they say so instead; a missing store is an error."""
        remote = self.remote()
        if remote is not None:
            raise StoreLockedError(
                f"`tierd {command}` works on the store directory itself, and a running daemon holds "
                f"it ({remote.api.url}); stop the daemon, run it, start the daemon again",
                command=command,
            )
        cfg = self.config()
        self.require_store(cfg)
        return cfg

    @contextmanager
    def local_store(self, command: str) -> Iterator[BlockingMessageStore]:
        """The store directory opened here (see :meth:`local_only`)."""
        self.local_only(command)
        with self.store() as store:
            if isinstance(store, RemoteStore):  # a daemon started in between
                raise StoreLockedError(f"a daemon started on the store during `tierd {command}`")
            yield store


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
        import importlib.metadata  # only here: with its email parsers it costs ~10 ms per start

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
            envvar="TIERD_CONFIG",
        ),
    ] = None,
    server: Annotated[
        str | None,
        typer.Option(
            "--server",
            help="Ask the daemon at this URL (e.g. http://127.0.0.1:8080) instead of opening the store "
            "directory. Default: the config's server address when a daemon holds the store. The "
            "token comes from the config (server.token, token_file) or TIERD_SERVER__TOKEN.",
            envvar="TIERD_SERVER_URL",
        ),
    ] = None,
    bucket: Annotated[
        str | None,
        typer.Option(
            "--bucket",
            help="Read this bucket (e.g. s3://bucket/prefix or /path/to/cold) READ-ONLY instead of "
            "the store: topics, queues, segments, consume, query, groups and verify answer from its "
            "cold tier; nothing is written or claimed, so the store that owns it keeps working "
            "(DR drills). Storage options come from [backend] when the scheme matches.",
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
    ctx.obj = Context(config, output, log_level, server, bucket_url=bucket)


def setup_logging(cfg: TierdConfig | ClientConfig, override: str | None, quiet: bool = False) -> None:
    level = (override or ("WARNING" if quiet else cfg.log.level)).upper()
    setup_process_logging(level, cfg.log.format)
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
        self.held: list[logging.LogRecord] = []
        #: Holding (from the command's logging set-up until it ends); then records pass.
        self.active = False

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.active or record.levelno < logging.ERROR:
            return True
        # Every handler carrying this filter asks about the same record: hold it once.
        if not self.held or self.held[-1] is not record:
            self.held.append(record)
        return False

    def release(self, error: BaseException | None) -> None:
        said = [str(x) for x in (error, error.__cause__ if error is not None else None) if x is not None]
        held, self.held = self.held, []
        self.active = False
        handlers = [h for h in logging.getLogger().handlers if self in h.filters]
        for record in held:
            text = record.getMessage()
            if not any(len(s) >= 20 and s in text for s in said):
                for handler in handlers:
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
#: Width of a table written to a pipe or file (rich would assume 80 columns); a wider one folds.
PIPE_WIDTH = 200


@functools.cache
def _console() -> Console:
    """stdout's rich console for tables on a terminal, made on first use: output to a pipe and
    ``-o json`` output never need rich (its console and table modules are ~25 ms of a start)."""
    from rich.console import Console

    return Console(highlight=False, width=None if sys.stdout.isatty() else PIPE_WIDTH)


@functools.cache
def _err_console() -> Console:
    """stderr's rich console (progress bars), made on first use like :func:`_console`."""
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def emit_json(value: Any) -> None:
    """One JSON document on stdout (sorted keys, stable for scripts)."""
    typer.echo(json.dumps(value, indent=2, sort_keys=True, default=str))


def emit_table(title: str | None, columns: list[str], rows: list[list[Any]]) -> None:
    """A table for people: rich's on a terminal; to a pipe, the same characters written by
    :func:`plain_table` without importing rich, unless the table needs rich's handling (wider
    than :data:`PIPE_WIDTH`, cells that are not plain ASCII, ``FORCE_COLOR``). Cells are shown
    as they are: never read as rich markup or emoji codes (a body ``[b]x :smile:`` is shown so,
    not as a bold ``x`` and a face)."""
    cells = [["" if v is None else str(v) for v in row] for row in rows]
    if not sys.stdout.isatty() and not os.environ.get("FORCE_COLOR"):
        text = plain_table(title, columns, cells, PIPE_WIDTH)
        if text is not None:
            typer.echo(text, nl=False)
            return
    _console().print(rich_table(title, columns, cells))


def rich_table(title: str | None, columns: list[str], cells: list[list[str]]) -> Table:
    """The table :func:`emit_table` prints through rich: cells as plain text, never markup."""
    from rich.table import Table
    from rich.text import Text

    heading = Text(title, style="table.title") if title else None
    table = Table(title=heading, show_edge=False, header_style="bold")
    for col in columns:
        table.add_column(col, overflow="fold")
    for row in cells:
        table.add_row(*(Text(v) for v in row))
    return table


def plain_table(title: str | None, columns: list[str], rows: list[list[str]], width: int) -> str | None:
    """The table exactly as rich prints it without styles (``show_edge=False``, heavy head,
    one space of padding, title centred above), or None when rich would do more than lay out
    characters: the table wider than ``width`` or the title wider than the table (rich folds
    them), a title with spaces at either end (rich trims it), or any text that is not printable
    ASCII (rich measures wide and combining characters, expands tabs, splits lines).
    ``tests/cli/test_text_output.py`` compares the two."""
    texts = [*columns, *(c for row in rows for c in row), *([title] if title else [])]
    if not all(t.isascii() and t.isprintable() for t in texts):
        return None
    widths = [max([len(col), *(len(row[i]) for row in rows)]) for i, col in enumerate(columns)]
    total = sum(widths) + 3 * len(widths) - 1
    if total > width or (title is not None and (len(title) > total or title != title.strip())):
        return None
    lines = []
    if title:
        left = (total - len(title)) // 2
        lines.append(" " * left + title + " " * (total - len(title) - left))
    lines.append("┃".join(f" {col.ljust(w)} " for col, w in zip(columns, widths, strict=True)))
    lines.append("╇".join("━" * (w + 2) for w in widths))
    lines += ["│".join(f" {c.ljust(w)} " for c, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines) + "\n"


def echo(text: str) -> None:
    """A line for people, written as it is (no markup, no emoji codes, no re-wrapping)."""
    typer.echo(text)


@contextmanager
def progress_bar(description: str, *, bytes_: bool = False, quiet: bool = False) -> Iterator[Progress]:
    """A rich progress bar on stderr — only on a terminal, and not with ``--output json``
    (scripts and log collectors want lines, not cursor movements)."""
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    columns: list[Any] = [TextColumn("{task.description}"), BarColumn()]
    columns.append(DownloadColumn() if bytes_ else MofNCompleteColumn())
    columns.append(TimeRemainingColumn())
    with Progress(
        *columns, console=_err_console(), transient=True, disable=quiet or not _err_console().is_terminal
    ) as bar:
        bar.add_task(description, total=None)
        yield bar
