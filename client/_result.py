"""The client-side transaction result.

Why: :class:`protocol.TransactionResult` is the wire value; users want its fields under
client-friendly names plus lookup of the selected data by name. :class:`Result` is a frozen,
one-field wrapper (no copying of the data: one small object per reply on the hot path) that
keeps the wire value reachable as ``raw``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, TypeVar, overload

import attrs

from protocol import Cause, HolderInfo, Status, TransactionResult

__all__ = ["Result"]

_T = TypeVar("_T")


@attrs.frozen(repr=False)
class Result:
    """The outcome of one transaction.

    ``ok`` is True when it committed. A refused or aborted transaction is still a Result (never
    an exception): ``status`` / ``cause`` say why, ``failed_statement`` names the node that
    aborted (e.g. ``"1:/AssertOp/"``). ``data`` holds the selected ``(name, value)`` pairs in
    order (duplicates allowed, kept even when the transaction aborted); ``result[name]`` is the
    first value with that name, ``result.all(name)`` every one.
    """

    raw: TransactionResult

    @property
    def ok(self) -> bool:
        """True when the transaction committed."""
        return self.raw.status is Status.TRANSACTION_OK

    @property
    def status(self) -> Status:
        """TRANSACTION_OK, TRANSACTION_ERROR or CALL_FAILED."""
        return self.raw.status

    @property
    def cause(self) -> Cause:
        """Why it failed (UNSPECIFIED when it did not)."""
        return self.raw.cause

    @property
    def failed_statement(self) -> str | None:
        """Path of the statement that aborted, e.g. ``"0:/AssertOp/"``; None unless it did."""
        return self.raw.failed_statement

    @property
    def data(self) -> tuple[tuple[str, Any], ...]:
        """The selected ``(name, value)`` pairs, in selection order."""
        return self.raw.data

    @property
    def fence(self) -> int:
        """The fencing token: the revision this transaction committed at when it changed
        something, else the latest revision it observed. Strictly increasing per commit."""
        return self.raw.fence

    @property
    def server_uptime(self) -> float:
        """The server's uptime (seconds) when it ran the transaction."""
        return self.raw.uptime

    @property
    def server_trust(self) -> float:
        """The server's trust (0..1) when the transaction arrived."""
        return self.raw.trust

    @property
    def server_host(self) -> str:
        """The host name the server reports."""
        return self.raw.host

    @property
    def transaction_id(self) -> str:
        """The transaction id sent with the request (echoed back)."""
        return self.raw.transaction_id

    @property
    def holders(self) -> tuple[HolderInfo, ...]:
        """When a statement failed: the entries that made it fail (at most 8), each a frozen
        record with ``namespace``, ``table``, ``var``, ``session``, ``session_description``,
        ``value``, ``description``, ``acquired_at`` and ``expires_at`` (wall-clock Unix
        seconds, UTC; ``expires_at`` None without a TTL) and ``fence``. Empty otherwise."""
        return self.raw.holders

    @property
    def valid_until(self) -> float | None:
        """Server uptime until which the session lives without another call (None when the
        call was refused)."""
        return self.raw.valid_until

    def __bool__(self) -> bool:
        """Deliberately not defined as ``ok``: ``if result:`` would read too easily as "the
        call succeeded" for a lock that was not granted. Use ``result.ok``."""
        raise TypeError("a Result has no truth value; test result.ok")

    def __getitem__(self, name: str) -> Any:
        """The first selected value named ``name``; KeyError if none."""
        for key, value in self.raw.data:
            if key == name:
                return value
        raise KeyError(name)

    def __contains__(self, name: object) -> bool:
        """True when some selected value is named ``name``."""
        return any(key == name for key, _ in self.raw.data)

    @overload
    def get(self, name: str) -> Any | None: ...
    @overload
    def get(self, name: str, default: _T) -> Any | _T: ...
    def get(self, name: str, default: Any = None) -> Any:
        """The first selected value named ``name``, else ``default``."""
        for key, value in self.raw.data:
            if key == name:
                return value
        return default

    def all(self, name: str) -> list[Any]:
        """Every selected value named ``name``, in order (empty list if none)."""
        return [value for key, value in self.raw.data if key == name]

    def names(self) -> Iterator[str]:
        """The selected names in order (with duplicates)."""
        return (key for key, _ in self.raw.data)

    def __repr__(self) -> str:
        r = self.raw
        parts = [f"{r.status.name}"]
        if r.cause is not Cause.UNSPECIFIED:
            parts.append(f"cause={r.cause.name}")
        if r.failed_statement is not None:
            parts.append(f"failed={r.failed_statement!r}")
        parts.append(f"fence={r.fence}")
        if r.data:
            parts.append(f"data={list(r.data)!r}")
        if r.holders:
            parts.append(f"holders={[h.session for h in r.holders]!r}")
        return f"<Result {' '.join(parts)}>"
