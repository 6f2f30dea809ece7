"""The ``tierd`` command line (Typer + rich).

``app`` holds the global options and shared helpers; each module adds one family of commands:
:mod:`~tierd.cli.data` (produce, consume, query), :mod:`~tierd.cli.inspect` (topics, queues,
segments), :mod:`~tierd.cli.admin` (serve, tier, verify, gc, restore),
:mod:`~tierd.cli.consumers` (seek, earliest-time, groups), :mod:`~tierd.cli.topics` (topic
admin: create, describe, update, delete), :mod:`~tierd.cli.transactions` (pending
transactions: list, commit, rollback).
"""

from __future__ import annotations

from tierd.cli import admin, consumers, data, inspect, scheduled, table, topics, transactions
from tierd.cli.app import app, handle_errors

__all__ = [
    "admin",
    "app",
    "consumers",
    "data",
    "handle_errors",
    "inspect",
    "main",
    "scheduled",
    "table",
    "topics",
    "transactions",
]


def main() -> None:
    """Console-script entry point."""
    app()
