"""etcd as a Python user would call it, for the lab's reference line: the v3 API's JSON
gateway over plain HTTP with the standard library (no etcd client package works with etcd
3.4's gateway and today's Python without trouble: python-etcd3 needs an old protobuf, and the
gateway is what etcd documents for clients without gRPC).

What the reference workloads need: ``range``/``put``/``txn`` compare-and-set for the
register (reads are etcd's default, linearizable), leases (grant, keepalive, revoke) and the
lock service (``/v3/lock/lock`` with a lease, ``/v3/lock/unlock``), whose fence is the lock
key's create revision, as etcd documents ("the key's revision ... can be used as a fencing
token").

Errors say what is known: :class:`NotSent` (no connection could be made: certainly no
effect), :class:`Unknown` (the request may have been applied: a timeout, a connection lost,
an error etcd returns after proposing), :class:`EtcdError` (etcd refused it; for reads and
failed compares no effect). A call goes to one endpoint (the current one); after a transport
failure the client moves to the next endpoint for the following calls -- it never resends a
write itself.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
from collections.abc import Sequence
from typing import Any, Final

__all__ = ["EtcdError", "EtcdGateway", "NotSent", "Unknown"]

#: Seconds a call waits for its answer unless told otherwise.
TIMEOUT: Final = 2.0


class EtcdError(Exception):
    """etcd answered with an error (``code`` its gRPC code when it said one)."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class NotSent(Exception):
    """No connection could be made: the request had no effect."""


class Unknown(Exception):
    """The request may or may not have taken effect."""


def b64(data: bytes | str) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return base64.b64encode(raw).decode()


def unb64(text: str) -> bytes:
    return base64.b64decode(text)


class EtcdGateway:
    """One client (not thread-safe: one per thread) over ``endpoints`` (``host:port``), the
    first preferred."""

    def __init__(self, endpoints: Sequence[str], timeout: float = TIMEOUT) -> None:
        if not endpoints:
            raise ValueError("no etcd endpoint")
        self.endpoints = list(endpoints)
        self.timeout = timeout
        self._index = 0
        self._conn: http.client.HTTPConnection | None = None

    @property
    def endpoint(self) -> str:
        """The endpoint the next call goes to."""
        return self.endpoints[self._index]

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.close()
            self._conn = None

    def _next(self) -> None:
        self.close()
        self._index = (self._index + 1) % len(self.endpoints)

    def call(self, path: str, body: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """POST ``body`` to ``path``; the answer's JSON (for the streaming keepalive, its one
        ``result``). Raises NotSent, Unknown or EtcdError (see the module header)."""
        wait = self.timeout if timeout is None else timeout
        host, _, port = self.endpoint.rpartition(":")
        if self._conn is None:
            self._conn = http.client.HTTPConnection(host, int(port), timeout=wait)
            try:
                self._conn.connect()
            except OSError as exc:
                self._next()
                raise NotSent(f"{host}:{port}: {exc}") from None
        conn = self._conn
        if conn.sock is not None:
            conn.sock.settimeout(wait)
        try:
            conn.request("POST", path, body=json.dumps(body), headers={"Connection": "keep-alive"})
            response = conn.getresponse()
            raw = response.read()
            status = response.status
        except (OSError, http.client.HTTPException) as exc:
            self._next()
            raise Unknown(f"{host}:{port}{path}: {type(exc).__name__} {exc}") from None
        if response.will_close:
            self.close()
        try:
            answer = json.loads(raw.decode().splitlines()[0]) if raw.strip() else {}
        except (ValueError, IndexError, UnicodeDecodeError):
            self._next()
            raise Unknown(
                f"{host}:{port}{path}: an answer that is not JSON: {raw[:200]!r}"
            ) from None
        if isinstance(answer, dict) and "result" in answer and path == "/v3/lease/keepalive":
            answer = answer["result"]
        if not isinstance(answer, dict):
            raise Unknown(f"{host}:{port}{path}: unexpected answer {answer!r}")
        error = answer.get("error")
        if status != 200 or error is not None:
            message = answer.get("message") or (error if isinstance(error, str) else str(answer))
            code = answer.get("code")
            if status >= 500 or code in (4, 14):  # deadline exceeded, unavailable
                self._next()
                raise Unknown(f"{host}:{port}{path}: {message}")
            raise EtcdError(
                f"{host}:{port}{path}: {message}", code if isinstance(code, int) else None
            )
        return answer

    # --- KV ------------------------------------------------------------------------------------

    def get(self, key: str) -> tuple[bytes | None, int]:
        """The value of ``key`` (None when absent) and its create revision (0 when absent)."""
        answer = self.call("/v3/kv/range", {"key": b64(key)})
        kvs = answer.get("kvs") or []
        if not kvs:
            return None, 0
        return unb64(kvs[0].get("value", "")), int(kvs[0].get("create_revision", 0))

    def put(self, key: str, value: bytes, lease: int = 0) -> int:
        """Put; the revision it committed at."""
        body: dict[str, Any] = {"key": b64(key), "value": b64(value)}
        if lease:
            body["lease"] = str(lease)
        answer = self.call("/v3/kv/put", body)
        return int(answer.get("header", {}).get("revision", 0))

    def cas(self, key: str, expected: bytes | None, new: bytes) -> bool:
        """One transaction: if ``key`` holds ``expected`` (None: does not exist), put ``new``.
        True when it did."""
        if expected is None:
            compare = {"key": b64(key), "target": "VERSION", "result": "EQUAL", "version": "0"}
        else:
            compare = {
                "key": b64(key),
                "target": "VALUE",
                "result": "EQUAL",
                "value": b64(expected),
            }
        body = {
            "compare": [compare],
            "success": [{"request_put": {"key": b64(key), "value": b64(new)}}],
        }
        answer = self.call("/v3/kv/txn", body)
        return bool(answer.get("succeeded", False))

    # --- leases and locks ------------------------------------------------------------------

    def lease_grant(self, ttl: int) -> tuple[int, int]:
        """A new lease: ``(id, granted ttl)``."""
        answer = self.call("/v3/lease/grant", {"TTL": str(ttl)})
        return int(answer["ID"]), int(answer.get("TTL", ttl))

    def lease_keepalive(self, lease: int) -> int:
        """Renew; the TTL granted (0: the lease is gone)."""
        answer = self.call("/v3/lease/keepalive", {"ID": str(lease)})
        return int(answer.get("TTL", 0))

    def lease_revoke(self, lease: int) -> None:
        self.call("/v3/lease/revoke", {"ID": str(lease)})

    def lock(self, name: str, lease: int, timeout: float) -> str:
        """Wait (at most ``timeout``) for the lock ``name`` under ``lease``; its key."""
        answer = self.call("/v3/lock/lock", {"name": b64(name), "lease": str(lease)}, timeout)
        return unb64(answer["key"]).decode()

    def unlock(self, key: str) -> None:
        self.call("/v3/lock/unlock", {"key": b64(key)})


def wait_healthy(address: str, timeout: float = 1.0) -> bool:
    """Whether the etcd member at ``address`` answers ``/health`` with a leader."""
    host, _, port = address.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("GET", "/health")
        answer = json.loads(conn.getresponse().read())
    except (OSError, ValueError, http.client.HTTPException):
        return False
    finally:
        conn.close()
    return isinstance(answer, dict) and answer.get("health") == "true"
