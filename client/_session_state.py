"""The face-independent half of a session: identity, lost events, deadlines, keepalive
bookkeeping, and the frames of its calls.

Why: the sync and the async session (``_sync_session`` / ``_async_session``) must agree on
what a reply guarantees, what a lost event means and what a batch of calls looks like on the
wire; they add only their blocking or awaitable calls and their keepalive thread or task.

Theory of operation:
- :class:`SessionState` holds the :class:`~protocol.SessionSpec`, the lost-event listeners,
  the namespace of its last call (the keepalive pings there) and the session's local
  deadline: the latest ``valid_until`` a reply carried, turned into the face's clock as
  PROTOCOL.md §8 says (``sent_at + (valid_until - uptime)``, early by construction).
- It registers with the client's :class:`~client._core.ClientCore`, which hands it the
  LockLost events of its id (and the ones a reconnect makes up: ``ClientCore.reconnected``).
- Cleanups whose outcome is unknown (a recipe's failed cancel or release) are kept and sent
  again before the session's next call or keepalive ping (``defer_cleanup``).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from protocol import (
    EndSession,
    Execute,
    LockLost,
    LostReason,
    SessionSpec,
    Statement,
    Transaction,
    encode_execute,
)

from ._core import FailureLog, encode_request
from ._errors import ClientClosed, LockClientError
from ._result import Result

if TYPE_CHECKING:
    from ._core import ClientCore
    from ._placement import ServerGroup

__all__ = [
    "CANCELLED_TABLE",
    "MAX_DEFERRED",
    "BatchCall",
    "LostListener",
    "SessionState",
    "ShardedParts",
]

#: The table of the recipes' cancel tombstones (``client.recipes``, docs/recipes.md, "Unknown
#: outcomes"). Their TTL running out is bookkeeping, not a loss: the session drops it.
CANCELLED_TABLE = "recipes.cancelled"

log = logging.getLogger("client")

#: A face's one-server session: the parts of a ShardedParts.
PartT = TypeVar("PartT", bound="SessionState")

#: Most cleanups a session keeps to send again (``SessionState.defer_cleanup``).
MAX_DEFERRED = 64

LostListener = Callable[[LockLost], object]

BatchCall = tuple[str, Iterable[Statement]] | tuple[str, Iterable[Statement], str | None]
"""One call of ``execute_many``: ``(namespace, statements)`` or ``(namespace, statements,
transaction_id)``."""


class SessionState:
    """The face-independent half of a session: identity, lost-event listeners, keepalive
    bookkeeping. The faces add execute/end and the context manager."""

    #: The face's session port (its client), set by the face.
    _client: Any

    def __init__(
        self,
        core: ClientCore,
        session_id: str | None,
        max_age: float,
        description: str,
        keepalive: bool,
    ) -> None:
        if session_id is None:
            session_id = uuid.uuid4().hex
        self._spec = SessionSpec(session_id, max_age, description)  # validates
        if type(keepalive) is not bool:
            raise TypeError(f"keepalive must be a bool, got {type(keepalive).__name__}")
        self._core = core
        self._keepalive = keepalive
        self._listeners: list[LostListener] = []
        self._lost: deque[LockLost] = deque(maxlen=256)
        self._lost_count = 0
        self._namespace: str | None = None  # namespace of the last call (keepalive pings there)
        # Local time (the face's clock) until which the last reply guarantees the session;
        # None before any such reply, and once the session is known to be gone.
        self._valid_deadline: float | None = None
        self._ended = False
        # Keepalive bookkeeping, on the face's clock (the face sets ``_last_activity`` to its
        # ``now`` when it creates the session and whenever it sends).
        self._last_activity = 0.0
        self._failures = FailureLog(f"keepalive of session {session_id}")
        self.keepalive_error: LockClientError | None = None  # the last keepalive failure
        # Cleanups (namespace, statements) whose outcome is unknown (a recipe's cleanup or
        # release that failed twice): sent again before this session's next call.
        self._deferred: list[tuple[str, list[Statement]]] = []
        core.register_session(self)

    def server_for(self, namespace: str) -> str:
        """The server (``host:port``, a group: its id) this session's calls in ``namespace``
        go to."""
        return self._client.place(namespace).id  # type: ignore[no-any-return]

    def defer_cleanup(self, namespace: str, statements: list[Statement]) -> None:
        """Send ``statements`` (idempotent ones: a recipe's cancel or release) again before
        this session's next call or keepalive ping: their outcome is unknown, and a session
        that lives on (a replicated group) would otherwise keep what they remove. Kept at most
        ``MAX_DEFERRED``; the oldest go first."""
        self._deferred.append((namespace, statements))
        del self._deferred[:-MAX_DEFERRED]

    def _guaranteed_until(self, namespace: str) -> float | None:
        """The latest local time until which a reply has guaranteed this session (on
        ``namespace``'s server) stays alive; None when nothing guarantees it."""
        return self._valid_deadline

    def _take_deferred(self) -> list[tuple[str, list[Statement]]]:
        taken, self._deferred = self._deferred, []
        return taken

    @property
    def id(self) -> str:
        """The session id (a uuid4 hex unless one was given)."""
        return self._spec.session_id

    @property
    def max_age(self) -> float:
        """Seconds the server keeps the session when idle."""
        return self._spec.max_age

    @property
    def description(self) -> str:
        """The description sent with the session's calls."""
        return self._spec.description

    @property
    def spec(self) -> SessionSpec:
        """The protocol's SessionSpec sent with every Execute."""
        return self._spec

    @property
    def ended(self) -> bool:
        """True after ``end()`` (or leaving the ``with`` block)."""
        return self._ended

    @property
    def keepalive_interval(self) -> float | None:
        """Seconds between keepalive pings when idle (max_age / 3), None when disabled."""
        return self._spec.max_age / 3 if self._keepalive else None

    # --- lost events ----------------------------------------------------------------------------

    @property
    def lost(self) -> bool:
        """True once a LockLost event arrived for this session."""
        return self._lost_count > 0

    @property
    def lost_events(self) -> tuple[LockLost, ...]:
        """The LockLost events received for this session (the latest 256), oldest first."""
        return tuple(self._lost)

    def add_lost_listener(self, callback: LostListener) -> None:
        """Call ``callback(event)`` for every LockLost event of this session.

        Sync face: called from whichever thread is reading the connection when the event
        arrives (a caller waiting for its reply, or the keepalive thread). Async face: called
        from the client's reader task. Either way it must return quickly and must not call the
        client (it would deadlock the sync face's reader, and stall the async one); hand the
        event to your own thread/task instead. Exceptions are logged and swallowed.
        """
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {type(callback).__name__}")
        self._listeners.append(callback)

    def remove_lost_listener(self, callback: LostListener) -> None:
        """Remove a listener added with ``add_lost_listener`` (ValueError if absent)."""
        self._listeners.remove(callback)

    def _note_reply(self, sent_at: float, result: Result) -> None:
        """Move the session's local deadline to what ``result`` (of a request sent at
        ``sent_at``, the face's clock) guarantees; a reply without ``valid_until`` (refused)
        leaves it. The faces' ``execute`` inline this (the hot path)."""
        raw = result.raw
        until = raw.valid_until
        if until is not None:
            deadline = sent_at + (until - raw.uptime)
            # A guarantee once given holds (a late reply to an earlier request must not
            # shorten it); a whole-session loss clears it.
            if self._valid_deadline is None or deadline > self._valid_deadline:
                self._valid_deadline = deadline

    def _batch_done(self, sent_at: float, outcomes: list[Any]) -> bool:
        """Digest the outcomes of a batch sent at ``sent_at``: the last call answered carries
        the latest ``valid_until``. True when the batch used the session (some call got a
        Result) and its keepalive should run."""
        for outcome in reversed(outcomes):
            if type(outcome) is Result and outcome.valid_until is not None:
                self._note_reply(sent_at, outcome)
                break
        return self._keepalive and not self._ended and any(type(o) is Result for o in outcomes)

    def _keepalive_done(self, sent_at: float, result: Result) -> None:
        """A keepalive sent at ``sent_at`` was answered."""
        self._note_reply(sent_at, result)
        self._failures.succeeded()

    def _keepalive_failed(self, error: LockClientError, now: float, interval: float) -> None:
        """A keepalive failed at ``now``: remember and log it (rate-limited), and make the
        next one due in a second rather than after a whole ``interval``."""
        self.keepalive_error = error
        self._failures.failed(error, now)
        self._last_activity = now - interval + min(interval, 1.0)

    def _start_end(self) -> tuple[int, bytes] | None:
        """The EndSession request of ``end()``, after stopping the keepalive; None when the
        session has ended already (``end()`` then answers False without a call). The face
        sends it and calls ``_mark_ended`` whatever happens."""
        if self._ended:
            return None
        self._stop_keepalive()
        return self._build_end()

    def _stop_keepalive(self) -> None:
        """Stop the face's keepalive (the faces override this)."""

    def __repr__(self) -> str:
        state = "ended" if self._ended else "open"
        return f"<{type(self).__name__} {self.id} max_age={self.max_age} {state}>"

    def _deliver(self, event: LockLost) -> None:
        if event.reason is LostReason.TTL and any(e[1] == CANCELLED_TABLE for e in event.entries):
            # A recipe's cancel tombstone ran out its TTL: nothing the application held.
            kept = tuple(e for e in event.entries if e[1] != CANCELLED_TABLE)
            if not kept:
                return
            event = LockLost(event.session_id, event.reason, kept)
        if event.reason is not LostReason.TTL:
            # The whole session is gone (expired, ended, or the server restarted): nothing is
            # guaranteed until a later reply re-creates it, and no EXPIRED is made up for it
            # at the next reconnect.
            self._valid_deadline = None
        self._lost.append(event)
        self._lost_count += 1
        for callback in list(self._listeners):
            try:
                callback(event)
            except Exception:
                log.exception("lost-listener %r of session %s raised", callback, self.id)

    # --- request building -----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._ended:
            raise _ended_error(self.id)

    def _build_execute(
        self,
        namespace: str,
        statements: Iterable[Statement],
        min_uptime: float,
        min_trust: float,
        description: str,
        transaction_id: str | None,
        wait: float | None,
    ) -> tuple[int, bytes]:
        self._check_open()
        rid = self._core.next_id()
        data = encode_execute(
            rid,
            self._spec,
            namespace,
            statements,
            transaction_id="" if transaction_id is None else transaction_id,
            description=description,
            min_uptime=min_uptime,
            min_trust=min_trust,
            wait=wait,
        )
        self._namespace = namespace
        return rid, data

    def _build_batch(
        self, calls: Iterable[BatchCall], min_uptime: float, min_trust: float
    ) -> tuple[list[int], bytes]:
        """The request ids (call order) and the frames of every call, concatenated for one
        write. Every call is validated before anything is sent (errors name the call)."""
        rids, frames = self._build_batch_frames(calls, min_uptime, min_trust)
        return rids, b"".join(frames)

    def _build_batch_frames(
        self, calls: Iterable[BatchCall], min_uptime: float, min_trust: float
    ) -> tuple[list[int], list[bytes]]:
        """The request ids (call order) and each call's frame. Every call is validated before
        anything is sent (errors name the call)."""
        self._check_open()
        spec = self._spec
        next_id = self._core.next_id
        rids: list[int] = []
        frames: list[bytes] = []
        namespace = None
        for i, call in enumerate(calls):
            try:
                if type(call) is not tuple or not 2 <= len(call) <= 3:
                    raise TypeError(
                        "a call must be a tuple (namespace, statements) or "
                        f"(namespace, statements, transaction_id), got {call!r:.80}"
                    )
                tx_id = call[2] if len(call) == 3 else None
                rid = next_id()
                frames.append(
                    encode_execute(
                        rid,
                        spec,
                        call[0],
                        call[1],
                        transaction_id="" if tx_id is None else tx_id,
                        min_uptime=min_uptime,
                        min_trust=min_trust,
                    )
                )
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"calls[{i}]: {exc}") from exc
            rids.append(rid)
            namespace = call[0]
        if namespace is not None:
            self._namespace = namespace
        return rids, frames

    def _build_keepalive(self) -> tuple[int, bytes] | None:
        """A no-statement Execute in the last namespace used, or None before any call."""
        if self._namespace is None or self._ended:
            return None
        rid = self._core.next_id()
        return rid, encode_request(Execute(rid, self._spec, Transaction(self._namespace, ())))

    def _build_end(self) -> tuple[int, bytes]:
        rid = self._core.next_id()
        return rid, encode_request(EndSession(rid, self._spec.session_id))

    def _mark_ended(self) -> None:
        self._ended = True
        self._core.unregister_session(self)


class ShardedParts(Generic[PartT]):
    """What a session of several servers (either face's) adds to its face's session: one
    ordinary session per server it touches (its *parts*, made by the face), and what reads
    them. Listed first among the bases, so these override the one-server versions."""

    #: The face's one-server session class: a part is ``_part_class(shard, id, max_age,
    #: description, keepalive)``.
    _part_class: type[Any]
    _deliver: Callable[[LockLost], None]
    _check_open: Callable[[], None]
    id: str
    max_age: float
    description: str
    _keepalive: bool

    def __init__(
        self,
        client: Any,
        session_id: str | None,
        max_age: float,
        description: str,
        keepalive: bool,
    ) -> None:
        super().__init__(client, session_id, max_age, description, keepalive)  # type: ignore[call-arg]
        self._router = client  # the client of several servers: its (Async)RouterPort
        self._parts: dict[ServerGroup, PartT] = {}
        # The sync face makes a part under it (threads may race to make one); the async
        # face's tasks never take it (a part is made without an await between look and add).
        self._parts_lock = threading.Lock()

    def _adopt(self, server: ServerGroup, shard: Any) -> PartT:
        """The part on ``server``: the one made meanwhile, or a new one over ``shard`` (that
        server's client, opened by the face), whose lost events reach this session."""
        part = self._parts.get(server)
        if part is None:
            part = self._part_class(shard, self.id, self.max_age, self.description, self._keepalive)
            part.add_lost_listener(self._deliver)
            self._parts[server] = part
        return part

    @property
    def servers(self) -> tuple[str, ...]:
        """The servers (or groups) this session has been used on so far, by id."""
        return tuple(server.id for server in self._parts)

    def _guaranteed_until(self, namespace: str) -> float | None:
        part = self._parts.get(self._router.place(namespace))
        return None if part is None else part._guaranteed_until(namespace)

    def _stop_keepalive(self) -> None:
        for part in list(self._parts.values()):
            part._stop_keepalive()


def _ended_error(session_id: str) -> LockClientError:
    return ClientClosed(f"session {session_id} has ended; open a new one")
