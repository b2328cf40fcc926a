"""An etcd v3 client for the replicated mode, spoken over etcd's HTTP/JSON gateway with httpx.

This module owns the conversation with an etcd cluster: :class:`Etcd`, its calls (keys,
prefixes, transactions, deletes, compaction, leases, watches, status), the choice of endpoint
and the bounds on every call. It re-exports the values, transaction vocabulary and errors of
``_etcd_json.py`` (what the gateway's JSON means, no I/O) and reads watches through
``_etcd_watch.py`` (one open stream), so the replication logic imports everything from here
and sees bytes, ints and frozen values, never JSON.

Rules kept:
- **Everything is bounded.** One attempt at one endpoint takes at most ``timeout`` seconds
  (connect, send and the whole answer); a call tries each endpoint at most once, so it
  returns or raises within ``len(endpoints) * timeout``. A watch stream has no bound on how
  long it waits for the next event, but connecting it and receiving etcd's "created" does.
- **Failover never doubles a write.** A call moves on to the next endpoint when the request
  cannot have reached etcd (the connection was refused or never opened), or when the call is
  a read (ranges, status, keepalive, revoke, compaction), which can safely be asked twice.
  A write (put, transaction, delete, lease grant) whose request may have reached etcd is not
  repeated: it raises :class:`EtcdUnavailable` with ``maybe_applied`` set, and the caller
  decides (read back, or retry knowing the write may be there twice). etcd answering
  UNAVAILABLE ("no leader", "request timed out", "leader changed") counts as "may have
  reached": etcd does not say whether the proposal was lost.
- **The endpoint that answered is kept.** Calls start at it; one that fails moves the next
  call's start to the endpoint after it, so a stopped member costs one timeout, not one per
  call.
- **Failures are exceptions of one family** (:class:`EtcdError`), each naming the endpoint
  and the cause. Outcomes a caller expects are values: a failed compare is
  ``(False, revision)``, a missing key is ``None``, revoking a lease that is already gone
  returns ``False``.
- **Values stay under etcd's request limit.** etcd refuses a request larger than
  ``--max-request-bytes`` (1.5 MiB by default), counted on the decoded request, so a value
  of up to :data:`MAX_VALUE` bytes always fits with its key and a transaction's overhead;
  larger data must be chunked by the caller.

Theory of operation: etcd (3.4 and later) serves its gRPC API as JSON on the client port
(the grpc-gateway): ``POST /v3/kv/range`` with the request message as JSON, the answer as
JSON (encoding in ``_etcd_json.py``). Reads are etcd's default, linearizable: a member
without a leader cannot answer one from stale state. Lease keepalive is a streaming call on
the gateway: one request, one ``{"result": ...}`` line, end of answer. A watch is a long
POST whose answer streams one JSON line per watch response (``_etcd_watch.py``). One
``httpx.AsyncClient`` keeps the connections (HTTP/1.1 keep-alive; a watch holds one for its
life); httpx runs on anyio, so the client works under trio and asyncio alike.

Prior art: the Go client's ``clientv3`` (call names, the prefix end rule ``range_end`` =
prefix with its last byte incremented), python-etcd3 (the same over gRPC) and etcd's own
gateway documentation (``Documentation/dev-guide/api_grpc_gateway.md``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from types import TracebackType
from typing import Any, Final, Self

import anyio
import attrs
import httpx

from ._etcd_json import (
    MAX_VALUE,
    UNAVAILABLE,
    Compacted,
    Compare,
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
    b64s,
    decode,
    error_of,
    int64,
    prefix_end,
    put_body,
    range_body,
)
from ._etcd_watch import OneChunk, WatchStream, transport_cause

__all__ = [
    "MAX_VALUE",
    "PAGE",
    "Compacted",
    "Compare",
    "Etcd",
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

_JSON_HEADERS: Final = {"Content-Type": "application/json"}

#: Keys per page when :meth:`Etcd.get_prefix` pages through a large listing.
PAGE: Final = 500


# --- the client ---------------------------------------------------------------------------------


@attrs.frozen
class EtcdStatistics:
    """A client's counters: the endpoint it uses now, the requests it sent (every attempt),
    the times it moved to another endpoint, and the watches open."""

    endpoint: str
    requests: int
    failovers: int
    watches_open: int


class Etcd:
    """A client of one etcd cluster, given as one or more client endpoints
    (``"127.0.0.1:2379"`` or ``"http://127.0.0.1:2379"``).

    With several endpoints, a call that cannot reach one tries the next (see the module's
    failover rule) and the client keeps using the one that answered. Every call is bounded:
    ``timeout`` seconds per endpoint tried. Use it as an async context manager, or call
    :meth:`aclose`.
    """

    def __init__(self, endpoints: Sequence[str], *, timeout: float = 5.0) -> None:
        if isinstance(endpoints, str):
            raise TypeError("endpoints is a sequence of 'host:port' strings, not one string")
        if not endpoints:
            raise ValueError("an etcd client needs at least one endpoint")
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, not {timeout}")
        self._endpoints: tuple[str, ...] = tuple(_normalize(e) for e in endpoints)
        self._timeout = timeout
        self._current = 0
        self._requests = 0
        self._failovers = 0
        self._watches_open = 0
        # The pool serves the short calls and the watch streams alike; each phase is bounded
        # by ``timeout`` here, the whole attempt by the deadline in ``_attempt``.
        # etcd is reached directly: no proxy from the environment (trust_env=False).
        # The short calls go to the transport directly (measured: httpx's client layers --
        # building the request, auth, redirects, cookies -- cost ~40% of a put's CPU, and a
        # replica puts once per log entry); the watches go through the client, which streams.
        self._transport = httpx.AsyncHTTPTransport(trust_env=False)
        self._http = httpx.AsyncClient(
            transport=self._transport, timeout=httpx.Timeout(timeout), trust_env=False
        )
        self._timeouts = httpx.Timeout(timeout).as_dict()

    @property
    def endpoints(self) -> tuple[str, ...]:
        """The endpoints as URLs, in the order given."""
        return self._endpoints

    @property
    def endpoint(self) -> str:
        """The endpoint the next call tries first (the last one that answered)."""
        return self._endpoints[self._current]

    def statistics(self) -> EtcdStatistics:
        """The client's counters now."""
        return EtcdStatistics(
            endpoint=self.endpoint,
            requests=self._requests,
            failovers=self._failovers,
            watches_open=self._watches_open,
        )

    async def aclose(self) -> None:
        """Close every connection; the client cannot be used afterwards."""
        await self._http.aclose()

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
            page = PAGE if limit == 0 else min(PAGE, limit - len(found))
            body = range_body(start, end)
            body["limit"] = str(page)
            if at:
                body["revision"] = str(at)
            answer = await self._call("/v3/kv/range", body, write=False)
            if not at:
                at = int64(answer.get("header", {}), "revision")
            kvs = [KeyValue.from_json(kv) for kv in answer.get("kvs", [])]
            found.extend(kvs)
            if not answer.get("more", False) or not kvs or (limit and len(found) >= limit):
                return found, at
            start = kvs[-1].key + b"\0"

    async def current_revision(self) -> int:
        """etcd's revision now (a linearizable count of one key, no values moved)."""
        body = range_body(b"\0", b"")
        body["count_only"] = True
        answer = await self._call("/v3/kv/range", body, write=False)
        return int64(answer.get("header", {}), "revision")

    async def put(self, key: bytes, value: bytes, *, lease: int = 0) -> int:
        """Store ``value`` at ``key`` (attached to ``lease`` unless 0); returns the put's
        revision. Raises :class:`LeaseGone` when the lease does not exist."""
        answer = await self._call("/v3/kv/put", put_body(key, value, lease), write=True)
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
        return int64(answer, "ID"), int64(answer, "TTL")

    async def lease_keepalive(self, lease_id: int) -> int:
        """Renew the lease to its full TTL; returns that TTL in seconds. Raises
        :class:`LeaseGone` when the lease no longer exists (expired or revoked)."""
        answer = await self._call("/v3/lease/keepalive", {"ID": str(lease_id)}, write=False)
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
        self, prefix: bytes, *, start_revision: int
    ) -> AbstractAsyncContextManager[AsyncIterator[list[WatchEvent]]]:
        """Watch every key starting with ``prefix`` from ``start_revision`` (inclusive; the
        events already in etcd's history come first). Entering opens the stream (bounded by
        ``timeout`` per endpoint) and returns once etcd has created the watch; iterating
        gives batches of events in revision order, never splitting one revision's events
        (etcd cuts its batches at revision boundaries). Progress notifications are skipped.

        The iterator raises :class:`Compacted` when ``start_revision`` has been compacted
        (right after creation), and :class:`EtcdUnavailable` when the stream breaks or etcd
        ends it: resume with a new watch from the last revision seen + 1."""
        return self._watch(prefix, start_revision)

    async def status(self) -> dict[str, Any]:
        """The maintenance status of the endpoint that answers: ``version``, ``leader`` and
        ``member_id`` (ints), ``raftTerm``, ``raftIndex``, ``dbSize``, ``dbSizeInUse``,
        ``revision`` (ints) and ``endpoint`` (the URL that answered)."""
        answer = await self._call("/v3/maintenance/status", {}, write=False)
        header = answer.get("header", {})
        status: dict[str, Any] = {
            "endpoint": self.endpoint,
            "version": answer.get("version", ""),
            "member_id": int64(header, "member_id"),
            "revision": int64(header, "revision"),
        }
        for name in ("leader", "raftTerm", "raftIndex", "raftAppliedIndex", "dbSize"):
            status[name] = int64(answer, name)
        status["dbSizeInUse"] = int64(answer, "dbSizeInUse")
        if "errors" in answer:
            status["errors"] = list(answer["errors"])
        return status

    # --- machinery -------------------------------------------------------------------------

    async def _call(self, path: str, body: dict[str, Any], *, write: bool) -> dict[str, Any]:
        """POST ``body`` to ``path`` on the current endpoint, failing over by the module's
        rule; the decoded answer, or the error it carried raised."""
        failures: list[str] = []
        count = len(self._endpoints)
        for step in range(count):
            index = (self._current + step) % count
            endpoint = self._endpoints[index]
            try:
                answer = await self._attempt(endpoint, path, body)
            except _NotSent as e:
                failures.append(f"{endpoint} ({e})")
            except _MaybeSent as e:
                if write:
                    self._move_past(index)
                    raise EtcdUnavailable(
                        f"etcd at {endpoint}: {path} failed after the request was sent "
                        f"({e}); it may or may not have taken effect",
                        endpoint=endpoint,
                        code=e.code,
                        maybe_applied=True,
                    ) from None
                failures.append(f"{endpoint} ({e})")
            else:
                if index != self._current:
                    self._current = index
                    self._failovers += 1
                return answer
        self._move_past(self._current)
        raise EtcdUnavailable(
            f"no etcd endpoint answered {path}: {'; '.join(failures)}",
            endpoint=self._endpoints[0] if count == 1 else None,
        )

    def _move_past(self, index: int) -> None:
        """Start the next call at the endpoint after ``index`` (it just failed)."""
        if len(self._endpoints) > 1:
            self._current = (index + 1) % len(self._endpoints)
            self._failovers += 1

    async def _attempt(self, endpoint: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """One POST to one endpoint within ``timeout``: the answer, an etcd error raised as
        its EtcdError, or :class:`_NotSent` / :class:`_MaybeSent` for a transport failure."""
        self._requests += 1
        try:
            with anyio.fail_after(self._timeout):
                data = json.dumps(body, separators=(",", ":")).encode()
                request = httpx.Request(
                    "POST",
                    endpoint + path,
                    content=data,  # sets Host and Content-Length
                    headers=_JSON_HEADERS,
                    extensions={"timeout": self._timeouts},
                )
                request.stream = OneChunk(data)
                response = await self._transport.handle_async_request(request)
                try:
                    content = await response.aread()
                finally:
                    await response.aclose()
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as e:
            raise _NotSent(transport_cause(e)) from None
        except httpx.TransportError as e:
            raise _MaybeSent(transport_cause(e)) from None
        except TimeoutError:
            raise _MaybeSent(f"no answer within {self._timeout} s") from None
        answer = decode(endpoint, path, response.status_code, content)
        if path == "/v3/lease/keepalive":
            # A streaming call: its one line is {"result": ...} or {"error": {...}}.
            if "result" not in answer:
                raise error_of(endpoint, path, answer.get("error", answer), body)
            answer = answer["result"]
        if response.status_code != httpx.codes.OK or "error" in answer:
            error = error_of(endpoint, path, answer, body)
            if error.code == UNAVAILABLE:
                raise _MaybeSent(str(error), code=error.code)
            if isinstance(error, Compacted) and path == "/v3/kv/range":
                error.compact_revision = await self._compact_revision(endpoint)
            raise error
        return answer

    async def _compact_revision(self, endpoint: str) -> int:
        """etcd's compact revision, learnt from the watch it cancels when asked to start at
        revision 1 (only called after etcd said something was compacted); 0 if unknown."""
        with anyio.move_on_after(self._timeout):
            try:
                async with self._watch(b"\0", 1, at=endpoint) as events:
                    async for _ in events:
                        return 0
            except Compacted as e:
                return e.compact_revision
            except EtcdError:
                return 0
        return 0

    @asynccontextmanager
    async def _watch(
        self, prefix: bytes, start_revision: int, *, at: str | None = None
    ) -> AsyncIterator[AsyncIterator[list[WatchEvent]]]:
        start, end = (b"\0", b"\0") if prefix == b"" else (prefix, prefix_end(prefix))
        create = {
            "create_request": {
                "key": b64s(start),
                "range_end": b64s(end),
                "start_revision": str(start_revision),
            }
        }
        stream = await self._open_watch(create, at)
        self._watches_open += 1
        try:
            yield stream
        finally:
            self._watches_open -= 1
            await stream.aclose()

    async def _open_watch(self, create: dict[str, Any], at: str | None) -> WatchStream:
        """Open a watch stream on ``at`` or, failing over by the read rule, on the endpoints
        from the current one; returns once etcd has said "created"."""
        order = (
            [self._endpoints.index(at)]
            if at is not None
            else [(self._current + i) % len(self._endpoints) for i in range(len(self._endpoints))]
        )
        failures: list[str] = []
        for index in order:
            endpoint = self._endpoints[index]
            self._requests += 1
            stream = WatchStream(endpoint)
            try:
                with anyio.fail_after(self._timeout):
                    await stream.open(self._http, create, self._timeout)
            except (httpx.TransportError, TimeoutError, EtcdUnavailable) as e:
                # Not connected, no "created" in time, the stream ended before it, or etcd
                # said it cannot serve: the next endpoint may.
                await stream.aclose()
                cause = (
                    f"no answer within {self._timeout} s"
                    if isinstance(e, TimeoutError)
                    else str(e)
                    if isinstance(e, EtcdUnavailable)
                    else transport_cause(e)
                )
                failures.append(f"{endpoint} ({cause})")
                continue
            except BaseException:
                await stream.aclose()
                raise
            if at is None and index != self._current:
                self._current = index
                self._failovers += 1
            return stream
        if at is None:
            self._move_past(self._current)
        raise EtcdUnavailable(f"no etcd endpoint opened a watch: {'; '.join(failures)}")


# --- helpers ------------------------------------------------------------------------------------


class _NotSent(Exception):
    """The request never reached the endpoint: another endpoint may have it."""


class _MaybeSent(Exception):
    """The request may have reached the endpoint (no answer, a broken connection, or etcd
    saying it is unavailable)."""

    def __init__(self, cause: str, *, code: int | None = None) -> None:
        super().__init__(cause)
        self.code = code


def _normalize(endpoint: str) -> str:
    endpoint = endpoint.strip().rstrip("/")
    if not endpoint:
        raise ValueError("an empty etcd endpoint")
    if "://" not in endpoint:
        endpoint = "http://" + endpoint
    return endpoint
