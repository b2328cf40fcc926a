"""A session's calls written once, as steps of ``_calls`` both faces drive: ending a session,
sending its deferred cleanups again, and a session over several servers (execute, execute_many,
end on the part of each server).

Why: as for the client's calls (``_calls``), the sync and the async session decide the same
way and differ only in "send this and wait". A one-server session drives ``Call`` steps with
its client's ``request``; a session of several servers (``ShardedParts``) drives ``OnPart``
steps: apply the call to the ordinary session on that server (its part, made on first use).
The faces declare these as methods with ``client._methods`` (``end =
blocking(session_end)``); ``s`` is a session of either face.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable
from operator import methodcaller
from typing import TYPE_CHECKING, Any

from protocol import Statement

from ._calls import Call, OnPart, Op
from ._errors import BatchError, ClientTimeout, ConnectionLost, LockClientError, ServerUnavailable
from ._result import Result
from ._sharding import merge_outcomes, unavailable
from ._wire import END

if TYPE_CHECKING:
    from ._session_state import BatchCall

__all__ = [
    "keepalive_frame",
    "resend_deferred",
    "session_end",
    "sharded_end",
    "sharded_execute",
    "sharded_execute_many",
]


# --- a session ----------------------------------------------------------------------------------


def session_end(s: Any) -> Generator[Call, Any, bool]:
    """End the session now: the server removes all its entries at once. True when the
    server still had it. Ending twice returns False without a call. If the connection drops
    with the request in flight it is re-sent once, and may then answer False. The session is
    ended whatever the call does."""
    built = s._start_end()
    if built is None:
        return False
    try:
        existed: bool = yield Call(END, *built)
    finally:
        s._mark_ended()
    return existed


def resend_deferred(s: Any) -> Generator[tuple[str, list[Statement]], Any, None]:
    """Send a session's deferred cleanups again (``defer_cleanup``): yields each as
    ``(namespace, statements)`` for the face to ``execute``; those that fail once more (a
    LockClientError thrown in) are kept for the next call."""
    pending = s._take_deferred()
    for i, call in enumerate(pending):
        try:
            yield call
        except LockClientError:
            s._deferred[:0] = pending[i:]
            return


def keepalive_frame(
    s: Any,
) -> Generator[tuple[str, list[Statement]], Any, tuple[int, bytes] | None]:
    """Before a keepalive ping of a session (``s``: either face's): its deferred cleanups
    first, yielded as ``resend_deferred`` does (a recipe's cancel whose outcome was unknown:
    a session kept alive by pings alone would otherwise keep what it removes, a lock nobody
    knows it holds); then the ping's ``(request id, frame)``, None when it should not ping
    (the session ended, or never made a call)."""
    if s._deferred and not s._ended:
        yield from resend_deferred(s)
    built: tuple[int, bytes] | None = s._build_keepalive()
    return built


# --- a session over several servers ------------------------------------------------------------


def sharded_execute(
    s: Any,
    namespace: str,
    statements: Iterable[Statement],
    *,
    min_uptime: float = 0.0,
    min_trust: float = 0.0,
    description: str = "",
    transaction_id: str | None = None,
    wait: float | None = None,
) -> Op[Result]:
    """Run a transaction (as a one-server session's ``execute``) on the part of the
    server ``namespace`` lives on, made by this first call there. ServerUnavailable naming
    the server when it cannot be reached."""
    s._check_open()
    if s._deferred:
        yield from _resend_on_parts(s)
    server = s._router.place(namespace)
    execute = methodcaller(
        "execute", namespace, statements, min_uptime=min_uptime, min_trust=min_trust,
        description=description, transaction_id=transaction_id, wait=wait,
    )  # fmt: skip
    try:
        result: Result = yield OnPart(server, execute)
    except ServerUnavailable as exc:
        raise unavailable(server, exc) from exc
    return result


def sharded_execute_many(
    s: Any, calls: Iterable[BatchCall], *, min_uptime: float = 0.0, min_trust: float = 0.0
) -> Op[list[Result]]:
    """Run several transactions pipelined (as a one-server session's ``execute_many``);
    the calls of each server go to its part as one batch (servers one after another), and
    the results come back in the caller's order. A server that cannot be reached fails its
    calls only (ServerUnavailable in the BatchError's ``results``)."""
    calls = list(calls)
    s._check_open()
    router = s._router
    groups = router.split(calls)
    if not groups:
        router.check_open()
        return []
    if len(groups) > 1:
        # Every call is validated before anything is sent, as in a one-server batch (the
        # errors name the call's place in the whole batch).
        s._build_batch_frames(calls, min_uptime, min_trust)
    parts: list[tuple[list[int], list[Result] | BaseException]] = []
    for server, indexes, items in groups:
        many = methodcaller("execute_many", items, min_uptime=min_uptime, min_trust=min_trust)
        try:
            parts.append((indexes, (yield OnPart(server, many))))
        except ServerUnavailable as exc:
            if len(groups) == 1:
                raise unavailable(server, exc) from exc
            parts.append((indexes, unavailable(server, exc)))
        except (BatchError, ConnectionLost, ClientTimeout) as exc:
            if len(groups) == 1:
                raise
            parts.append((indexes, exc))
    return merge_outcomes(len(calls), parts)


def sharded_end(s: Any) -> Op[bool]:
    """End the session on every server it was used on; True when some server still had
    it. The first failure (a server that cannot be reached: ServerUnavailable) is raised
    once the others are ended (there the session expires after ``max_age``)."""
    if s._ended:
        return False
    s._mark_ended()
    existed = False
    failure: LockClientError | None = None
    for server in list(s._parts):
        try:
            existed = (yield OnPart(server, methodcaller("end"))) or existed
        except ServerUnavailable as exc:
            failure = failure or unavailable(server, exc)
        except LockClientError as exc:
            failure = failure or exc
    if failure is not None:
        raise failure
    return existed


def _resend_on_parts(s: Any) -> Op[None]:
    """A session of several servers' deferred cleanups (``defer_cleanup``, kept by the
    session itself where its face cannot reach a part without I/O), each sent again on its
    namespace's part; those that fail once more are kept for the next call."""
    pending = s._take_deferred()
    for i, (namespace, statements) in enumerate(pending):
        try:
            yield OnPart(s._router.place(namespace), methodcaller("execute", namespace, statements))
        except LockClientError:
            s._deferred[:0] = pending[i:]
            return
