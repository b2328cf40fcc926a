"""Configured permits (seed 003): how many may hold a read/write lock at once, per mode.

Why: seed 003 keeps permits in a database table so that every application sees the same
numbers. Here the number is an entry of the server (table ``recipes.permits.read`` /
``recipes.permits.write``, variable = the lock's name, value = the count), and every read/write
acquire asserts ``CountBelow(..., limit_table=, limit_var=)`` against it in the same
transaction: there is no cache to refresh and no window in which clients disagree.

The entry belongs to the session that set it and **lives as long as that session**: use a
long-lived administrative session (its keepalive keeps it), and set it again after that
session ended. Another session cannot overwrite it (``set_permits`` answers False) until it is
cleared or its session ends. Without an entry the defaults apply: one writer, any number of
readers (while no writer holds).

One function per operation serves both faces: given a :class:`~client.Session` it returns the
answer, given an :class:`~client.AsyncSession` an awaitable of it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

from client._async_session import AsyncSession
from client._result import Result
from client._sync_session import Session
from protocol import Statement

from ._kinds import (
    clear_permits_statements,
    get_permits_statements,
    permits_value,
    set_permits_statements,
)

__all__ = ["clear_permits", "get_permits", "set_permits"]

T = TypeVar("T")


def _run(
    session: Session | AsyncSession,
    namespace: str,
    statements: list[Statement],
    digest: Callable[[Result], T],
) -> T | Awaitable[T]:
    if isinstance(session, AsyncSession):
        asession = session

        async def run() -> T:
            return digest(await asession.execute(namespace, statements))

        return run()
    if isinstance(session, Session):
        return digest(session.execute(namespace, statements))
    raise TypeError(f"session must be a Session or an AsyncSession, got {type(session).__name__}")


def _ok(result: Result) -> bool:
    return result.ok


@overload
def set_permits(session: Session, namespace: str, lock: str, mode: str, permits: int) -> bool: ...
@overload
def set_permits(
    session: AsyncSession, namespace: str, lock: str, mode: str, permits: int
) -> Awaitable[bool]: ...
def set_permits(
    session: Session | AsyncSession, namespace: str, lock: str, mode: str, permits: int
) -> Any:
    """Let ``permits`` holders hold ``lock`` in ``mode`` (``"r"`` or ``"w"``) at once. True
    when set; False when another session's setting is in place. The setting lives as long as
    ``session``."""
    return _run(session, namespace, set_permits_statements(lock, mode, permits), _ok)


@overload
def clear_permits(session: Session, namespace: str, lock: str, mode: str) -> bool: ...
@overload
def clear_permits(
    session: AsyncSession, namespace: str, lock: str, mode: str
) -> Awaitable[bool]: ...
def clear_permits(session: Session | AsyncSession, namespace: str, lock: str, mode: str) -> Any:
    """Remove this session's permits setting (back to the default); False when it had none."""
    return _run(session, namespace, clear_permits_statements(lock, mode), _ok)


@overload
def get_permits(session: Session, namespace: str, lock: str, mode: str) -> int | None: ...
@overload
def get_permits(
    session: AsyncSession, namespace: str, lock: str, mode: str
) -> Awaitable[int | None]: ...
def get_permits(session: Session | AsyncSession, namespace: str, lock: str, mode: str) -> Any:
    """The configured permits of ``lock``/``mode``, None when the default applies."""
    return _run(session, namespace, get_permits_statements(lock, mode), permits_value)
