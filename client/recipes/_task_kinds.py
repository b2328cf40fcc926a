"""The task kinds: the lock kinds that guard one run of a task, built on ``_kinds``.

Why: ``_kinds`` holds the locks that exclude holders (mutex, read/write, sets, semaphores);
the two kinds here decide *whether a task runs*, and both read the server's clock or a
recorded outcome rather than only who holds: :class:`TimeWindowKind` (``TimeWindowLock``: at
most once per period window, table ``recipes.window``) and :class:`TaskClaimKind`
(``StateLock``: one worker claims a task, and the outcome it records, ``done`` or ``failed``,
stays for the others to read; tables ``recipes.task.claim`` and ``recipes.task.state``). The
tables and the data model's rules are written in ``_kinds``' header. Shared, unchanged, by
the sync and the async face.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from client._result import Result
from protocol import (
    AnywayContinueAfter,
    Assert,
    DeleteVar,
    SelectVarValue,
    SetVar,
    Statement,
)

from ._base import OnLost, S, seconds
from ._kinds import (
    CLAIM_TABLE,
    DONE,
    FAILED,
    FINAL_STATES,
    IN_PROGRESS,
    STATE_TABLE,
    WINDOW_TABLE,
    _KindInit,
)

__all__ = ["TaskClaimKind", "TimeWindowKind", "task_state"]


class TimeWindowKind(_KindInit[S]):
    """Acquirable once per period window ``[k*period, (k+1)*period)`` of the server's Unix
    clock: the first acquire of a window wins, the entry ends with the window by itself."""

    KIND = "time window lock"
    TTL_IS_LOSS: ClassVar[bool] = False
    RELEASE_ON_EXIT: ClassVar[bool] = False

    def __init__(
        self,
        session: S,
        namespace: str,
        name: str,
        *,
        period: float,
        on_lost: OnLost | None = None,
        min_uptime: float = 0.0,
        min_trust: float = 0.0,
        description: str = "",
    ) -> None:
        self._init(session, namespace, name, on_lost, min_uptime, min_trust, description)
        self.period = seconds("period", period, positive=True)
        self._window_ends_at: float | None = None

    @property
    def window_ends_at(self) -> float | None:
        """Server uptime (s) at which the current grant's window ends."""
        return self._window_ends_at

    def _variables(self) -> Sequence[tuple[str, str]]:
        return ((WINDOW_TABLE, self.name),)

    def _acquire_statements(self, ticket: str) -> list[Statement]:
        return [
            Assert(
                SetVar(WINDOW_TABLE, self.name, ticket, description=self._desc, period=self.period)
            ),
            SelectVarValue("grant", WINDOW_TABLE, self.name, ignore_this_session=False),
        ]

    def _on_grant(self, result: Result) -> float | None:
        record = result.get("grant")
        if not isinstance(record, dict):  # pragma: no cover - the grant selects its entry
            return None
        self._window_ends_at = record.get("expires_at")
        return self._window_ends_at

    def _on_release(self) -> None:
        self._window_ends_at = None


def task_state(claim: Any, states: Any) -> str:
    """The state of a task from its claim record and its state records: ``in_progress``
    while claimed, else the final state of the newest record (by fence), else ``done``."""
    if claim is not None:
        return IN_PROGRESS
    newest = None
    for record in states or ():
        if isinstance(record, dict) and (newest is None or record["fence"] > newest["fence"]):
            newest = record
    if newest is None or newest.get("value") not in FINAL_STATES:
        return DONE
    return str(newest["value"])


class TaskClaimKind(_KindInit[S]):
    """Seed 004's state transition: ``done``/``failed`` -> ``in_progress`` exclusively (the
    claim), released by recording a final state."""

    KIND = "task"

    def __init__(
        self,
        session: S,
        namespace: str,
        task: str,
        *,
        on_lost: OnLost | None = None,
        min_uptime: float = 0.0,
        min_trust: float = 0.0,
        description: str = "",
    ) -> None:
        self._init(session, namespace, task, on_lost, min_uptime, min_trust, description)
        self._final_state = DONE
        self._previous_state: str | None = None

    @property
    def task(self) -> str:
        """The task id (the lock's name)."""
        return self.name

    @property
    def previous_state(self) -> str | None:
        """The task's final state when the current claim was made (``done`` or
        ``failed``); None when not held."""
        return self._previous_state

    def _set_final_state(self, state: str) -> None:
        if state not in FINAL_STATES:
            raise ValueError(f"a task is released as 'done' or 'failed', got {state!r}")
        self._final_state = state

    def _prepare_exit(self, failed: bool) -> None:
        self._final_state = FAILED if failed else DONE

    def _variables(self) -> Sequence[tuple[str, str]]:
        return ((CLAIM_TABLE, self.name),)

    def _acquire_statements(self, ticket: str) -> list[Statement]:
        return [
            Assert(SetVar(CLAIM_TABLE, self.name, ticket, description=self._desc)),
            SelectVarValue(
                "states", STATE_TABLE, self.name, ignore_this_session=False, select_many=True
            ),
        ]

    def _on_grant(self, result: Result) -> float | None:
        self._previous_state = task_state(None, result.get("states"))
        return None

    def _release_statements(self, ticket: str) -> list[Statement]:
        return [
            Assert(DeleteVar(CLAIM_TABLE, self.name, ticket)),
            Assert(SetVar(STATE_TABLE, self.name, self._final_state, allow_duplicates=True)),
        ]

    def _was_released(self, result: Result) -> bool:
        return result.ok

    def _cleanup_statements(self, ticket: str) -> list[Statement]:
        return [AnywayContinueAfter(DeleteVar(CLAIM_TABLE, self.name, ticket))]

    def _on_release(self) -> None:
        self._final_state = DONE
        self._previous_state = None

    def _state_statements(self) -> list[Statement]:
        return [
            SelectVarValue("claim", CLAIM_TABLE, self.name, ignore_this_session=False),
            SelectVarValue(
                "states", STATE_TABLE, self.name, ignore_this_session=False, select_many=True
            ),
        ]
