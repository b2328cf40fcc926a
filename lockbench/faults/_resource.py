"""The fenced resource: a tiny TCP store inside the lab that the lock workloads' critical
sections write to, as a database guarded by a lock would be.

It keeps, per lock, the highest fence it has accepted, and accepts a write only with a fence
at least that high (Kleppmann's fencing token; etcd's and our locks hand one out with every
grant). Every write offered is recorded as a :class:`ResourceWrite` with the time it arrived
on the lab clock, accepted or not, so the checkers see mutual exclusion *as the protected
resource sees it*: a refused write is a stale holder the fences stopped.

Wire: one JSON object per line each way. A write ``{"lock": str, "holder": str, "fence":
int}`` is answered ``{"accepted": bool, "highest": int|null}`` (``highest``: the highest
fence accepted before this write). A malformed line is answered ``{"error": "..."}`` and the
connection closed; nothing is recorded for it.

Rules kept: bounded (a line over :data:`MAX_LINE` bytes, more than :data:`MAX_CONNECTIONS`
connections, or a connection idle for :data:`IDLE_TIMEOUT` seconds is refused or closed);
decisions and records under one lock, so the order of records is the order of decisions.
"""

from __future__ import annotations

import contextlib
import json
import socket
import socketserver
import threading
from collections.abc import Callable
from typing import Any, Final

from ._history import ResourceWrite

__all__ = ["FencedResource", "ResourceClient"]

MAX_LINE: Final = 4096
MAX_CONNECTIONS: Final = 256
IDLE_TIMEOUT: Final = 60.0


def _decode(line: bytes) -> tuple[str, str, int]:
    try:
        data = json.loads(line)
    except ValueError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError("a write must be a JSON object")
    lock, holder, fence = data.get("lock"), data.get("holder"), data.get("fence")
    if not isinstance(lock, str) or not lock:
        raise ValueError("lock must be a non-empty string")
    if not isinstance(holder, str):
        raise ValueError("holder must be a string")
    if isinstance(fence, bool) or not isinstance(fence, int) or fence < 0:
        raise ValueError(f"fence must be a non-negative integer, got {fence!r}")
    return lock, holder, fence


class FencedResource:
    """The store, serving on ``host`` (a kernel-chosen port: :attr:`address`); ``clock`` gives
    the lab time of each write, ``record`` receives every write offered (from the serving
    threads, under the store's lock). :meth:`start`, :meth:`close`."""

    def __init__(
        self,
        host: str,
        clock: Callable[[], float],
        record: Callable[[ResourceWrite], None],
    ) -> None:
        self._clock = clock
        self._record = record
        self._mu = threading.Lock()
        self.highest: dict[str, int] = {}
        self.accepted = 0
        self.refused = 0
        self.errors = 0
        self._connections = 0
        resource = self

        class Handler(socketserver.StreamRequestHandler):
            timeout = IDLE_TIMEOUT

            def handle(self) -> None:
                resource._serve(self.connection, self.rfile, self.wfile)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server((host, 0), Handler)
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` it listens on."""
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def start(self) -> FencedResource:
        """Serve in a daemon thread."""
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving (connections still open end with their threads); idempotent."""
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._server.server_close()

    def write(self, lock: str, holder: str, fence: int) -> tuple[bool, int | None]:
        """Decide one write and record it: ``(accepted, highest before it)``."""
        with self._mu:
            highest = self.highest.get(lock)
            accepted = highest is None or fence >= highest
            if accepted:
                self.highest[lock] = fence
                self.accepted += 1
            else:
                self.refused += 1
            self._record(ResourceWrite(lock, holder, fence, self._clock(), accepted, highest))
        return accepted, highest

    def _serve(self, conn: socket.socket, rfile: Any, wfile: Any) -> None:
        with self._mu:
            if self._connections >= MAX_CONNECTIONS:
                self.errors += 1
                wfile.write(b'{"error":"too many connections"}\n')
                return
            self._connections += 1
        try:
            while True:
                try:
                    line = rfile.readline(MAX_LINE + 1)
                except (OSError, TimeoutError):
                    return
                if not line:
                    return
                if len(line) > MAX_LINE or not line.endswith(b"\n"):
                    self._refuse(wfile, f"a line is at most {MAX_LINE} bytes")
                    return
                try:
                    lock, holder, fence = _decode(line)
                except ValueError as exc:
                    self._refuse(wfile, str(exc))
                    return
                accepted, highest = self.write(lock, holder, fence)
                answer = {"accepted": accepted, "highest": highest}
                wfile.write(json.dumps(answer).encode() + b"\n")
                wfile.flush()
        finally:
            with self._mu:
                self._connections -= 1

    def _refuse(self, wfile: Any, why: str) -> None:
        with self._mu:
            self.errors += 1
        with contextlib.suppress(OSError):
            wfile.write(json.dumps({"error": why}).encode() + b"\n")
            wfile.flush()


class ResourceClient:
    """A critical section's connection to the resource (made lazily, remade after an error).
    :meth:`write` returns ``(accepted, highest)``, or None when the resource could not be
    reached or answered (the write then may or may not have been recorded)."""

    def __init__(self, address: tuple[str, int], timeout: float = 2.0) -> None:
        self.address = address
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._file: Any = None

    def write(self, lock: str, holder: str, fence: int) -> tuple[bool, int | None] | None:
        line = json.dumps({"lock": lock, "holder": holder, "fence": fence}).encode() + b"\n"
        try:
            if self._sock is None:
                self._sock = socket.create_connection(self.address, timeout=self.timeout)
                self._file = self._sock.makefile("rb")
            self._sock.sendall(line)
            answer = json.loads(self._file.readline(MAX_LINE + 1))
            if not isinstance(answer, dict) or "accepted" not in answer:
                raise ValueError(f"unexpected answer {answer!r}")
            highest = answer.get("highest")
            return bool(answer["accepted"]), highest if isinstance(highest, int) else None
        except (OSError, ValueError):
            self.close()
            return None

    def close(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None
