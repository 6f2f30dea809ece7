"""The ``tierd`` command line.

Commands are thin: they parse options, call the library and render. One handler turns a
:class:`~tierd.errors.TierdError` into a single line on stderr and exit code 1; usage errors
exit 2 (click's convention).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, ParamSpec, TypeVar

import typer

from tierd import MessageStore, TierdConfig
from tierd.errors import TierdError

log = logging.getLogger("tierd")
P = ParamSpec("P")
R = TypeVar("R")

app = typer.Typer(
    name="tierd",
    help="tierd: a RocketMQ-style message store with tiered storage.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@dataclass
class Context:
    config_path: Path | None
    log_level: str | None

    def config(self) -> TierdConfig:
        return TierdConfig.load(self.config_path)


@app.callback()
def root(
    ctx: typer.Context,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config", "-c", help="TOML config file (conf/local.toml).", exists=False, dir_okay=False
        ),
    ] = None,
    log_level: Annotated[
        str | None, typer.Option("--log-level", help="DEBUG, INFO, WARNING or ERROR (default: [log] level).")
    ] = None,
) -> None:
    ctx.obj = Context(config, log_level)


def _setup_logging(cfg: TierdConfig, override: str | None) -> None:
    level = (override or cfg.log.level).upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise typer.BadParameter(f"--log-level must be DEBUG, INFO, WARNING or ERROR, got {override!r}")
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )


def handle_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn a tierd error into one clean line on stderr and exit code 1 (no stack trace)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except TierdError as e:
            typer.echo(f"tierd: error: {e}", err=True)
            raise typer.Exit(1) from None

    return wrapper


@app.command()
@handle_errors
def serve(ctx: typer.Context) -> None:
    """Run the store daemon until SIGTERM/SIGINT: recovery, flushing, dispatch and retention.

    On a signal it stops, flushes the hot store and exits 0. (The HTTP API and the tiering
    dispatcher join this process in later releases.)
    """
    c: Context = ctx.obj
    cfg = c.config()
    _setup_logging(cfg, c.log_level)
    asyncio.run(_serve(cfg))


async def _serve(cfg: TierdConfig) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info("opening hot store at %s (recovering if needed)", cfg.store.dir)
    async with MessageStore.open(cfg) as store:
        topics = store.topics()
        log.info("ready: %d topic(s), flush=%s; stop with Ctrl-C or SIGTERM", len(topics), cfg.store.flush)
        await stop.wait()
        log.info("signal received: flushing and closing the store")
    log.info("stopped cleanly")


def main() -> None:
    """Console-script entry point."""
    app()
