"""A TCP proxy in front of a real server (moto) that can make it refuse or hang, on demand.

Tests use it to put an S3 outage *between* tierd and a real S3 server: ``refuse()`` closes the
listening socket and resets every connection (what a stopped endpoint looks like), ``hang()``
keeps connections open but stops forwarding (a stuck server, or a network that drops packets),
``resume()`` forwards again on the same port. Threads, not asyncio: it must keep running while
the test blocks on the store.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Literal

Mode = Literal["pass", "refuse", "hang"]


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.mode: Mode = "pass"
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._listener = self._listen(0)
        self.port: int = self._listener.getsockname()[1]
        self._start_accepting()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _listen(self, port: int) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(64)
        return sock

    def _start_accepting(self) -> None:
        threading.Thread(target=self._accept, args=(self._listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # listener closed (refuse or close)
            with self._lock:
                self._conns.append(client)
            if self.mode == "hang":
                continue  # accepted, never answered
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._conns.append(upstream)
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                if self.mode == "hang":
                    continue  # swallowed: the peer waits for an answer that never comes
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def _drop_connections(self) -> None:
        with self._lock:
            conns, self._conns = self._conns, []
        for s in conns:
            with contextlib.suppress(OSError):
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            with contextlib.suppress(OSError):
                s.close()

    def refuse(self) -> None:
        """New connections are refused, open ones reset."""
        self.mode = "refuse"
        self._listener.close()
        self._drop_connections()

    def hang(self) -> None:
        """Connections stay open (new ones are accepted) but nothing comes back."""
        self.mode = "hang"

    def resume(self) -> None:
        """Forward again (on the same port after ``refuse``)."""
        if self.mode == "refuse":
            self._listener = self._listen(self.port)
            self._start_accepting()
        elif self.mode == "hang":
            self._drop_connections()  # their requests were swallowed: clients reconnect
        self.mode = "pass"

    def close(self) -> None:
        self.mode = "refuse"
        self._listener.close()
        self._drop_connections()
