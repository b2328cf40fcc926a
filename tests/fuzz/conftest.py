"""A real server in a background thread (its own trio run), for Hypothesis-driven fuzzing with
blocking sockets: Hypothesis runs each example synchronously, the server keeps running across
examples, so its counters and memory can be checked at the end."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import trio

from lockserver import RunningServer, ServerConfig, serve


class ThreadServer:
    """A server running in a thread: ``port``, ``statistics()``, ``stop()``."""

    def __init__(self, **config: Any) -> None:
        ready: queue.Queue[tuple[RunningServer, trio.lowlevel.TrioToken] | BaseException] = (
            queue.Queue()
        )

        async def main() -> None:
            try:
                async with trio.open_nursery() as nursery:
                    cfg = ServerConfig(host="127.0.0.1", port=0, **config)
                    running = await nursery.start(serve, cfg)
                    ready.put((running, trio.lowlevel.current_trio_token()))
            except BaseException as exc:
                ready.put(exc)
                raise

        self.thread = threading.Thread(target=trio.run, args=(main,), daemon=True)
        self.thread.start()
        got = ready.get(timeout=10)
        if isinstance(got, BaseException):
            raise got
        self.running, self.token = got
        self.port = self.running.port

    def statistics(self) -> dict[str, Any]:
        stats: dict[str, Any] = trio.from_thread.run_sync(
            self.running.statistics, trio_token=self.token
        )
        return stats

    def stop(self) -> None:
        trio.from_thread.run_sync(self.running.shutdown, trio_token=self.token)
        self.thread.join(timeout=5)


@pytest.fixture(scope="module")
def thread_server() -> Iterator[ThreadServer]:
    server = ThreadServer()
    yield server
    server.stop()
