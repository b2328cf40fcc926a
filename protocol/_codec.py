"""The codec: messages and transaction trees to wire structures and back, plus msgpack.

Why: this module and ``_trees.py`` (the tree half) are the only places that know the wire
layout (PROTOCOL.md). Decoding is defensive: every received structure is checked for shape and
types, and every problem becomes a :class:`ProtocolError` naming the field at fault. Values are
built through the classes' own validating constructors, never ``Cls(**payload)`` — except on
the fast paths (an execute request, a result reply), which check the common shape inline and
build through unchecked constructors; anything irregular takes the general path for its
precise error.

Wire layout in one breath: every message is a msgpack map with a ``"type"`` string; requests
and replies carry ``"id"``; a tree node is an array ``[op_name, arg, ...]`` whose trailing
optional arguments may be omitted.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Final

import msgpack

from ._errors import ErrorCode, ProtocolError
from ._inspect import FeedEvent
from ._inspect_codec import (
    REQUEST_FIELDS,
    SERVER_DECODERS,
    feed_to_wire,
    holder_to_wire,
    holders_from_wire,
    inspect_reply_to_wire,
    inspect_request_from_wire,
    inspect_request_to_wire,
)
from ._messages import (
    DEFAULT_SESSION_MAX_AGE,
    Cancel,
    Cancelled,
    Cause,
    EndSession,
    ErrorReply,
    Execute,
    GetStatistics,
    Hello,
    LockLost,
    LostReason,
    Ping,
    Pong,
    Reply,
    Request,
    ServerMessage,
    SessionEnded,
    SessionSpec,
    Statistics,
    Status,
    Transaction,
    TransactionResult,
    Welcome,
)
from ._ops import MIN_SECONDS
from ._trees import (
    DEFAULT_TREE_LIMITS,
    TreeLimits,
    _show,
    _unchecked_maker,
    _wire_type,
    node_to_wire,
    statements_from_wire,
)

__all__ = [
    "result_to_wire",
    "pack",
    "unpack",
    "request_to_wire",
    "request_from_wire",
    "server_message_to_wire",
    "server_message_from_wire",
]

_packer = msgpack.Packer(use_bin_type=True, datetime=False)


def pack(obj: Any) -> bytes:
    """Encode one wire structure as a msgpack document."""
    return _packer.pack(obj)  # type: ignore[no-any-return]


def unpack(payload: bytes, max_containers: int | None = None) -> Any:
    """Decode exactly one msgpack document; anything else is MALFORMED_FRAME.

    ``max_containers``: refuse (TOO_LARGE, request id unknown) a document holding more arrays
    and maps than this, *while* decoding it. Why: an empty map is one byte on the wire and a
    64-byte object in memory, so a 1 MiB frame of them costs ~64 MiB and ~60 ms to build
    before anything could look at it. Small payloads are decoded without counting (counting
    costs a call per container; a payload of ``_COUNT_FROM`` bytes builds at most ~1 MiB).
    """
    try:
        if max_containers is None or len(payload) <= _COUNT_FROM:
            return msgpack.unpackb(payload, raw=False, strict_map_key=True, timestamp=0)
        left = [max_containers]

        def hook(container: Any) -> Any:
            left[0] -= 1
            if left[0] < 0:
                raise _TooManyContainers
            return container

        return msgpack.unpackb(
            payload,
            raw=False,
            strict_map_key=True,
            timestamp=0,
            list_hook=hook,
            object_hook=hook,
        )
    except _TooManyContainers:
        raise ProtocolError(
            ErrorCode.TOO_LARGE,
            f"the frame holds more than {max_containers} arrays and maps, the limit for a "
            "frame of its size limit (max_frame / 16)",
        ) from None
    except msgpack.ExtraData:
        raise ProtocolError(
            ErrorCode.MALFORMED_FRAME, "frame holds trailing bytes after one msgpack document"
        ) from None
    except UnicodeDecodeError as exc:
        raise ProtocolError(
            ErrorCode.MALFORMED_FRAME, f"a string in the frame is not valid UTF-8 ({exc.reason})"
        ) from None
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        detail = str(exc) or type(exc).__name__  # msgpack's FormatError has no message
        raise ProtocolError(
            ErrorCode.MALFORMED_FRAME, f"frame is not a valid msgpack document ({detail})"
        ) from None


#: Payloads up to this many bytes are decoded without counting their containers.
_COUNT_FROM: Final = 16 * 1024


class _TooManyContainers(Exception):
    pass


# --- field readers ----------------------------------------------------------------------------


class _Fields:
    """Reads a received map field by field; every failure names the message and field."""

    __slots__ = ("kind", "m", "request_id", "seen")

    # ``m`` is dict[Any, Any]: a received map's keys may be bytes as well as str (and a
    # compiled build enforces the declared key type when they are iterated).
    def __init__(self, kind: str, m: dict[Any, Any], request_id: int | None) -> None:
        self.kind = kind
        self.m = m
        self.request_id = request_id
        self.seen = 2  # "type" and "id"

    def _fail(self, message: str, code: ErrorCode = ErrorCode.INVALID_MESSAGE) -> ProtocolError:
        return ProtocolError(code, f"{self.kind}: {message}", request_id=self.request_id)

    def get(self, key: str, types: tuple[type, ...], default: Any = ..., what: str = "") -> Any:
        m = self.m
        if key not in m:
            if default is ...:
                raise self._fail(f"missing field {key!r}")
            return default
        self.seen += 1
        value = m[key]
        if type(value) not in types:
            if value is None and default is not ...:
                return default
            raise self._fail(
                f"field {key!r} must be {what or _type_names(types)}, got {_wire_type(value)}"
            )
        return value

    def text(self, key: str, default: Any = ..., limit: int = 0, setting: str = "") -> Any:
        """A str field; with ``limit``, at most that many characters (else TOO_LARGE naming
        ``setting``)."""
        value = self.get(key, (str,), default, "a string")
        if limit and type(value) is str and len(value) > limit:
            raise self._fail(
                f"field {key!r} is {len(value)} characters long, the limit is {limit} ({setting})",
                ErrorCode.TOO_LARGE,
            )
        return value

    def session(self, max_name: int) -> Any:
        """The ``session`` field: a str of at most ``max_name`` characters, not blank. (The
        message names the wire field; SessionSpec's own check would say ``session_id``.)"""
        value = self.text("session", limit=max_name, setting="max_name")
        if type(value) is str and not value.strip():
            raise self._fail("session must not be blank")
        return value

    def number(self, key: str, default: Any = ...) -> Any:
        value = self.get(key, (int, float), default, "a number")
        if value is not None and type(value) is float and math.isnan(value):
            raise self._fail(f"field {key!r} must be a number, got NaN")
        return value

    def done(self) -> None:
        if self.seen != len(self.m):
            known = _KNOWN_FIELDS[self.kind]
            # Keys are str or bytes (msgpack's strict_map_key): sort their renderings.
            extra = sorted(_show(k) for k in self.m if k not in known)
            raise self._fail(f"unknown field(s) {', '.join(extra)}")


def _type_names(types: tuple[type, ...]) -> str:
    return " or ".join(_wire_type(t()) if t is not type(None) else "nil" for t in types)


_KNOWN_FIELDS: dict[str, frozenset[str]] = {
    "hello": frozenset({"type", "id", "version", "client", "token"}),
    "execute": frozenset(
        {
            "type",
            "id",
            "session",
            "max_age",
            "session_description",
            "namespace",
            "statements",
            "tx_id",
            "description",
            "min_uptime",
            "min_trust",
            "wait",
        }
    ),
    "end": frozenset({"type", "id", "session"}),
    "stats": frozenset({"type", "id"}),
    "ping": frozenset({"type", "id"}),
    "cancel": frozenset({"type", "id", "target"}),
    **REQUEST_FIELDS,
}


# --- requests ---------------------------------------------------------------------------------


def request_to_wire(req: Request) -> dict[str, Any]:
    """Encode a request as its wire map."""
    t = type(req)
    if t is Execute:
        e: Any = req
        tx = e.transaction
        return _execute_wire(
            e.request_id,
            e.session,
            tx.namespace,
            [node_to_wire(st) for st in tx.statements],
            tx.transaction_id,
            tx.description,
            tx.min_uptime,
            tx.min_trust,
            e.wait,
        )
    if t is Hello:
        h: Any = req
        out = {"type": "hello", "id": h.request_id, "version": h.version, "client": h.client_name}
        if h.token is not None:
            out["token"] = h.token
        return out
    if t is EndSession:
        return {"type": "end", "id": req.request_id, "session": req.session_id}  # type: ignore[union-attr]
    if t is GetStatistics:
        return {"type": "stats", "id": req.request_id}
    if t is Ping:
        return {"type": "ping", "id": req.request_id}
    if t is Cancel:
        return {"type": "cancel", "id": req.request_id, "target": req.target_id}  # type: ignore[union-attr]
    wire = inspect_request_to_wire(req)
    if wire is not None:
        return wire
    raise TypeError(f"not a request: {req!r}")


def _execute_wire(
    rid: int,
    s: SessionSpec,
    namespace: str,
    statements: list[Any],
    tx_id: str,
    description: str,
    # Any: numbers as the caller gave them (validated): an int stays an int on the wire (a
    # compiled build would convert what is declared float).
    min_uptime: Any,
    min_trust: Any,
    wait: Any,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "type": "execute",
        "id": rid,
        "session": s.session_id,
        "namespace": namespace,
        "statements": statements,
    }
    if s.max_age != DEFAULT_SESSION_MAX_AGE:
        out["max_age"] = s.max_age
    if s.description:
        out["session_description"] = s.description
    if tx_id:
        out["tx_id"] = tx_id
    if description:
        out["description"] = description
    if min_uptime:
        out["min_uptime"] = min_uptime
    if min_trust:
        out["min_trust"] = min_trust
    if wait is not None:
        out["wait"] = wait
    return out


_mk_transaction: Final = _unchecked_maker(Transaction)
_mk_execute: Final = _unchecked_maker(Execute)


# --- the execute fast path ----------------------------------------------------------------------
# Execute is the hot request. The fast path checks the common, well-formed shape inline and
# builds the (already validated) values without running the validators a second time; any
# irregularity returns None and the general path below produces the precise error. Session
# specs repeat across requests, so they are interned, bounded in count AND in size: a spec with
# a long id or description is not kept (measured: a fuzzer's 64 KiB descriptions filled the
# cache with ~40 MiB that no session used).

_EXECUTE_KEYS: Final = _KNOWN_FIELDS["execute"]
_SESSIONS: dict[tuple[Any, ...], SessionSpec] = {}
_MAX_INTERNED_SESSIONS: Final = 4096
_MAX_INTERNED_CHARS: Final = 256  # id + description, per interned spec


def _fast_number(value: Any, default: float) -> Any:
    """``value`` as a finite number >= 0, int or float as received (``default`` when absent),
    else None."""
    # Any, not float | None: an int stays an int (a compiled build would make it a float,
    # which the encoder writes back as one).
    if value is None:
        return default
    t = type(value)
    if (t is float or t is int) and 0 <= value < math.inf:
        return value
    return None


def _fast_execute(w: dict[str, Any], rid: int, limits: TreeLimits) -> Execute | None:
    if not w.keys() <= _EXECUTE_KEYS:
        return None
    get = w.get
    sid = get("session")
    namespace = get("namespace")
    raw = get("statements")
    max_name = limits.max_name
    if (
        type(sid) is not str
        or type(namespace) is not str
        or type(raw) is not list
        or not sid.strip()
        or not namespace.strip()
        or len(sid) > max_name
        or len(namespace) > max_name
    ):
        return None
    # Any: the received values, checked below but kept as they came (an int stays an int, a
    # compiled build would convert what is declared float, and refuse what is declared str
    # before the checks could).
    max_age: Any
    min_uptime: Any
    min_trust: Any
    sdesc: Any
    tx_id: Any
    description: Any
    wait: Any
    if len(w) == 5:  # type, id, session, namespace, statements: every other field defaulted
        max_age = DEFAULT_SESSION_MAX_AGE
        sdesc = tx_id = description = ""
        min_uptime = min_trust = 0.0
        wait = None
    else:
        sdesc = get("session_description", "")
        tx_id = get("tx_id", "")
        description = get("description", "")
        if (
            type(sdesc) is not str
            or type(tx_id) is not str
            or type(description) is not str
            or len(tx_id) > max_name
            or len(sdesc) > limits.max_text
            or len(description) > limits.max_text
        ):
            return None
        max_age = _fast_number(get("max_age"), DEFAULT_SESSION_MAX_AGE)
        # Absent (the common case) without a call.
        min_uptime = get("min_uptime")
        min_uptime = 0.0 if min_uptime is None else _fast_number(min_uptime, 0.0)
        min_trust = get("min_trust")
        min_trust = 0.0 if min_trust is None else _fast_number(min_trust, 0.0)
        wait = get("wait")
        if (
            max_age is None
            or max_age < MIN_SECONDS
            or min_uptime is None
            or min_trust is None
            or min_trust > 1
            or (wait is not None and _fast_number(wait, 0.0) is None)
        ):
            return None
    try:
        statements = statements_from_wire(raw, limits)
    except ProtocolError as exc:
        exc.request_id = rid
        raise
    skey = (sid, max_age, sdesc)
    session = _SESSIONS.get(skey)
    if session is None:
        session = SessionSpec(sid, max_age, sdesc)
        if len(sid) + len(sdesc) <= _MAX_INTERNED_CHARS:
            if len(_SESSIONS) >= _MAX_INTERNED_SESSIONS:
                _SESSIONS.clear()
            _SESSIONS[skey] = session
    tx = _mk_transaction(namespace, statements, tx_id, description, min_uptime, min_trust)
    return _mk_execute(rid, session, tx, wait)  # type: ignore[no-any-return]


def request_from_wire(wire: Any, limits: TreeLimits = DEFAULT_TREE_LIMITS) -> Request:
    """Decode a received request map. Raises ProtocolError (with ``request_id`` set whenever
    the id could be read) for anything invalid."""
    if type(wire) is not dict:
        raise ProtocolError(
            ErrorCode.INVALID_MESSAGE, f"a request must be a map, got {_wire_type(wire)}"
        )
    rid = wire.get("id")
    if type(rid) is not int or not 0 <= rid <= 2**64 - 1:
        raise ProtocolError(
            ErrorCode.INVALID_MESSAGE,
            "request field 'id' must be an integer in 0..2**64-1"
            + ("" if "id" in wire else " (missing)"),
        )
    kind = wire.get("type")
    if type(kind) is not str or kind not in _KNOWN_FIELDS:
        raise ProtocolError(
            ErrorCode.UNKNOWN_MESSAGE_TYPE,
            f"unknown request type {_show(kind)} (known: {', '.join(sorted(_KNOWN_FIELDS))})",
            request_id=rid,
        )
    if kind == "execute":
        fast = _fast_execute(wire, rid, limits)
        if fast is not None:
            return fast
    f = _Fields(kind, wire, rid)
    try:
        if kind == "execute":
            max_name = limits.max_name
            max_text = limits.max_text
            session = SessionSpec(
                f.session(max_name),
                f.number("max_age", DEFAULT_SESSION_MAX_AGE),
                f.text("session_description", "", max_text, "max_text"),
            )
            namespace = f.text("namespace", limit=max_name, setting="max_name")
            raw_statements = f.get("statements", (list,), what="an array")
            tx_id = f.text("tx_id", "", max_name, "max_name")
            description = f.text("description", "", max_text, "max_text")
            min_uptime = f.number("min_uptime", 0.0)
            min_trust = f.number("min_trust", 0.0)
            wait = f.number("wait", None)
            f.done()
            try:
                statements = statements_from_wire(raw_statements, limits)
            except ProtocolError as exc:
                exc.request_id = rid
                raise
            tx = Transaction(
                namespace,
                statements,
                transaction_id=tx_id,
                description=description,
                min_uptime=min_uptime,
                min_trust=min_trust,
            )
            return Execute(rid, session, tx, wait)
        if kind == "hello":
            hello = Hello(
                rid,
                f.get("version", (int,)),
                f.text("client", "", limits.max_name, "max_name"),
                f.text("token", None),
            )
            f.done()
            return hello
        if kind == "end":
            end = EndSession(rid, f.session(limits.max_name))
            f.done()
            return end
        if kind == "stats":
            f.done()
            return GetStatistics(rid)
        if kind == "ping":
            f.done()
            return Ping(rid)
        if kind in REQUEST_FIELDS:
            return inspect_request_from_wire(kind, f, limits)  # type: ignore[no-any-return]
        cancel = Cancel(rid, f.get("target", (int,), what="an integer"))
        f.done()
        return cancel
    except (TypeError, ValueError) as exc:
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, f"{kind}: {exc}", request_id=rid) from None


# --- server messages --------------------------------------------------------------------------


def result_to_wire(request_id: int, body: TransactionResult) -> dict[str, Any]:
    """The map to pack for ``Reply(request_id, body)``; the server's hot path calls it
    directly (no Reply object). Status and cause stay IntEnums and the data pairs tuples:
    msgpack packs them as the plain integers and arrays they are, so no conversion is spent on
    them (``server_message_to_wire`` converts them, for callers that inspect the map). The
    ``holders`` of a denial are sent only when there are some: a grant's map is unchanged."""
    # Any: the fields as they are (a compiled build would turn an int declared float into a
    # float on reading it, and the bytes would depend on the build).
    b: Any = body
    out = {
        "type": "result",
        "id": request_id,
        "status": b.status,
        "cause": b.cause,
        "tx_id": b.transaction_id,
        "host": b.host,
        "uptime": b.uptime,
        "trust": b.trust,
        "failed": b.failed_statement,
        "data": b.data,
        "fence": b.fence,
        "valid_until": b.valid_until,
    }
    if body.holders:
        out["holders"] = [holder_to_wire(h) for h in body.holders]
    return out


def server_message_to_wire(msg: ServerMessage) -> dict[str, Any]:
    """Encode a reply, error reply or event as its wire map."""
    t = type(msg)
    if t is Reply:
        r: Any = msg
        body = r.body
        bt = type(body)
        if bt is TransactionResult:
            out = result_to_wire(r.request_id, body)
            # The wire map as plain data (the packed bytes are the same either way).
            out["status"] = int(body.status)
            out["cause"] = int(body.cause)
            out["data"] = [[name, value] for name, value in body.data]
            return out
        if bt is SessionEnded:
            return {"type": "ended", "id": r.request_id, "existed": body.existed}
        if bt is Pong:
            return {"type": "pong", "id": r.request_id, "uptime": body.uptime, "trust": body.trust}
        if bt is Statistics:
            return {"type": "stats", "id": r.request_id, "stats": dict(body.values)}
        if bt is Welcome:
            welcome = {
                "type": "welcome",
                "id": r.request_id,
                "version": body.version,
                "server": body.server_name,
                "host": body.host,
                "limits": dict(body.limits),
                "instance": body.instance,
            }
            if body.started_at is not None:
                welcome["started_at"] = body.started_at
            if body.group:  # a replica of a group only; absent otherwise (PROTOCOL.md §4)
                welcome["group"] = body.group
            if body.replicas:
                welcome["replicas"] = list(body.replicas)
            return welcome
        if bt is Cancelled:
            return {"type": "cancelled", "id": r.request_id, "found": body.found}
        wire = inspect_reply_to_wire(r.request_id, body)
        if wire is not None:
            return wire
        raise TypeError(f"not a reply body: {body!r}")
    if t is ErrorReply:
        e: Any = msg
        return {
            "type": "error",
            "id": e.request_id,
            "code": int(e.code),
            "name": e.code.name,
            "message": e.message,
        }
    if t is LockLost:
        ev: Any = msg
        return {
            "type": "lost",
            "session": ev.session_id,
            "reason": str(ev.reason),
            "entries": [list(x) for x in ev.entries],
        }
    if t is FeedEvent:
        return feed_to_wire(msg)  # type: ignore[arg-type]
    raise TypeError(f"not a server message: {msg!r}")


# The result fast path (the client's hot reply): every field present with its plain type
# builds the reply without validators; anything else goes the general way for its precise
# error. Status and cause map through tables (True would pass a dict lookup as 1, hence the
# explicit int checks).
_STATUS_BY_INT: Final = {int(s): s for s in Status}
_CAUSE_BY_INT: Final = {int(c): c for c in Cause}
_mk_result: Final = _unchecked_maker(TransactionResult)
_mk_reply: Final = _unchecked_maker(Reply)

#: A ``TransactionResult`` from all eleven fields, positionally: equal to what the class's own
#: ``__init__`` builds (it has no validators or converters), about 2.5x cheaper. For producers
#: of already well-typed results: the engine's commit path, once per transaction.
new_transaction_result: Final[Callable[..., TransactionResult]] = _mk_result


def _real(value: Any) -> bool:
    t = type(value)
    return t is int or (t is float and not math.isnan(value))


def _fast_result(w: dict[str, Any]) -> Reply | None:
    get = w.get
    rid = get("id")
    status = get("status")
    cause = get("cause")
    tx_id = get("tx_id")
    host = get("host")
    uptime = get("uptime")
    trust = get("trust")
    failed = get("failed")
    data = get("data")
    fence = get("fence")
    valid_until = get("valid_until")
    if (
        type(rid) is not int
        or type(status) is not int
        or type(cause) is not int
        or type(tx_id) is not str
        or type(host) is not str
        or type(data) is not list
        or type(fence) is not int
        or not _real(uptime)
        or not _real(trust)
        or (failed is not None and type(failed) is not str)
        or (valid_until is not None and not _real(valid_until))
    ):
        return None
    status = _STATUS_BY_INT.get(status)
    cause = _CAUSE_BY_INT.get(cause)
    if status is None or cause is None:
        return None
    pairs: tuple[tuple[str, Any], ...] = ()
    if data:
        items = []
        for item in data:
            if type(item) is not list or len(item) != 2 or type(item[0]) is not str:
                return None
            items.append((item[0], item[1]))
        pairs = tuple(items)
    body = _mk_result(
        status, cause, tx_id, host, uptime, trust, failed, pairs, fence, valid_until, ()
    )
    return _mk_reply(rid, body)  # type: ignore[no-any-return]


def server_message_from_wire(wire: Any) -> ServerMessage:
    """Decode a received reply, error reply or event (the client's side)."""
    if type(wire) is dict and len(wire) == 12 and wire.get("type") == "result":
        fast = _fast_result(wire)
        if fast is not None:
            return fast
    if type(wire) is not dict:
        raise ProtocolError(
            ErrorCode.INVALID_MESSAGE, f"a server message must be a map, got {_wire_type(wire)}"
        )
    # Errors name the reply's id when it is readable, so a client can fail that one request.
    rid = wire.get("id")
    rid = rid if type(rid) is int else None
    kind = wire.get("type")
    decoder = _SERVER_DECODERS.get(kind) if type(kind) is str else None
    if decoder is None:
        raise ProtocolError(
            ErrorCode.UNKNOWN_MESSAGE_TYPE, f"unknown server message {_show(kind)}", request_id=rid
        )
    f = _Fields(kind, wire, rid)  # type: ignore[arg-type]
    try:
        return decoder(f)
    except (TypeError, ValueError, KeyError) as exc:
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, f"{kind}: {exc}", request_id=rid) from None


def _rid(f: _Fields) -> int:
    return f.get("id", (int,))  # type: ignore[no-any-return]


def _d_result(f: _Fields) -> ServerMessage:
    rid = _rid(f)
    data = f.get("data", (list,))
    pairs = []
    for item in data:
        if type(item) is not list or len(item) != 2 or type(item[0]) is not str:
            raise ValueError("data items must be [name, value] pairs")
        pairs.append((item[0], item[1]))
    body = TransactionResult(
        status=Status(f.get("status", (int,))),
        cause=Cause(f.get("cause", (int,))),
        transaction_id=f.text("tx_id"),
        host=f.text("host"),
        uptime=f.number("uptime"),
        trust=f.number("trust"),
        failed_statement=f.text("failed", None),
        data=tuple(pairs),
        fence=f.get("fence", (int,)),
        valid_until=f.number("valid_until", None),
        holders=holders_from_wire(f.get("holders", (list,), [])),
    )
    return Reply(rid, body)


def _d_ended(f: _Fields) -> ServerMessage:
    return Reply(_rid(f), SessionEnded(f.get("existed", (bool,))))


def _d_pong(f: _Fields) -> ServerMessage:
    return Reply(_rid(f), Pong(f.number("uptime"), f.number("trust")))


def _d_stats(f: _Fields) -> ServerMessage:
    return Reply(_rid(f), Statistics(f.get("stats", (dict,))))


def _d_welcome(f: _Fields) -> ServerMessage:
    replicas = f.get("replicas", (list,), [])
    for item in replicas:
        if type(item) is not str:
            raise ValueError(f"replicas must be host:port strings, got {_wire_type(item)}")
    return Reply(
        _rid(f),
        Welcome(
            f.get("version", (int,)),
            f.text("server"),
            f.text("host"),
            f.get("limits", (dict,)),
            f.text("instance", ""),
            f.number("started_at", None),
            f.text("group", ""),
            tuple(replicas),
        ),
    )


def _d_cancelled(f: _Fields) -> ServerMessage:
    return Reply(_rid(f), Cancelled(f.get("found", (bool,))))


def _d_error(f: _Fields) -> ServerMessage:
    rid = f.get("id", (int, type(None)))
    code = f.get("code", (int,))
    try:
        ecode = ErrorCode(code)
    except ValueError:
        ecode = ErrorCode.INTERNAL_ERROR  # an unknown (newer) code: keep the message
    return ErrorReply(rid, ecode, f.text("message"))


def _d_lost(f: _Fields) -> ServerMessage:
    entries = []
    for item in f.get("entries", (list,)):
        if type(item) is not list or len(item) != 4:
            raise ValueError("entries must be [namespace, table, var, fence] arrays")
        entries.append((item[0], item[1], item[2], item[3]))
    reason = f.text("reason")
    try:
        lost_reason = LostReason(reason)
    except ValueError:  # a newer server's reason: the entries are gone all the same
        lost_reason = LostReason.UNKNOWN
    return LockLost(f.text("session"), lost_reason, tuple(entries))


_SERVER_DECODERS: Mapping[str, Callable[[_Fields], ServerMessage]] = {
    "result": _d_result,
    "ended": _d_ended,
    "pong": _d_pong,
    "stats": _d_stats,
    "welcome": _d_welcome,
    "cancelled": _d_cancelled,
    "error": _d_error,
    "lost": _d_lost,
    **SERVER_DECODERS,
}
