"""The network face of tierd: the HTTP API (:func:`create_app`), its metrics and the daemon
(:func:`serve`) that runs the API and the store in one asyncio process. See docs/http.md and
docs/metrics.md."""

from tierd.service.app import create_app
from tierd.service.daemon import Daemon, serve

__all__ = ["Daemon", "create_app", "serve"]
