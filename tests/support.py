"""Real test servers for the whole suite: the one way a test starts ``serve``.

- :func:`start_server` runs the real ``serve`` in the test's trio run (``nursery.start``, the
  house way), on 127.0.0.1, port 0, from a base config plus keyword overrides.
- :class:`ThreadedServer` runs a server (the real one, or any ``start`` function, e.g. a fake)
  in a thread with its own ``trio.run`` — the sync face's tests block, so the server cannot
  share their thread — optionally under a MockClock that the test jumps from outside.
- :func:`fail_after_real` is a hang guard in wall-clock time, for a block whose virtual clock
  stands still (``MockClock.rate = 0``), where ``trio.fail_after`` would never fire.

Areas whose servers differ only in defaults pass their base config as an argument
(``config=``); nothing here is copied per area. The base configs differ in ``log_level`` only,
which ``serve`` does not read (the ``lockserver`` command sets up logging from it): the client
and recipe tests have always passed WARNING, the server and security tests the default.

Importable as ``support`` from every test folder: tests/conftest.py sits in tests/ (no
``__init__.py``), so pytest puts tests/ on ``sys.path`` before any test module is imported.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Generic, TypeVar, cast

import attrs
import trio
import trio.testing

from lockserver import RunningServer, ServerConfig, serve
from protocol import SetVar

T = TypeVar("T")

#: What a test server gets unless the caller passes another base or overrides: loopback, an
#: ephemeral port, WARNING (the client and recipe tests' setting).
TEST_CONFIG = ServerConfig(host="127.0.0.1", port=0, log_level="WARNING")

#: Bound (wall-clock seconds) on a threaded server's start and stop: a hang guard.
THREAD_BOUND = 10.0


async def start_server(
    nursery: trio.Nursery, *, config: ServerConfig = TEST_CONFIG, **overrides: Any
) -> RunningServer:
    """Start the real ``serve`` in ``nursery`` with ``config`` plus ``overrides`` (any
    ServerConfig field, e.g. ``port=`` of a stopped server: a restart) and return it once it
    listens."""
    running: RunningServer = await nursery.start(serve, attrs.evolve(config, **overrides))
    return running


class ThreadedServer(Generic[T]):
    """A server in a thread with its own ``trio.run``, for the sync face's tests.

    ``ThreadedServer(start)`` runs ``await start(nursery)`` in that run (a fake server, a
    restart on a given port...); ``ThreadedServer(config=..., **overrides)`` without ``start``
    runs the real server, as :func:`start_server` would. ``clock``: the run's clock; with a
    MockClock the test moves the server's time with :meth:`jump`.

    :meth:`start` returns once the server listens (``.server``, ``.port``); :meth:`call` and
    :meth:`acall` run a function inside the server's run; :meth:`stop` closes the server
    gracefully when it has ``aclose``, ends the run and joins the thread, and re-raises what
    the run raised.
    """

    def __init__(
        self,
        start: Callable[[trio.Nursery], Awaitable[T]] | None = None,
        *,
        clock: trio.testing.MockClock | None = None,
        config: ServerConfig | None = None,
        **overrides: Any,
    ) -> None:
        if start is None:
            base = TEST_CONFIG if config is None else config

            async def start_real(nursery: trio.Nursery) -> T:
                return cast(T, await start_server(nursery, config=base, **overrides))

            start = start_real
        elif config is not None or overrides:
            raise TypeError("pass either a start function or a config and overrides, not both")
        self._start = start
        self.clock = clock
        self._ready = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._scope: trio.CancelScope | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="test-server", daemon=True)
        self.server: T

    def _run(self) -> None:
        async def main() -> None:
            async with trio.open_nursery() as nursery:
                self._scope = nursery.cancel_scope
                self._token = trio.lowlevel.current_trio_token()
                self.server = await self._start(nursery)
                self._ready.set()

        try:
            trio.run(main, clock=self.clock)
        except BaseException as exc:  # reported by start()/stop()
            self._error = exc
        finally:
            self._ready.set()

    def start(self) -> ThreadedServer[T]:
        """Start the thread; return once the server listens (raise what its start raised)."""
        self._thread.start()
        assert self._ready.wait(THREAD_BOUND), "the test server did not start"
        if self._error is not None:
            raise self._error
        return self

    @property
    def port(self) -> int:
        return self.server.port  # type: ignore[attr-defined, no-any-return]

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` inside the server's trio run and return its result."""
        return trio.from_thread.run_sync(fn, *args, trio_token=self._token)

    def acall(self, afn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        """Run ``await afn(*args)`` inside the server's trio run and return its result."""
        return trio.from_thread.run(afn, *args, trio_token=self._token)

    def jump(self, seconds: float) -> None:
        """Move the server's (mock) clock forward and let its timers run."""
        assert self.clock is not None, "start the server with a MockClock to jump"
        self.call(self.clock.jump, seconds)

    def stop(self) -> None:
        """Shut the server down gracefully when it can (``aclose``, bounded by the server's
        own shutdown grace), then end its run and join the thread."""
        if self._thread.is_alive():
            assert self._scope is not None
            aclose = getattr(self.server, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(trio.RunFinishedError):
                    self.acall(aclose)
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(self._scope.cancel, trio_token=self._token)
            self._thread.join(THREAD_BOUND)
            assert not self._thread.is_alive(), "the test server did not stop"
        if self._error is not None:
            raise self._error


@contextlib.contextmanager
def fail_after_real(seconds: float) -> Iterator[None]:
    """Like ``trio.fail_after``, but ``seconds`` of wall-clock time: a hang guard for a block
    that runs with the virtual clock stopped. Raises ``trio.TooSlowError`` when it fires."""
    token = trio.lowlevel.current_trio_token()
    done = threading.Event()
    with trio.CancelScope() as scope:

        def watchdog() -> None:
            if not done.wait(seconds):
                with contextlib.suppress(trio.RunFinishedError):
                    trio.from_thread.run_sync(scope.cancel, trio_token=token)

        guard = threading.Thread(target=watchdog, name="hang-guard", daemon=True)
        guard.start()
        try:
            yield
        finally:
            done.set()  # the watchdog ends by itself (joining it could wait on this thread)
    if scope.cancelled_caught:
        raise trio.TooSlowError(f"not done within {seconds} s of wall-clock time")


# --- a real bug inside the engine ------------------------------------------------------------


def poisoned_setvar() -> SetVar:
    """A SetVar the validators would refuse (period=5e-324): built around them, as a bug that
    lets a bad value in would. Evaluating it raises (floor of an infinite window index)."""
    node = object.__new__(SetVar)
    for name, value in {
        "table": "locks",
        "var": "other",
        "value": None,
        "description": None,
        "ttl": None,
        "allow_duplicates": False,
        "period": 5e-324,
    }.items():
        object.__setattr__(node, name, value)
    return node


class PoisoningDoor:
    """The server's door (``server.requests.core``) with the transactions of one session
    given ``statements`` (e.g. holding a :func:`poisoned_setvar`) on their way in: the engine
    then hits a real bug while evaluating them, in the pure and the compiled build alike (a
    compiled engine's methods cannot be patched to raise). Everything else passes through."""

    def __init__(self, core: Any, session_id: str, statements: list[Any]) -> None:
        self.core = core
        self.session_id = session_id
        self.statements = statements

    def execute(self, owner: Any, rid: int, session: Any, tx: Any, *args: Any) -> Any:
        if session.session_id == self.session_id:
            tx = attrs.evolve(tx, statements=self.statements)
        return self.core.execute(owner, rid, session, tx, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.core, name)
