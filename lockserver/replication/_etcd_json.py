"""etcd's v3 API as its HTTP/JSON gateway speaks it: the values, the transaction
vocabulary and the errors of :mod:`lockserver.replication._etcd`, and their JSON both ways. No I/O
here.

This module owns what the gateway's JSON means: every request body the client sends is built
here, every answer is read here into frozen values (:class:`KeyValue`, :class:`WatchEvent`,
:class:`TxnResult`), and an error answer becomes one of the :class:`EtcdError` kinds.

The gateway's encoding (etcd 3.4): bytes fields are base64; 64-bit integers are decimal
strings both ways (``"revision": "42"``); fields holding their zero value are left out of
answers (a false ``succeeded``, an empty ``value``, a ``PUT`` event's ``type``, a revoked
lease's ``TTL``), so every read here has a default. A unary call's error is
``{"error": ..., "message": ..., "code": <gRPC code>}`` with an HTTP 4xx/5xx status; inside
a stream it is ``{"error": {"grpc_code": ..., "message": ...}}``. Which error is which is
told by etcd's gRPC code and, where codes are shared (a compacted revision and a future one
are both OUT_OF_RANGE), by etcd's fixed message text.
"""

from __future__ import annotations

import base64
import json
from typing import Any, Final, Literal, TypeAlias

import attrs

__all__ = [
    "MAX_VALUE",
    "Compacted",
    "Compare",
    "EtcdAuthError",
    "EtcdError",
    "EtcdUnavailable",
    "KeyValue",
    "LeaseGone",
    "TxnDelete",
    "TxnOp",
    "TxnOpResult",
    "TxnPut",
    "TxnRange",
    "TxnResult",
    "WatchEvent",
    "prefix_end",
]

#: The largest value one put should carry: etcd's default request limit is 1.5 MiB
#: (1,572,864 bytes, ``--max-request-bytes``) for the whole decoded request, and this leaves
#: room for a key and a transaction around it. Chunk anything larger.
MAX_VALUE: Final = 1_400_000

# gRPC status codes etcd answers with (google.golang.org/grpc/codes).
NOT_FOUND: Final = 5
PERMISSION_DENIED: Final = 7
OUT_OF_RANGE: Final = 11
UNAVAILABLE: Final = 14
UNAUTHENTICATED: Final = 16
_COMPACTED_MESSAGE: Final = "required revision has been compacted"
#: etcd 3.4's gateway, with --client-cert-auth, to a certificate with a Common Name.
_COMMON_NAME_REFUSED: Final = b"CommonName of client sending a request against gateway"
_LEASE_NOT_FOUND_MESSAGE: Final = "requested lease not found"
#: etcd's words when a token must be renewed: it expired or was revoked (a user's password
#: changed, auth was disabled and enabled), or it was issued before a change of the auth
#: store that the request met when applied. Either way etcd did not apply the request.
_RENEW_MESSAGES: Final = ("invalid auth token", "revision of auth store is old")
#: etcd's words of an auth refusal that no renewal cures.
_AUTH_MESSAGES: Final = {
    "authentication failed": "wrong user name or password (etcd_user, etcd_password_file)",
    "permission denied": "the etcd user (etcd_user, or none given) lacks the permission: "
    "grant its role readwrite on the group's prefix (docs/replication.md)",
    "user name is empty": "etcd requires authentication (set etcd_user and etcd_password_file)",
    "authentication is not enabled": "etcd_user is set but etcd's authentication is not "
    "enabled (etcdctl auth enable), so every client could write the group's log",
}


# --- errors -------------------------------------------------------------------------------------


class EtcdError(Exception):
    """A call to etcd failed. The message names the endpoint and the cause; ``endpoint`` is
    that endpoint (None when no single one is to blame) and ``code`` the gRPC status code
    etcd answered with (None when etcd did not answer)."""

    def __init__(self, message: str, *, endpoint: str | None = None, code: int | None = None):
        super().__init__(message)
        self.endpoint = endpoint
        self.code = code


class EtcdUnavailable(EtcdError):
    """No endpoint answered: connections refused, timed out or broken, or etcd said it cannot
    serve (no leader). ``maybe_applied`` is True when a write was sent and its outcome is
    unknown: it may have taken effect."""

    def __init__(
        self,
        message: str,
        *,
        endpoint: str | None = None,
        code: int | None = None,
        maybe_applied: bool = False,
    ):
        super().__init__(message, endpoint=endpoint, code=code)
        self.maybe_applied = maybe_applied


class EtcdAuthError(EtcdError):
    """etcd refused this client's identity or rights: a wrong user name or password, a
    permission the user's role lacks, a token etcd requires and the client has not, or auth
    configured here but not enabled in etcd. Renewing the token would not help."""


class AuthRenew(EtcdError):
    """etcd rejected the auth token (expired, revoked, or older than the auth store); it
    did not apply the request. Internal: the client renews the token and asks again."""


class Compacted(EtcdError):
    """A range or watch asked for a revision etcd has compacted away. ``compact_revision`` is
    the oldest revision still readable (0 when etcd did not say)."""

    def __init__(self, message: str, *, compact_revision: int, endpoint: str | None = None) -> None:
        super().__init__(message, endpoint=endpoint, code=OUT_OF_RANGE)
        self.compact_revision = compact_revision


class LeaseGone(EtcdError):
    """The lease does not exist (it expired or was revoked): a keepalive, or a put attached
    to it, found nothing to attach to."""

    def __init__(self, message: str, *, lease_id: int, endpoint: str | None = None) -> None:
        super().__init__(message, endpoint=endpoint, code=NOT_FOUND)
        self.lease_id = lease_id


# --- values -------------------------------------------------------------------------------------


@attrs.frozen
class KeyValue:
    """One key as etcd stores it: its value, the revisions of its creation and last change,
    its version (puts since creation) and its lease (0: none)."""

    key: bytes
    value: bytes
    mod_revision: int
    create_revision: int
    version: int
    lease: int

    @classmethod
    def from_json(cls, kv: dict[str, Any]) -> KeyValue:
        """A key-value from the gateway's JSON (base64 bytes, int64 as strings, zero fields
        left out)."""
        return cls(
            key=b64(kv.get("key")),
            value=b64(kv.get("value")),
            mod_revision=int64(kv, "mod_revision"),
            create_revision=int64(kv, "create_revision"),
            version=int64(kv, "version"),
            lease=int64(kv, "lease"),
        )


@attrs.frozen
class WatchEvent:
    """One change seen by a watch: a put (``value`` is the new value) or a delete (``value``
    is empty), at ``mod_revision``."""

    kind: Literal["put", "delete"]
    key: bytes
    value: bytes
    mod_revision: int

    @classmethod
    def from_json(cls, event: dict[str, Any]) -> WatchEvent:
        """An event from the gateway's JSON (``type`` is left out for a put)."""
        kv = event.get("kv", {})
        kind: Literal["put", "delete"] = "delete" if event.get("type") == "DELETE" else "put"
        return cls(
            kind=kind,
            key=b64(kv.get("key")),
            value=b64(kv.get("value")),
            mod_revision=int64(kv, "mod_revision"),
        )


CompareTarget: TypeAlias = Literal["create_revision", "mod_revision", "version", "value", "lease"]
CompareOp: TypeAlias = Literal["==", "!=", "<", ">"]
_TARGETS: Final[dict[str, str]] = {
    "create_revision": "CREATE",
    "mod_revision": "MOD",
    "version": "VERSION",
    "value": "VALUE",
    "lease": "LEASE",
}
_OPS: Final[dict[str, str]] = {"==": "EQUAL", "!=": "NOT_EQUAL", "<": "LESS", ">": "GREATER"}


def _operand_fits(instance: Compare, attribute: attrs.Attribute[Any], operand: int | bytes) -> None:
    if (instance.target == "value") != isinstance(operand, bytes):
        wanted = "bytes" if instance.target == "value" else "an int"
        raise TypeError(f"a {instance.target} compare takes {wanted}, not {operand!r}")


@attrs.frozen
class Compare:
    """One condition of a transaction: ``target(key) op operand``. A missing key compares
    as zeros (create_revision, mod_revision, version and lease 0), so
    ``Compare(key, "create_revision", "==", 0)`` means "the key is absent"; a value compare
    on a missing key is false."""

    key: bytes
    target: CompareTarget = attrs.field(validator=attrs.validators.in_(_TARGETS))
    op: CompareOp = attrs.field(validator=attrs.validators.in_(_OPS))
    operand: int | bytes = attrs.field(validator=_operand_fits)

    def to_json(self) -> dict[str, Any]:
        """The gateway's JSON of this compare."""
        operand = b64s(self.operand) if isinstance(self.operand, bytes) else str(self.operand)
        return {
            "key": b64s(self.key),
            "target": _TARGETS[self.target],
            "result": _OPS[self.op],
            self.target: operand,  # the operand's field is named as the target
        }


@attrs.frozen
class TxnPut:
    """Put ``value`` at ``key`` (attached to ``lease`` unless 0) inside a transaction."""

    key: bytes
    value: bytes
    lease: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"request_put": put_body(self.key, self.value, self.lease)}


@attrs.frozen
class TxnRange:
    """Read ``key`` (or ``[key, range_end)`` when ``range_end`` is given) inside a transaction."""

    key: bytes
    range_end: bytes = b""

    def to_json(self) -> dict[str, Any]:
        return {"request_range": range_body(self.key, self.range_end)}


@attrs.frozen
class TxnDelete:
    """Delete ``key`` (or ``[key, range_end)``) inside a transaction."""

    key: bytes
    range_end: bytes = b""

    def to_json(self) -> dict[str, Any]:
        return {"request_delete_range": range_body(self.key, self.range_end)}


TxnOp: TypeAlias = TxnPut | TxnRange | TxnDelete
#: What one operation of a transaction returned: the keys a range read, the count a delete
#: removed, None for a put.
TxnOpResult: TypeAlias = tuple[KeyValue, ...] | int | None


@attrs.frozen
class TxnResult:
    """A transaction's outcome: whether every compare held (so the success branch ran), the
    revision after it (a write's mod revision) and one result per operation of the branch
    that ran, in order."""

    succeeded: bool
    revision: int
    results: tuple[TxnOpResult, ...]


def prefix_end(prefix: bytes) -> bytes:
    """The ``range_end`` covering every key that starts with ``prefix``: the prefix with its
    last byte below 0xff incremented and what follows dropped (``b"\\0"``, meaning "to the
    end", when every byte is 0xff)."""
    trimmed = prefix.rstrip(b"\xff")
    if not trimmed:
        return b"\0"
    return trimmed[:-1] + bytes([trimmed[-1] + 1])


def b64(text: str | None) -> bytes:
    # validate: anything but the base64 alphabet is an error, not silently dropped.
    return base64.b64decode(text, validate=True) if text else b""


def b64s(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def int64(message: dict[str, Any], name: str) -> int:
    """A 64-bit integer field: the gateway sends a decimal string (or leaves out a zero)."""
    return int(message.get(name, 0))


def range_body(key: bytes, end: bytes) -> dict[str, Any]:
    body: dict[str, Any] = {"key": b64s(key)}
    if end:
        body["range_end"] = b64s(end)
    return body


def put_body(key: bytes, value: bytes, lease: int) -> dict[str, Any]:
    body: dict[str, Any] = {"key": b64s(key), "value": b64s(value)}
    if lease:
        body["lease"] = str(lease)
    return body


def decode(endpoint: str, path: str, status: int, content: bytes) -> dict[str, Any]:
    """The JSON object of an answer; anything else is an EtcdError naming what came."""
    try:
        answer = json.loads(content)
    except (ValueError, RecursionError):  # RecursionError: nesting too deep for the parser
        if status == 400 and _COMMON_NAME_REFUSED in content:
            raise EtcdAuthError(
                f"etcd at {endpoint}: {path}: etcd's gateway refuses a client certificate "
                "that has a Common Name: issue the replicas' certificate with a subject "
                "alternative name only (docs/replication.md)",
                endpoint=endpoint,
            ) from None
        snippet = content[:200].decode("utf-8", "replace")
        raise EtcdError(
            f"etcd at {endpoint}: {path} answered HTTP {status} with no JSON: {snippet!r}",
            endpoint=endpoint,
        ) from None
    if not isinstance(answer, dict):
        raise EtcdError(f"etcd at {endpoint}: {path} answered {answer!r}", endpoint=endpoint)
    return answer


def malformed(endpoint: str, path: str, why: str) -> EtcdError:
    """The error of an answer that is JSON but not what etcd sends (a hostile or broken
    server): it names the endpoint, the call and what is wrong, briefly."""
    return EtcdError(
        f"etcd at {endpoint}: {path} answered something this client cannot read ({why[:200]})",
        endpoint=endpoint,
    )


def error_of(endpoint: str, path: str, answer: dict[str, Any], body: dict[str, Any]) -> EtcdError:
    """The EtcdError an error answer means (``{"error", "message", "code"}`` from a unary
    call, ``{"grpc_code", "message", ...}`` inside a stream)."""
    if not isinstance(answer, dict):
        return malformed(endpoint, path, f"an error that is not an object: {answer!r:.100}")
    message = str(answer.get("message") or answer.get("error") or answer)[:1000]
    raw_code = answer.get("code", answer.get("grpc_code"))
    code = raw_code if type(raw_code) is int and 0 <= raw_code < 100 else None
    text = f"etcd at {endpoint}: {path}: {message}"
    if any(m in message for m in _RENEW_MESSAGES):
        return AuthRenew(text, endpoint=endpoint, code=code)
    for words, advice in _AUTH_MESSAGES.items():
        if words in message:
            return EtcdAuthError(f"{text}: {advice}", endpoint=endpoint, code=code)
    if _COMPACTED_MESSAGE in message:
        return Compacted(text, compact_revision=0, endpoint=endpoint)
    if _LEASE_NOT_FOUND_MESSAGE in message:
        lease = body.get("ID", body.get("lease", 0))
        return LeaseGone(text, lease_id=int(lease), endpoint=endpoint)
    if code == UNAVAILABLE:
        return EtcdUnavailable(text, endpoint=endpoint, code=code)
    return EtcdError(text, endpoint=endpoint, code=code)
