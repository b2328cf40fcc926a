"""Sans-I/O protocol state for one side of a connection (h11's shape).

Why: both the server shell and the client need "bytes in -> messages out, messages in ->
bytes out" with the same framing and limits. ``receive_data`` buffers, ``next_message`` pulls
one decoded message or None when more bytes are needed, ``send`` returns the framed bytes.
No sockets, no clock, no trio.

Error model: a framing or msgpack error (``ErrorCode`` 1xx) poisons the stream: every later
``receive_data`` / ``next_message`` raises it again. A well-framed but invalid request
(2xx/3xx) raises once with the offending ``request_id`` and the stream carries on with the
next frame.

Lifecycle: :attr:`Connection.state` follows the table ``LIFECYCLE`` (``_lifecycle.py``).

- It starts in AWAITING_HELLO with ``require_hello``, else in READY (protocol tools and the
  reference client's decoder work without a handshake).
- What the peer sends is checked against the table before it is decoded, in every state but
  READY. In READY every request is allowed, so the server's hot path pays one identity test;
  a client-role Connection also looks at every error there (a closing one moves the state).
  The one kind READY forbids, a server's ``welcome``, is not looked for: a client-role
  Connection built without ``require_hello`` receives its welcome in READY, moving nothing.
- What this side sends is never refused (the server shell encodes events and refusals for
  many connections through one Connection, and marks the handshake done before it encodes
  the welcome); a send moves the state when the table lists the move (a welcome, a closing
  error) and changes nothing otherwise. :meth:`Connection.handshake_done` is the welcome's
  move for a caller that marks it first.
- CLOSED, server role (a closing error sent, or a 1xx error received): reading ends, every
  later ``receive_data`` / ``next_message`` raises that error again. Client role (a closing
  error received): it goes on decoding what the server had already produced (answers of
  parked requests, events) and refuses a ``welcome``.
- Before the handshake (server role, AWAITING_HELLO) a frame may be at most
  ``MAX_HELLO_FRAME`` bytes, and only a ``hello`` is decoded past its ``type``: any other
  request is HANDSHAKE_REQUIRED without its tree or fields being looked at, so a peer that has
  not authenticated can make the server do almost nothing. On the server side a frame also may
  hold at most ``max_frame // 16`` arrays and maps (``unpack``).
"""

from __future__ import annotations

from typing import Any, Final

from ._codec import (
    pack,
    request_from_wire,
    request_to_wire,
    result_to_wire,
    server_message_from_wire,
    server_message_to_wire,
    unpack,
)
from ._errors import ErrorCode, ProtocolError
from ._framing import DEFAULT_MAX_FRAME, MAX_HELLO_FRAME, FrameBuffer, frame
from ._lifecycle import LIFECYCLE, LifecycleError, Role, State, message_kind
from ._messages import ErrorReply, Request, ServerMessage, TransactionResult
from ._trees import DEFAULT_TREE_LIMITS, TreeLimits

__all__ = ["Connection"]

_READY: Final = State.READY
_CLIENT_MOVES: Final = LIFECYCLE.moves[Role.CLIENT]
_SERVER_MOVES: Final = LIFECYCLE.moves[Role.SERVER]


class Connection:
    """One side of the protocol. ``next_message`` returns requests on the server side and
    server messages (Reply / ErrorReply / LockLost) on the client side."""

    __slots__ = (
        "_broken",
        "_buffer",
        "_max_containers",
        "_max_frame",
        "_state",
        "limits",
        "role",
    )

    def __init__(
        self,
        role: Role,
        *,
        max_frame: int = DEFAULT_MAX_FRAME,
        limits: TreeLimits = DEFAULT_TREE_LIMITS,
        require_hello: bool = False,
    ) -> None:
        self.role = role
        self.limits = limits
        self._max_frame = max_frame
        server = role is Role.SERVER
        self._state = State.AWAITING_HELLO if require_hello else _READY
        gated = server and require_hello
        self._buffer = FrameBuffer(min(max_frame, MAX_HELLO_FRAME) if gated else max_frame)
        self._max_containers = max(1024, max_frame // 16) if server else None
        # The error that broke the stream, kept as (code, message, request id): every later
        # call raises a fresh ProtocolError from it. Keeping the raised exception itself would
        # tie its traceback's frames (the caller's connection objects among them) into a
        # reference cycle through this attribute, freed only by a full collection (measured:
        # ~40 objects per connection closed after a framing error).
        self._broken: tuple[ErrorCode, str, int | None] | None = None

    @property
    def max_frame(self) -> int:
        """The largest accepted frame payload, in bytes (once the handshake is done)."""
        return self._max_frame

    @property
    def state(self) -> State:
        """Where the conversation is, per the lifecycle table ``LIFECYCLE``."""
        return self._state

    @property
    def greeted(self) -> bool:
        """Whether every kind of request is decoded: the state is READY."""
        return self._state is _READY

    def handshake_done(self) -> None:
        """The welcome's move, for a server that marks it before encoding the welcome (or a
        client that read the welcome elsewhere): AWAITING_HELLO -> READY, from when on frames
        up to ``max_frame`` are read and every request is decoded. Nothing in READY;
        LifecycleError in CLOSED (a closed conversation is not welcomed)."""
        if self._state is State.AWAITING_HELLO:
            self._move(_READY)
        elif self._state is not _READY:
            raise LifecycleError(Role.SERVER, self._state, "welcome")

    @property
    def buffered(self) -> int:
        """Bytes received but not yet decoded."""
        return len(self._buffer)

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Feed received bytes. Raises ProtocolError (FRAME_TOO_LARGE) as soon as a header
        announces an oversized frame."""
        if self._broken is not None:
            raise self._broken_error()
        try:
            self._buffer.feed(data)
        except ProtocolError as exc:
            self._break(exc)
            raise

    def next_frame(self) -> bytes | None:
        """The next whole frame payload (undecoded), or None. For callers that count or
        forward frames without decoding them."""
        if self._broken is not None:
            raise self._broken_error()
        try:
            return self._buffer.next_frame()
        except ProtocolError as exc:
            self._break(exc)
            raise

    def next_message(self) -> Request | ServerMessage | None:
        """Decode the next complete message, or return None when more bytes are needed."""
        payload = self.next_frame()
        if payload is None:
            return None
        try:
            wire = unpack(payload, self._max_containers)
        except ProtocolError as exc:
            if exc.code.closes_connection:
                self._break(exc)
            raise
        return self.decode(wire)

    def _break(self, exc: ProtocolError) -> None:
        self._broken = (exc.code, exc.message, exc.request_id)
        self._state = State.CLOSED

    def _move(self, state: State, error: ErrorReply | None = None) -> None:
        """Enter ``state`` (a move the table allows). READY lifts the pre-handshake frame
        limit; CLOSED by a closing error the server role sends ends its reading."""
        self._state = state
        if state is _READY:
            self._buffer.max_frame = self._max_frame
        elif error is not None and self.role is Role.SERVER and self._broken is None:
            self._broken = (error.code, error.message, error.request_id)

    def _broken_error(self) -> ProtocolError:
        assert self._broken is not None
        code, message, request_id = self._broken
        return ProtocolError(code, message, request_id=request_id)

    def decode(self, wire: Any) -> Request | ServerMessage:
        """Decode one already-unpacked wire structure for this role."""
        if self.role is Role.SERVER:
            if self._state is not _READY:
                self._admit_request(wire)
            return request_from_wire(wire, self.limits)
        message = server_message_from_wire(wire)
        if self._state is not _READY or type(message) is ErrorReply:
            self._receive(message)
        return message

    def _admit_request(self, wire: Any) -> None:
        """Outside READY, refuse a request the table does not allow, before decoding it:
        HANDSHAKE_REQUIRED (only its id and type read) before the handshake, the error that
        closed the connection after it."""
        if self._broken is not None:
            raise self._broken_error()
        # Here the state is AWAITING_HELLO: a server-role Connection is CLOSED only with the
        # error that closed it kept in _broken.
        kind = wire.get("type") if type(wire) is dict else None
        if type(kind) is not str or kind not in _CLIENT_MOVES[self._state]:
            raise _handshake_required(wire)

    def _receive(self, message: ServerMessage) -> None:
        """Client role: move on a server message, or refuse (INVALID_MESSAGE, nothing
        changed) one the table does not allow in this state."""
        kind = message_kind(message)
        state = _SERVER_MOVES[self._state].get(kind)
        if state is None:
            raise ProtocolError(
                ErrorCode.INVALID_MESSAGE,
                f"the server sent {kind!r} in state {self._state.name}, which the protocol's "
                f"lifecycle does not allow",
            )
        if state is not self._state:
            self._move(state)

    def send(self, message: Request | ServerMessage) -> bytes:
        """Return the framed bytes for ``message``. Server role: a welcome or a closing error
        moves the state as the table says; nothing sent is refused (see the module header)."""
        if self.role is Role.SERVER:
            data = frame(pack(server_message_to_wire(message)))  # type: ignore[arg-type]
            if self._state is not _READY or type(message) is ErrorReply:
                state = _SERVER_MOVES[self._state].get(message_kind(message))
                if state is not None and state is not self._state:
                    self._move(state, message if isinstance(message, ErrorReply) else None)
            return data
        return frame(pack(request_to_wire(message)))  # type: ignore[arg-type]

    def send_result(self, request_id: int, body: TransactionResult) -> bytes:
        """The framed bytes of ``Reply(request_id, body)`` (server role), without building the
        Reply: the server's per-transaction path. It does not consult the lifecycle (a result
        answers an execute, which is read only in READY, and moves no state)."""
        return frame(pack(result_to_wire(request_id, body)))


def _handshake_required(wire: Any) -> ProtocolError:
    """The refusal of a request before the handshake: its id when it has a valid one, its
    type when it has a known one; nothing else of it is looked at."""
    rid = wire.get("id") if type(wire) is dict else None
    if type(rid) is not int or not 0 <= rid <= 2**64 - 1:
        rid = None
    kind = wire.get("type") if type(wire) is dict else None
    what = kind if type(kind) is str and len(kind) <= 16 else "a request"
    return ProtocolError(
        ErrorCode.HANDSHAKE_REQUIRED,
        f"{what}: the first request on a connection must be hello",
        request_id=rid,
    )
