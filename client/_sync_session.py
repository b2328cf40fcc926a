"""The sync face's sessions: :class:`Session`, the blocking half of a
:class:`~client._session_state.SessionState` (execute, execute_many, end, the context
manager) and its keepalive thread.

A session talks to its client only through the :class:`~client._port.SessionPort` (the
client's ``request`` / ``request_batch`` / ``send_unanswered``, the same calls and no more
layers on the execute path); it never imports the client module, which creates sessions.
The bookkeeping both faces share (reply deadlines, what a batch's outcomes mean, keepalive
failures, ending) is ``SessionState``'s; this module adds the blocking calls and the thread.

Rules kept:
- Session keepalive: one daemon thread per open, used session, pinging every max_age/3 of
  idleness. The thread holds its session only through a weak reference (and strongly only
  during a ping), so it never keeps a dropped session, or its client, alive: when the session
  is collected a finalizer sets the thread's stop event and the thread ends. Failures are
  logged through a :class:`~client._core.FailureLog` (the first, then at most one line a
  minute), not once per retry.
- Every reply that carries ``valid_until`` (execute, execute_many, keepalive) moves the
  session's local deadline (``SessionState``), on the ``time.monotonic`` clock the client's
  ``reconnected`` check uses.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Generator, Iterable
from time import monotonic
from types import TracebackType
from typing import Any, TypeVar

from protocol import Statement, Welcome

from ._calls import Call, OnPart, Op, Step, run_sync
from ._errors import (
    ClientClosed,
    ClientTimeout,
    ConnectionLost,
    LockClientError,
)
from ._methods import blocking
from ._placement import ServerGroup
from ._port import SessionPort
from ._result import Result
from ._session_calls import (
    keepalive_frame,
    resend_deferred,
    session_end,
    sharded_end,
    sharded_execute,
    sharded_execute_many,
)
from ._session_state import BatchCall, SessionState, ShardedParts
from ._wire import EXECUTE, KEEPALIVE, batch_results

__all__ = ["BATCH_CHUNK", "Session", "ShardedSession"]

#: Calls per write of a sync ``execute_many``: a bigger batch goes out in chunks, each chunk's
#: replies read before the next is sent. The sync face reads only once its write is done, so
#: one write of a huge batch lets the replies outgrow the kernel's buffers plus the server's
#: ``max_send_buffer``, and the server drops the client as a slow consumer (measured: 100,000
#: calls in one write). 512 small replies are ~80 KB; a round trip per 512 calls costs little.
BATCH_CHUNK = 512

log = logging.getLogger("client")

T = TypeVar("T")


class Session(SessionState):
    """A session of a :class:`LockClient` (see :meth:`LockClient.session`)."""

    def __init__(
        self,
        client: SessionPort,
        session_id: str | None,
        max_age: float,
        description: str,
        keepalive: bool,
    ) -> None:
        super().__init__(client.core, session_id, max_age, description, keepalive)
        self._client: SessionPort = client
        self._last_activity = monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def client(self) -> SessionPort:
        """The :class:`~client.LockClient` this session runs on (its ``welcome`` limits, its
        events), typed as the session's port."""
        return self._client

    def welcome_for(self, namespace: str) -> Welcome:
        """The Welcome (limits included) of the server ``namespace`` lives on."""
        return self._client.welcome

    def execute(
        self,
        namespace: str,
        statements: Iterable[Statement],
        *,
        min_uptime: float = 0.0,
        min_trust: float = 0.0,
        description: str = "",
        transaction_id: str | None = None,
        wait: float | None = None,
    ) -> Result:
        """Run a transaction in this session: all statements or none.

        A refused or aborted transaction is a Result with ``ok == False``; ServerError,
        ConnectionLost (outcome unknown), ClientTimeout and ClientClosed are raised.
        ``wait``: let the server park the transaction until it can succeed, at most that many
        seconds (the call's timeout is extended by it). ``min_uptime`` / ``min_trust``: the
        reliability contract (refused with cause MINIMUM_REQUIREMENTS when not met).
        """
        if self._deferred:
            self._send_deferred()
        rid, data = self._build_execute(
            namespace, statements, min_uptime, min_trust, description, transaction_id, wait
        )
        if wait and self._thread is None and self._keepalive and not self._ended:
            # A parked transaction does not keep its session alive, pings do: a first call
            # that waits longer than the max age must not find its session expired.
            self._start_keepalive()
        client = self._client
        timeout = client.timeout if wait is None else client.timeout + wait
        sent_at = self._last_activity = monotonic()
        try:
            result: Result = client.request(EXECUTE, rid, data, timeout)
        except ClientTimeout:
            if wait:
                client.send_unanswered(client.core.cancel(rid)[1])  # the server stops waiting
            raise
        raw = result.raw  # SessionState._note_reply, inlined (the hot path)
        if raw.valid_until is not None:
            deadline = sent_at + (raw.valid_until - raw.uptime)
            if self._valid_deadline is None or deadline > self._valid_deadline:
                self._valid_deadline = deadline
        if self._thread is None and self._keepalive and not self._ended:
            self._start_keepalive()
        return result

    def _send_deferred(self) -> None:
        run_sync(resend_deferred(self), lambda call: self.execute(*call))

    def execute_many(
        self, calls: Iterable[BatchCall], *, min_uptime: float = 0.0, min_trust: float = 0.0
    ) -> list[Result]:
        """Run several transactions pipelined: one write for all, one wait for all replies.

        ``calls``: ``(namespace, statements)`` or ``(namespace, statements, transaction_id)``
        tuples. Returns their Results in call order (``[]`` for no calls). **Each call is its
        own transaction**: the batch is not atomic (put the statements in one transaction for
        all or nothing); the server runs them in order. ``min_uptime`` / ``min_trust`` apply to
        every call. No ``wait``: a batch is answered at once. The client's ``timeout`` bounds
        the whole batch. More than BATCH_CHUNK (512) calls go out in chunks, each chunk's
        replies read before the next is sent (so any size works); after a connection drop the
        later chunks are not sent (their calls: ConnectionLost "not sent").

        When some calls fail, :class:`BatchError` is raised once all are settled, with every
        call's Result or exception in ``results`` (a ServerError: that call was refused; a
        ConnectionLost: its outcome is unknown; repeat with the same transaction ids in the
        same session to learn it). ClientTimeout (outcome of the unanswered calls unknown),
        ClientClosed and ServerUnavailable are raised as such.
        """
        rids, frames = self._build_batch_frames(calls, min_uptime, min_trust)
        client = self._client
        if not rids:
            client.check_open()
            return []
        sent_at = self._last_activity = monotonic()
        if len(rids) <= BATCH_CHUNK:
            outcomes = client.request_batch(rids, b"".join(frames), client.timeout)
        else:
            outcomes = self._request_chunks(rids, frames)
        if self._batch_done(sent_at, outcomes) and self._thread is None:
            self._start_keepalive()
        return batch_results(outcomes)

    def _request_chunks(self, rids: list[int], frames: list[bytes]) -> list[Any]:
        """A big batch, BATCH_CHUNK calls at a time, each chunk's replies read before the next
        is sent; after a chunk that lost its connection the rest is not sent. The client's
        timeout bounds the whole batch."""
        client = self._client
        deadline = monotonic() + client.timeout
        outcomes: list[Any] = []
        for start in range(0, len(rids), BATCH_CHUNK):
            end = min(start + BATCH_CHUNK, len(rids))
            try:
                left = deadline - monotonic()
                if left <= 0:
                    raise ClientTimeout(f"the client's timeout ({client.timeout:g} s) ran out")
                part = client.request_batch(rids[start:end], b"".join(frames[start:end]), left)
            except ClientTimeout as exc:
                raise ClientTimeout(
                    f"batch of {len(rids)} calls (sent {BATCH_CHUNK} at a time): calls "
                    f"{start}..{end - 1} timed out (calls before were answered, calls after "
                    f"were not sent): {exc}"
                ) from exc
            outcomes += part
            if any(type(o) is ConnectionLost for o in part):
                outcomes += [
                    ConnectionLost(
                        "not sent: the connection was lost earlier in this batch (a batch over "
                        f"{BATCH_CHUNK} calls goes out in chunks); this call did not run"
                    )
                    for _ in rids[end:]
                ]
                break
        return outcomes

    end = blocking(session_end)

    def _drive(self, op: Generator[Call, Any, T]) -> T:
        """Run a session step of ``_calls`` (its requests) with blocking calls."""
        client = self._client
        return run_sync(op, lambda c: client.request(c.kind, c.rid, c.data, client.timeout))

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.end()
            return
        try:
            self.end()
        except LockClientError:
            # Do not mask the body's exception; the session expires after max_age anyway.
            log.warning("ending session %s failed", self.id, exc_info=True)

    # --- keepalive --------------------------------------------------------------------------------

    def _start_keepalive(self) -> None:
        stop = self._stop
        thread = threading.Thread(
            target=_keepalive_loop,
            args=(weakref.ref(self), stop, self.max_age / 3),
            name=f"lockclient-keepalive-{self.id}",
            daemon=True,
        )
        self._thread = thread
        # A session nobody references any more (its client dropped without close()) is
        # collected: wake its thread so that it ends now, not after a whole interval.
        weakref.finalize(self, stop.set)
        thread.start()

    def _stop_keepalive(self) -> None:
        self._stop.set()

    def _keepalive_once(self, interval: float) -> bool:
        """Ping the session now (a no-statement Execute); False when the thread should end
        (the session ended, the client closed)."""
        built = run_sync(keepalive_frame(self), lambda call: self.execute(*call))
        if built is None:
            return False
        client = self._client
        sent_at = self._last_activity = monotonic()
        try:
            result = client.request(KEEPALIVE, built[0], built[1], min(client.timeout, interval))
        except ClientClosed:
            return False
        except LockClientError as exc:
            self._keepalive_failed(exc, monotonic(), interval)
            return True
        self._keepalive_done(sent_at, result)
        return True


def _keepalive_loop(ref: weakref.ref[Session], stop: threading.Event, interval: float) -> None:
    """The body of a session's keepalive thread: ping whenever the session has been idle for
    ``interval``, until ``stop`` is set, the session ends, or the session is collected. Holds
    the session (and so its client) only while it looks at it or pings it."""
    while not stop.is_set():
        session = ref()
        if session is None:
            return
        try:
            delay = session._last_activity + interval - monotonic()
            if delay <= 0 and not session._keepalive_once(interval):
                return
        except Exception:  # pragma: no cover - a bug; never kill the thread silently
            log.exception("keepalive of session %s crashed", session.id)
            return
        finally:
            del session  # nothing of the session is held while waiting
        if delay > 0:
            stop.wait(delay)


class ShardedSession(ShardedParts[Session], Session):
    """A session of a :class:`LockClient` of several servers: one id, and on each server it
    touches an ordinary :class:`Session` with that id (its *part*), made by its first call
    there, with its own keepalive and ``valid_until``. Lost events of every part reach this
    session's listeners (and ``lost_events``). ``execute`` runs on the part of the
    namespace's server; ``execute_many`` splits the batch by server and answers in the
    caller's order; ``end`` ends every part (docs/client.md#several-servers)."""

    _part_class = Session

    def welcome_for(self, namespace: str) -> Welcome:
        return self._part(self._router.place(namespace))._client.welcome

    def _part(self, server: ServerGroup) -> Session:
        """The part on ``server``, made (and that server's client opened) on first use."""
        part = self._parts.get(server)
        if part is not None:
            return part
        self._check_open()
        shard = self._router.shard_client(server)  # outside the lock: it may connect
        with self._parts_lock:
            return self._adopt(server, shard)

    execute = blocking(sharded_execute)
    execute_many = blocking(sharded_execute_many)
    end = blocking(sharded_end)

    def defer_cleanup(self, namespace: str, statements: list[Statement]) -> None:
        """As :meth:`Session.defer_cleanup`, on the part of ``namespace``'s server."""
        self._part(self._router.place(namespace)).defer_cleanup(namespace, statements)

    def _drive(self, op: Op[T]) -> T:
        return run_sync(op, self._on_part)

    def _on_part(self, step: Step) -> Any:
        """The driver of ``_calls``' session steps (``OnPart``)."""
        assert type(step) is OnPart
        return step.call(self._part(step.server))
