"""An etcd v3 client for the replicated mode, spoken over etcd's gRPC API (the default) or
its HTTP/JSON gateway: plain or TLS (mutual TLS with a client certificate), with etcd's
user/password auth.

This module owns the conversation with an etcd cluster: :class:`Etcd`, its calls (keys,
prefixes, transactions, deletes, compaction, leases, watches, status), the choice of endpoint,
the auth token and the bounds on every call. It re-exports the values, transaction vocabulary
and errors of ``_etcd_json.py`` (what the gateway's JSON means, no I/O). Over gRPC it sends
through ``_etcd_grpc.py`` (kept-alive HTTP/2 connections, h2 over non-blocking sockets),
each call's messages translated to and from that same JSON by ``_etcd_messages.py``, and
reads watches through ``_etcd_grpc_watch.py``; over the gateway through ``_etcd_http.py``
(HTTP/1.1, h11) and ``_etcd_watch.py``. The replication logic imports everything from here
and sees bytes, ints and frozen values, never JSON nor protobuf.

Rules kept:
- **Everything is bounded.** One attempt at one endpoint takes at most ``timeout`` seconds
  (connect, TLS handshake, renewing the auth token, send and the whole answer); a call tries
  each endpoint at most once, so it returns or raises within ``len(endpoints) * timeout``.
  An answer is at most ``max_answer`` bytes (a listing is paged to fit: :data:`PAGE` keys of
  up to 2 MiB each). A call may ask for a shorter bound per attempt (``timeout``: the
  replica's puts and keepalives), so a stopped member costs that, not ``timeout``. A watch
  stream has no bound on how long it waits for the next event (its caller bounds that: the
  replica's watch guard), but connecting it and receiving etcd's "created" does, and so
  does each event's arrival once begun (``_etcd_watch.py``). A watch asks for a leader
  (``Grpc-Metadata-hasleader``): a member without one refuses or ends it.
- **Failover never doubles a write.** A call moves on to the next endpoint when the request
  cannot have reached etcd (the connection was refused or never opened, the TLS handshake
  failed), or when the call is a read (ranges, status, keepalive, revoke, compaction), which
  can safely be asked twice. A write (put, transaction, delete, lease grant) whose request
  may have reached etcd is not repeated: it raises :class:`EtcdUnavailable` with
  ``maybe_applied`` set, and the caller decides (read back, or retry knowing the write may
  be there twice). etcd answering UNAVAILABLE ("no leader", "request timed out", "leader
  changed") counts as "may have reached": etcd does not say whether the proposal was lost.
- **The auth token is renewed, never a write doubled by it.** With a user, the client asks
  etcd for a token (``Authenticate``) before its first call and sends it with every request.
  When etcd rejects it (expired, revoked, or older than a change of the auth store), etcd
  has applied nothing: the client authenticates again and sends the same request once more.
  A wrong password, a missing permission, or auth configured here but disabled in etcd is an
  :class:`EtcdAuthError` saying which, never retried.
- **The endpoint that answered is kept.** Calls start at it; one that fails moves the next
  call's start to the endpoint after it, so a stopped member costs one timeout, not one per
  call.
- **Failures are exceptions of one family** (:class:`EtcdError`), each naming the endpoint
  and the cause; an answer that is not what etcd sends (a hostile or broken server) is one
  too. Outcomes a caller expects are values: a failed compare is ``(False, revision)``, a
  missing key is ``None``, revoking a lease that is already gone returns ``False``.
- **Values stay under etcd's request limit.** etcd refuses a request larger than
  ``--max-request-bytes`` (1.5 MiB by default), counted on the decoded request, so a value
  of up to :data:`MAX_VALUE` bytes always fits with its key and a transaction's overhead;
  larger data must be chunked by the caller.

Theory of operation: every etcd member (3.4 and later) serves its gRPC API on the client
port, and the same API as JSON (the grpc-gateway, itself a gRPC client of the member):
``POST /v3/kv/range`` with the request message as JSON, the answer as JSON (encoding in
``_etcd_json.py``). A call here is named by its gateway path and built as that JSON; over
gRPC the JSON becomes the method's protobuf request and the protobuf answer becomes the JSON
the gateway would have sent (``_etcd_messages.py``), so every answer is read by one piece of
code whichever way it came. The token goes in gRPC's ``token`` metadata, or in the
gateway's ``Authorization`` header, which the gateway hands to etcd as that metadata. Reads
are etcd's default, linearizable: a member without a leader cannot answer one from stale
state. Lease keepalive is a streaming call: one request, one answer, end (a half-closed
gRPC stream; one ``{"result": ...}`` line on the gateway). A watch is a streaming call on a
connection of its own (``_etcd_grpc_watch.py``; on the gateway a long POST answered with one
JSON line per watch response, ``_etcd_watch.py``). gRPC is the default since issue 29: it
skips the gateway's extra hop (the gateway is a gRPC client of its own member) and its JSON;
the gateway stays for a deployment that only lets HTTP/1.1 through.

Prior art: the Go client's ``clientv3`` (call names, the prefix end rule ``range_end`` =
prefix with its last byte incremented, the token renewal on ``ErrInvalidAuthToken``),
python-etcd3 (the same over gRPC) and etcd's own gateway documentation
(``Documentation/dev-guide/api_grpc_gateway.md``).
"""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from types import TracebackType
from typing import Any, Final, Literal, Self

import attrs
import trio
from google.protobuf.message import DecodeError

from ._etcd_grpc import GrpcPool, GrpcStatus, grpc_context
from ._etcd_grpc_watch import GrpcWatchStream
from ._etcd_http import MAX_ANSWER, Endpoint, MaybeSent, NotSent, Pool, parse_endpoint
from ._etcd_json import (
    MAX_VALUE,
    UNAVAILABLE,
    AuthRenew,
    Compacted,
    Compare,
    EtcdAuthError,
    EtcdError,
    EtcdUnavailable,
    KeyValue,
    LeaseGone,
    TxnDelete,
    TxnOp,
    TxnOpResult,
    TxnPut,
    TxnRange,
    TxnResult,
    WatchEvent,
    b64,
    b64s,
    decode,
    error_of,
    int64,
    malformed,
    prefix_end,
    put_body,
    range_body,
)
from ._etcd_messages import METHODS, answer_json, request_message
from ._etcd_watch import WatchStream

__all__ = [
    "MAX_ANSWER",
    "MAX_VALUE",
    "PAGE",
    "Compacted",
    "Compare",
    "Etcd",
    "EtcdAuthError",
    "EtcdError",
    "EtcdStatistics",
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

#: The most bytes one key-value takes in a listing's JSON: a key and a value of up to 2 MiB
#: together (etcd's request limit is 1.5 MiB unless raised), base64'd, with its fields.
KV_JSON_MAX: Final = 3 * 1024 * 1024
#: Keys per page when :meth:`Etcd.get_prefix` pages through a listing (with the default
#: ``max_answer``): a page of the largest values still fits one answer.
PAGE: Final = MAX_ANSWER // KV_JSON_MAX

# Paths whose request is a read: asked again elsewhere when the answer may have been lost.
_AUTHENTICATE: Final = "/v3/auth/authenticate"
#: A watch asks for a leader: the gateway passes ``Grpc-Metadata-*`` headers to etcd as gRPC
#: metadata, and etcd refuses (or, once its member loses the leader, cancels) a watch whose
#: ``hasleader`` is ``true`` (etcd-io/etcd#10819; etcdctl and clientv3's WithRequireLeader).
_REQUIRE_LEADER: Final = ("Grpc-Metadata-hasleader", "true")
_REQUIRE_LEADER_GRPC: Final = ("hasleader", "true")


# --- the client ---------------------------------------------------------------------------------


@attrs.frozen
class EtcdStatistics:
    """A client's counters: the endpoint it uses now, the requests it sent (every attempt),
    the times it moved to another endpoint, the watches open, the connections it opened,
    and the auth tokens it obtained (the first, then each renewal)."""

    endpoint: str
    requests: int
    failovers: int
    watches_open: int
    connections_opened: int = 0
    tokens: int = 0


class Etcd:
    """A client of one etcd cluster, given as one or more client endpoints:
    ``"HOST:PORT"`` or ``"http://HOST:PORT"`` / ``"https://HOST:PORT"`` (every endpoint with
    the same scheme).

    ``tls`` is the SSL context https endpoints are verified with (its CA bundle, and the
    client certificate for mutual TLS); given, a bare ``HOST:PORT`` means https. Without it,
    https endpoints are verified against the system's CAs. ``user`` and ``password``: etcd's
    auth (a token is obtained, sent and renewed by the client); ``password`` may be a
    function, called at each authentication, so a password rotated in its file is picked up
    when etcd rejects the old token. ``max_answer`` bounds the bytes of one answer.

    ``transport``: ``"grpc"`` (the default: every call through etcd's gRPC API, HTTP/2, with
    ALPN h2 under TLS: ``tls`` is set to offer h2, so give a gateway client a context of its
    own) or ``"gateway"`` (every call through etcd's HTTP/JSON gateway, HTTP/1.1). Both give
    the same results and errors.

    With several endpoints, a call that cannot reach one tries the next (see the module's
    failover rule) and the client keeps using the one that answered. Every call is bounded:
    ``timeout`` seconds per endpoint tried. Use it as an async context manager, or call
    :meth:`aclose`.
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        timeout: float = 5.0,
        tls: ssl.SSLContext | None = None,
        user: str | None = None,
        password: str | Callable[[], str] | None = None,
        max_answer: int = MAX_ANSWER,
        transport: Literal["gateway", "grpc"] = "grpc",
    ) -> None:
        if transport not in ("gateway", "grpc"):
            raise ValueError(f"transport is 'gateway' or 'grpc', not {transport!r}")
        if isinstance(endpoints, str):
            raise TypeError("endpoints is a sequence of 'host:port' strings, not one string")
        if not endpoints:
            raise ValueError("an etcd client needs at least one endpoint")
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, not {timeout}")
        if (user is None) != (password is None):
            raise ValueError("etcd auth needs both a user and a password")
        if user is not None and (not user or any(c in user for c in "\r\n\0")):
            raise ValueError(f"not an etcd user name: {user!r}")
        if max_answer < 64 * 1024:
            raise ValueError(f"max_answer must be at least 64 KiB, not {max_answer}")
        parsed = [parse_endpoint(e, default_scheme="https" if tls else "http") for e in endpoints]
        schemes = {e.scheme for e in parsed}
        if len(schemes) > 1:
            raise ValueError(
                "the etcd endpoints mix http:// and https://: one cluster is reached one way "
                f"(got {', '.join(e.url for e in parsed)})"
            )
        if tls is not None and schemes == {"http"}:
            raise ValueError("TLS settings are given but the etcd endpoints are plain http://")
        if schemes == {"https"} and tls is None:
            tls = ssl.create_default_context()
        self._parsed: tuple[Endpoint, ...] = tuple(parsed)
        self._endpoints: tuple[str, ...] = tuple(e.url for e in parsed)
        self._timeout = timeout
        self._max_answer = max_answer
        self._page = max(1, max_answer // KV_JSON_MAX)
        self._user = user
        self._password = password  # never logged, never in a message
        self._token: str | None = None
        self._token_lock = trio.Lock()
        self._tokens = 0
        self._current = 0
        self._requests = 0
        self._failovers = 0
        self._watches_open = 0
        #: The endpoint of the last watch opened (None: none yet).
        self.watching: str | None = None
        # One transport carries every call: the gateway's HTTP/1.1 pool or the gRPC one.
        self._pool: Pool | None = None
        self._grpc: GrpcPool | None = None
        if transport == "grpc":
            self._grpc = GrpcPool(None if tls is None else grpc_context(tls))
        else:
            self._pool = Pool(tls)

    def __repr__(self) -> str:
        who = f", user={self._user!r}" if self._user else ""
        return f"Etcd({list(self._endpoints)!r}{who})"

    @property
    def endpoints(self) -> tuple[str, ...]:
        """The endpoints as URLs, in the order given."""
        return self._endpoints

    @property
    def endpoint(self) -> str:
        """The endpoint the next call tries first (the last one that answered)."""
        return self._endpoints[self._current]

    @property
    def transport(self) -> str:
        """``"grpc"`` or ``"gateway"``: how every call reaches etcd."""
        return "gateway" if self._grpc is None else "grpc"

    @property
    def tls(self) -> bool:
        """Whether the endpoints are https."""
        return self._parsed[0].tls

    @property
    def _transport(self) -> Pool | GrpcPool:
        transport = self._grpc if self._pool is None else self._pool
        assert transport is not None
        return transport

    def statistics(self) -> EtcdStatistics:
        """The client's counters now."""
        return EtcdStatistics(
            endpoint=self.endpoint,
            requests=self._requests,
            failovers=self._failovers,
            watches_open=self._watches_open,
            connections_opened=self._transport.opened,
            tokens=self._tokens,
        )

    async def aclose(self) -> None:
        """Close every connection; the client cannot be used afterwards."""
        self._transport.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # --- keys ------------------------------------------------------------------------------

    async def get(self, key: bytes) -> KeyValue | None:
        """The key now (a linearizable read), or None when it does not exist."""
        answer = await self._call("/v3/kv/range", range_body(key, b""), write=False)
        with self._reading("/v3/kv/range"):
            kvs = answer.get("kvs", [])
            return KeyValue.from_json(kvs[0]) if kvs else None

    async def get_prefix(
        self, prefix: bytes, *, limit: int = 0, revision: int = 0
    ) -> tuple[list[KeyValue], int]:
        """Every key starting with ``prefix`` (all keys for ``b""``) in key order, at most
        ``limit`` of them unless 0, as of ``revision`` (0: now), and the revision the listing
        reflects (``revision`` when given, else etcd's revision when the listing was read).

        Large listings are read in pages of :data:`PAGE` keys, all at the same revision, so
        the result is one consistent snapshot. Raises :class:`Compacted` when that revision
        has been compacted (also when it is compacted between two pages)."""
        if limit < 0 or revision < 0:
            raise ValueError("limit and revision are >= 0")
        start, end = (b"\0", b"\0") if prefix == b"" else (prefix, prefix_end(prefix))
        found: list[KeyValue] = []
        at = revision
        while True:
            page = self._page if limit == 0 else min(self._page, limit - len(found))
            body = range_body(start, end)
            body["limit"] = str(page)
            if at:
                body["revision"] = str(at)
            answer = await self._call("/v3/kv/range", body, write=False)
            with self._reading("/v3/kv/range"):
                if not at:
                    at = int64(answer.get("header", {}), "revision")
                kvs = [KeyValue.from_json(kv) for kv in answer.get("kvs", [])]
                more = bool(answer.get("more", False))
            if len(kvs) > page or (kvs and found and kvs[0].key <= found[-1].key):
                raise malformed(self.endpoint, "/v3/kv/range", "a page out of order or too long")
            found.extend(kvs)
            if not more or not kvs or (limit and len(found) >= limit):
                return found, at
            start = kvs[-1].key + b"\0"

    async def mod_revision(self, key: bytes, *, timeout: float | None = None) -> int:
        """The revision of the last change of ``key`` (a linearizable read, no value moved),
        0 when it does not exist. ``timeout``: the bound of one attempt at one endpoint."""
        body = range_body(key, b"")
        body["keys_only"] = True
        answer = await self._call("/v3/kv/range", body, write=False, timeout=timeout)
        with self._reading("/v3/kv/range"):
            kvs = answer.get("kvs", [])
            return int64(kvs[0], "mod_revision") if kvs else 0

    async def current_revision(self) -> int:
        """etcd's revision now (a linearizable count of one key, no values moved)."""
        body = range_body(b"\0", b"")
        body["count_only"] = True
        answer = await self._call("/v3/kv/range", body, write=False)
        with self._reading("/v3/kv/range"):
            return int64(answer.get("header", {}), "revision")

    async def put(
        self, key: bytes, value: bytes, *, lease: int = 0, timeout: float | None = None
    ) -> int:
        """Store ``value`` at ``key`` (attached to ``lease`` unless 0); returns the put's
        revision. Raises :class:`LeaseGone` when the lease does not exist. ``timeout``: the
        bound of one attempt at one endpoint, when shorter than the client's."""
        answer = await self._call(
            "/v3/kv/put", put_body(key, value, lease), write=True, timeout=timeout
        )
        with self._reading("/v3/kv/put"):
            return int64(answer.get("header", {}), "revision")

    async def put_if_absent(self, key: bytes, value: bytes, *, lease: int = 0) -> tuple[bool, int]:
        """Store ``value`` at ``key`` only if the key does not exist. Returns (True, the put's
        revision) or (False, etcd's revision when it found the key present)."""
        result = await self.txn(
            [Compare(key, "create_revision", "==", 0)], [TxnPut(key, value, lease)], []
        )
        return result.succeeded, result.revision

    async def put_if_mod_revision(
        self, key: bytes, value: bytes, mod_revision: int, *, lease: int = 0
    ) -> tuple[bool, int]:
        """Store ``value`` at ``key`` only if the key was last changed at ``mod_revision``
        (0: only if it does not exist). Returns (True, the put's revision) or (False, etcd's
        revision when the compare failed)."""
        result = await self.txn(
            [Compare(key, "mod_revision", "==", mod_revision)], [TxnPut(key, value, lease)], []
        )
        return result.succeeded, result.revision

    async def txn(
        self,
        compares: Sequence[Compare],
        success: Sequence[TxnOp],
        failure: Sequence[TxnOp] = (),
    ) -> TxnResult:
        """One atomic transaction: if every compare holds, run ``success``, else ``failure``.
        etcd refuses a transaction that writes one key twice or has more than 128
        operations (``--max-txn-ops``)."""
        body = {
            "compare": [c.to_json() for c in compares],
            "success": [op.to_json() for op in success],
            "failure": [op.to_json() for op in failure],
        }
        answer = await self._call("/v3/kv/txn", body, write=True)
        with self._reading("/v3/kv/txn"):
            succeeded = bool(answer.get("succeeded", False))
            ran = success if succeeded else failure
            responses = answer.get("responses", [])
            results: list[TxnOpResult] = []
            for op, response in zip(ran, responses, strict=True):
                if isinstance(op, TxnRange):
                    kvs = response.get("response_range", {}).get("kvs", [])
                    results.append(tuple(KeyValue.from_json(kv) for kv in kvs))
                elif isinstance(op, TxnDelete):
                    results.append(int64(response.get("response_delete_range", {}), "deleted"))
                else:
                    results.append(None)
            return TxnResult(
                succeeded=succeeded,
                revision=int64(answer.get("header", {}), "revision"),
                results=tuple(results),
            )

    async def delete(self, key: bytes) -> int:
        """Delete ``key``; returns how many keys were deleted (1, or 0 when it was absent)."""
        return await self.delete_range(key, b"")

    async def delete_prefix(self, prefix: bytes) -> int:
        """Delete every key starting with ``prefix`` (every key for ``b""``); returns how
        many were deleted."""
        if prefix == b"":
            return await self.delete_range(b"\0", b"\0")
        return await self.delete_range(prefix, prefix_end(prefix))

    async def delete_range(self, start: bytes, end: bytes) -> int:
        """Delete the keys in ``[start, end)`` (only ``start`` when ``end`` is ``b""``);
        returns how many were deleted."""
        answer = await self._call("/v3/kv/deleterange", range_body(start, end), write=True)
        with self._reading("/v3/kv/deleterange"):
            return int64(answer, "deleted")

    async def compact(self, revision: int, *, physical: bool = False) -> None:
        """Drop the history before ``revision`` (the keys as of ``revision`` stay readable).
        When it returns, the history before ``revision`` is gone: this call removed it or it
        already was (compacting twice is not an error). ``physical`` waits until the space is
        freed in etcd's database too. A revision after etcd's current one is an error."""
        body: dict[str, Any] = {"revision": str(revision), "physical": physical}
        try:
            await self._call("/v3/kv/compaction", body, write=False)
        except Compacted:
            return

    # --- leases ----------------------------------------------------------------------------

    async def lease_grant(self, ttl: int) -> tuple[int, int]:
        """A new lease living ``ttl`` seconds unless kept alive: (lease id, the TTL granted,
        which etcd may raise to its minimum)."""
        if ttl <= 0:
            raise ValueError(f"a lease's ttl is a positive number of seconds, not {ttl}")
        answer = await self._call("/v3/lease/grant", {"TTL": str(ttl)}, write=True)
        with self._reading("/v3/lease/grant"):
            return int64(answer, "ID"), int64(answer, "TTL")

    async def lease_keepalive(self, lease_id: int, *, timeout: float | None = None) -> int:
        """Renew the lease to its full TTL; returns that TTL in seconds. Raises
        :class:`LeaseGone` when the lease no longer exists (expired or revoked)."""
        answer = await self._call(
            "/v3/lease/keepalive", {"ID": str(lease_id)}, write=False, timeout=timeout
        )
        with self._reading("/v3/lease/keepalive"):
            ttl = int64(answer, "TTL")
        if ttl <= 0:
            raise LeaseGone(
                f"etcd at {self.endpoint}: lease {lease_id} is gone (expired or revoked)",
                lease_id=lease_id,
                endpoint=self.endpoint,
            )
        return ttl

    async def lease_revoke(self, lease_id: int) -> bool:
        """End the lease now, deleting every key attached to it. Returns True, or False when
        the lease was already gone (the outcome the caller wanted either way)."""
        try:
            await self._call("/v3/lease/revoke", {"ID": str(lease_id)}, write=False)
        except LeaseGone:
            return False
        return True

    async def lease_time_to_live(self, lease_id: int) -> tuple[int, int]:
        """(seconds the lease has left by etcd's clock, the TTL it was granted); the first
        is -1 when the lease is gone (expired or revoked)."""
        try:
            answer = await self._call("/v3/lease/timetolive", {"ID": str(lease_id)}, write=False)
        except LeaseGone:
            return -1, 0
        return int64(answer, "TTL"), int64(answer, "grantedTTL")

    # --- watch and status -----------------------------------------------------------------

    def watch(
        self,
        prefix: bytes,
        *,
        start_revision: int,
        range_end: bytes | None = None,
        open_timeout: float | None = None,
    ) -> AbstractAsyncContextManager[AsyncIterator[list[WatchEvent]]]:
        """Watch every key starting with ``prefix`` (with ``range_end``: every key from
        ``prefix`` up to, not including, ``range_end``) from ``start_revision`` (inclusive; the
        events already in etcd's history come first). Entering opens the stream (bounded by
        ``timeout`` per endpoint) and returns once etcd has created the watch; iterating
        gives batches of events in revision order, never splitting one revision's events.
        Progress notifications are skipped.

        The iterator raises :class:`Compacted` when ``start_revision`` has been compacted
        (right after creation), and :class:`EtcdUnavailable` when the stream breaks or etcd
        ends it (the next call starts at another endpoint): resume with a new watch from the
        last revision seen + 1.

        The watch asks for a leader (``Grpc-Metadata-hasleader: true``, as etcdctl and
        clientv3's ``WithRequireLeader`` do): a member that has lost its leader refuses it,
        or ends it, rather than keep it open and silent. A member that is stopped ends
        nothing: the caller bounds that (``Replica``'s watch guard). ``open_timeout``: the
        bound of opening it at one endpoint, when shorter than the client's.
        :attr:`watching` is the endpoint of the last watch opened."""
        start, end = (b"\0", b"\0") if prefix == b"" else (prefix, prefix_end(prefix))
        if range_end is not None:
            if range_end <= prefix:
                raise ValueError("a watch's range_end must sort after its first key")
            start, end = prefix or b"\0", range_end
        return self._watch(start, end, start_revision, timeout=open_timeout)

    def avoid(self, url: str) -> None:
        """The endpoint ``url`` serves no more (a watch there went silent while the cluster
        moved on): when the next call would start there, it starts at the next one."""
        if len(self._endpoints) > 1 and self._endpoints[self._current] == url:
            self._move_past(self._current)

    async def status(self) -> dict[str, Any]:
        """The maintenance status of the endpoint that answers: ``version``, ``leader`` and
        ``member_id`` (ints), ``raftTerm``, ``raftIndex``, ``dbSize``, ``dbSizeInUse``,
        ``revision`` (ints) and ``endpoint`` (the URL that answered)."""
        answer = await self._call("/v3/maintenance/status", {}, write=False)
        with self._reading("/v3/maintenance/status"):
            header = answer.get("header", {})
            status: dict[str, Any] = {
                "endpoint": self.endpoint,
                "version": str(answer.get("version", "")),
                "member_id": int64(header, "member_id"),
                "revision": int64(header, "revision"),
            }
            for name in ("leader", "raftTerm", "raftIndex", "raftAppliedIndex", "dbSize"):
                status[name] = int64(answer, name)
            status["dbSizeInUse"] = int64(answer, "dbSizeInUse")
            if "errors" in answer:
                status["errors"] = [str(e) for e in answer["errors"]]
            return status

    # --- machinery -------------------------------------------------------------------------

    @contextmanager
    def _reading(self, path: str) -> Iterator[None]:
        """Reading an answer: JSON of the wrong shape (a hostile or broken server) becomes
        an EtcdError naming the endpoint and the call, never another exception."""
        try:
            yield
        except (TypeError, ValueError, AttributeError, KeyError, IndexError) as e:
            raise malformed(self.endpoint, self._name(path), f"{type(e).__name__}: {e}") from None

    def _name(self, path: str) -> str:
        """How errors name the call to ``path``: the gRPC method that carries it, or the
        gateway's path."""
        return path if self._grpc is None else METHODS[path].name

    async def _call(
        self,
        path: str,
        body: dict[str, Any],
        *,
        write: bool,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Call ``path`` (a gateway path; over gRPC, its method) with ``body`` (the gateway's
        JSON of the request) on the current endpoint, failing over by the module's rule; the
        answer as the gateway's JSON, or the error it carried raised."""
        failures: list[str] = []
        count = len(self._endpoints)
        data = (
            request_message(path, body)
            if self._grpc is not None
            else json.dumps(body, separators=(",", ":")).encode()
        )
        for step in range(count):
            index = (self._current + step) % count
            endpoint = self._parsed[index]
            try:
                answer = await self._attempt(endpoint, path, data, body, timeout)
            except NotSent as e:
                failures.append(f"{endpoint.url} ({e})")
            except MaybeSent as e:
                if write:
                    self._move_past(index)
                    raise EtcdUnavailable(
                        f"etcd at {endpoint.url}: {self._name(path)} failed after the request "
                        f"was sent ({e}); it may or may not have taken effect",
                        endpoint=endpoint.url,
                        code=e.code,
                        maybe_applied=True,
                    ) from None
                failures.append(f"{endpoint.url} ({e})")
            else:
                if index != self._current:
                    self._current = index
                    self._failovers += 1
                return answer
        self._move_past(self._current)
        raise EtcdUnavailable(
            f"no etcd endpoint answered {self._name(path)}: {'; '.join(failures)}",
            endpoint=self._endpoints[0] if count == 1 else None,
        )

    def _bound(self, timeout: float | None) -> float:
        """One attempt's bound: the client's, or a shorter one the call asked for."""
        return self._timeout if timeout is None else min(self._timeout, max(0.05, timeout))

    def _move_past(self, index: int) -> None:
        """Start the next call at the endpoint after ``index`` (it just failed)."""
        if len(self._endpoints) > 1:
            self._current = (index + 1) % len(self._endpoints)
            self._failovers += 1

    async def _attempt(
        self,
        endpoint: Endpoint,
        path: str,
        data: bytes,
        body: dict[str, Any],
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """One call to one endpoint within ``timeout`` (a token renewal included): the
        answer, an etcd error raised as its EtcdError, or :class:`NotSent` /
        :class:`MaybeSent` for a transport failure."""
        deadline = trio.current_time() + self._bound(timeout)
        token = await self._token_for(endpoint, deadline)
        try:
            return await self._exchange(endpoint, path, data, body, token, deadline)
        except AuthRenew:
            # etcd applied nothing: a new token, and the same request once more.
            token = await self._token_for(endpoint, deadline, rejected=token)
            try:
                return await self._exchange(endpoint, path, data, body, token, deadline)
            except AuthRenew as e:
                raise EtcdAuthError(
                    f"{e} (a token obtained just now was rejected too)",
                    endpoint=endpoint.url,
                    code=e.code,
                ) from None

    async def _exchange(
        self,
        endpoint: Endpoint,
        path: str,
        data: bytes,
        body: dict[str, Any],
        token: str | None,
        deadline: float,
    ) -> dict[str, Any]:
        """One request and its answer; etcd's refusal raised as its EtcdError (UNAVAILABLE
        as :class:`MaybeSent`: etcd does not say whether the proposal was lost)."""
        self._requests += 1
        try:
            return await self._ask(endpoint, path, data, body, token, deadline, self._max_answer)
        except EtcdAuthError:
            raise
        except EtcdError as error:
            if error.code == UNAVAILABLE:
                raise MaybeSent(str(error), code=error.code) from None
            if isinstance(error, Compacted) and path == "/v3/kv/range":
                error.compact_revision = await self._compact_revision(endpoint, body)
            raise

    async def _ask(
        self,
        endpoint: Endpoint,
        path: str,
        data: bytes,
        body: dict[str, Any],
        token: str | None,
        deadline: float,
        max_answer: int,
    ) -> dict[str, Any]:
        """Send ``data`` (the request of a call to ``path``, encoded for the transport in
        use) to one endpoint before ``deadline``: the answer as the gateway's JSON, or etcd's
        refusal raised as the EtcdError it means, the same both ways. :class:`NotSent` /
        :class:`MaybeSent` for the transport, and for a gateway answer that is not JSON (a
        broken or hostile server: a read may be asked elsewhere, a write may have been
        applied)."""
        url = endpoint.url
        if self._grpc is not None:
            method = METHODS[path]
            metadata = [] if token is None else [("token", token)]
            try:
                message = await self._grpc.unary(
                    endpoint, method.name, data, metadata, deadline=deadline, max_message=max_answer
                )
            except GrpcStatus as e:
                raise error_of(
                    url, method.name, {"code": e.code, "message": e.message}, body
                ) from None
            try:
                return answer_json(path, message)
            except DecodeError as e:
                # As an answer that is not JSON from the gateway: a read may be asked
                # elsewhere, a write may have been applied.
                error = malformed(url, method.name, f"not a {method.response.__name__} ({e})")
                raise MaybeSent(str(error)) from None
        assert self._pool is not None
        headers = [] if token is None else [("Authorization", token)]
        status, content = await self._pool.request(
            endpoint, path, data, headers, deadline=deadline, max_answer=max_answer
        )
        try:
            answer = decode(url, path, status, content)
        except EtcdAuthError:
            raise
        except EtcdError as e:
            raise MaybeSent(str(e)) from None
        if path == "/v3/lease/keepalive":
            # A streaming call: its one line is {"result": ...} or {"error": {...}}.
            if not isinstance(answer.get("result"), dict):
                raise error_of(url, path, answer.get("error", answer), body)
            answer = answer["result"]
        if status != 200 or "error" in answer:
            raise error_of(url, path, answer, body)
        return answer

    async def _token_for(
        self, endpoint: Endpoint, deadline: float, *, rejected: str | None = None
    ) -> str | None:
        """The token to send (None without a user): the current one, or a new one when there
        is none or ``rejected`` is still current. One task authenticates at a time; the
        others then use its token. A transport failure here is :class:`NotSent` for the
        request that waits on it."""
        if self._user is None:
            return None
        if self._token is not None and self._token != rejected:
            return self._token
        async with self._token_lock:
            if self._token is not None and self._token != rejected:
                return self._token  # another task renewed it meanwhile
            assert self._password is not None
            password = self._password if isinstance(self._password, str) else self._password()
            body = {"name": self._user, "password": password}
            data = (
                request_message(_AUTHENTICATE, body)
                if self._grpc is not None
                else json.dumps(body).encode()
            )
            name = self._name(_AUTHENTICATE)
            self._requests += 1
            try:
                answer = await self._ask(
                    endpoint, _AUTHENTICATE, data, {}, None, deadline, 64 * 1024
                )
            except MaybeSent as e:
                raise NotSent(f"authenticating as {self._user!r}: {e}") from None
            except EtcdAuthError:
                raise
            except AuthRenew as e:  # not an answer to an authentication
                raise malformed(endpoint.url, name, str(e)) from None
            except EtcdError as error:
                if error.code == UNAVAILABLE:
                    raise NotSent(str(error)) from None
                raise
            token = answer.get("token")
            if not isinstance(token, str) or not token or not token.isascii():
                raise malformed(endpoint.url, name, "no token in the answer")
            if any(c in token for c in "\r\n\0") or len(token) > 4096:
                raise malformed(endpoint.url, name, "a token that is not a header")
            self._token = token
            self._tokens += 1
            return token

    async def _compact_revision(self, endpoint: Endpoint, body: dict[str, Any]) -> int:
        """etcd's compact revision, learnt from the watch it cancels when asked to start at
        revision 1 on the range that was refused (only called after etcd said something was
        compacted: a range the caller may read); 0 if unknown."""
        with trio.move_on_after(self._timeout):
            try:
                key = b64(body.get("key"))
                end = b64(body.get("range_end"))
                async with self._watch(key, end, 1, at=endpoint) as events:
                    async for _ in events:
                        return 0
            except Compacted as e:
                return e.compact_revision
            except EtcdError:
                return 0
        return 0

    @asynccontextmanager
    async def _watch(
        self,
        start: bytes,
        end: bytes,
        start_revision: int,
        *,
        at: Endpoint | None = None,
        timeout: float | None = None,
    ) -> AsyncIterator[AsyncIterator[list[WatchEvent]]]:
        create = {
            "create_request": {
                "key": b64s(start),
                "range_end": b64s(end),
                "start_revision": str(start_revision),
                "fragment": True,
            }
        }
        stream = await self._open_watch(create, at, timeout)
        if at is None:
            self.watching = stream.url
        self._watches_open += 1
        try:
            yield stream
        except EtcdUnavailable:
            # The stream broke or etcd ended it: the next call (a resumed watch) starts at
            # another endpoint, if there is one.
            index = self._parsed.index(stream.endpoint)
            if at is None and index == self._current:
                self._move_past(index)
            raise
        finally:
            self._watches_open -= 1
            stream.close()

    async def _open_watch(
        self, create: dict[str, Any], at: Endpoint | None, timeout: float | None = None
    ) -> WatchStream | GrpcWatchStream:
        """Open a watch stream on ``at`` or, failing over by the read rule, on the endpoints
        from the current one; returns once etcd has said "created"."""
        count = len(self._parsed)
        order = (
            [self._parsed.index(at)]
            if at is not None
            else [(self._current + i) % count for i in range(count)]
        )
        failures: list[str] = []
        for index in order:
            endpoint = self._parsed[index]
            try:
                stream = await self._open_watch_at(endpoint, create, timeout)
            except (NotSent, MaybeSent, EtcdUnavailable) as e:
                # Not connected, no "created" in time, the stream ended before it, or etcd
                # said it cannot serve: the next endpoint may.
                failures.append(f"{endpoint.url} ({e})")
                continue
            if at is None and index != self._current:
                self._current = index
                self._failovers += 1
            return stream
        if at is None:
            self._move_past(self._current)
        raise EtcdUnavailable(f"no etcd endpoint opened a watch: {'; '.join(failures)}")

    async def _open_watch_at(
        self, endpoint: Endpoint, create: dict[str, Any], timeout: float | None = None
    ) -> WatchStream | GrpcWatchStream:
        bound = self._bound(timeout)
        deadline = trio.current_time() + bound
        token = await self._token_for(endpoint, deadline)
        for renewed in (False, True):
            self._requests += 1
            stream: WatchStream | GrpcWatchStream
            if self._grpc is not None:
                stream = GrpcWatchStream(
                    self._grpc, endpoint, timeout=self._timeout, max_message=self._max_answer
                )
                # gRPC metadata itself: the header the gateway would have turned into it.
                headers = [_REQUIRE_LEADER_GRPC]
                if token is not None:
                    headers.append(("token", token))
            else:
                assert self._pool is not None
                stream = WatchStream(
                    self._pool, endpoint, timeout=self._timeout, max_line=self._max_answer
                )
                headers = [_REQUIRE_LEADER]
                if token is not None:
                    headers.append(("Authorization", token))
            try:
                with trio.move_on_at(deadline) as scope:
                    await stream.open(create, headers)
                if scope.cancelled_caught:
                    raise MaybeSent(f"no answer within {bound:g} s")
            except AuthRenew as e:
                stream.close()
                if renewed:
                    raise EtcdAuthError(
                        f"{e} (a token obtained just now was rejected too)",
                        endpoint=endpoint.url,
                        code=e.code,
                    ) from None
                token = await self._token_for(endpoint, deadline, rejected=token)
                continue
            except BaseException:
                stream.close()
                raise
            return stream
        raise AssertionError("unreachable")
