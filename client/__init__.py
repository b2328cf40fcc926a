"""The lock server's Python client: a sync face (:class:`LockClient`) and an async face for
trio and asyncio (:func:`open_lock_client`) over one socket-free core. See docs/client.md."""

from protocol import FALSE as FALSE
from protocol import TRUE as TRUE
from protocol import Abort as Abort
from protocol import And as And
from protocol import AnywayContinueAfter as AnywayContinueAfter
from protocol import ArrivedBelow as ArrivedBelow
from protocol import Assert as Assert
from protocol import Block as Block
from protocol import Cause as Cause
from protocol import CountBelow as CountBelow
from protocol import DeleteVar as DeleteVar
from protocol import ErrorCode as ErrorCode
from protocol import Exists as Exists
from protocol import If as If
from protocol import LockLost as LockLost
from protocol import LostReason as LostReason
from protocol import Not as Not
from protocol import Or as Or
from protocol import Pong as Pong
from protocol import SelectConstantValue as SelectConstantValue
from protocol import SelectOperatorValue as SelectOperatorValue
from protocol import SelectVarValue as SelectVarValue
from protocol import SetVar as SetVar
from protocol import Status as Status
from protocol import Waiting as Waiting
from protocol import Welcome as Welcome
from protocol import Xor as Xor

from . import recipes as recipes
from ._async import AsyncLockClient as AsyncLockClient
from ._async import open_lock_client as open_lock_client
from ._async_session import AsyncSession as AsyncSession
from ._core import ClientStatistics as ClientStatistics
from ._errors import AccessDenied as AccessDenied
from ._errors import BatchError as BatchError
from ._errors import ClientClosed as ClientClosed
from ._errors import ClientTimeout as ClientTimeout
from ._errors import ConnectionLost as ConnectionLost
from ._errors import LimitExceeded as LimitExceeded
from ._errors import LockClientError as LockClientError
from ._errors import ServerError as ServerError
from ._errors import ServerUnavailable as ServerUnavailable
from ._errors import TransportError as TransportError
from ._inspect import describe_holders as describe_holders
from ._inspect import iso_utc as iso_utc
from ._inspect import to_json as record_json
from ._result import Result as Result
from ._session_state import LostListener as LostListener
from ._sync import LockClient as LockClient
from ._sync_session import Session as Session
from .recipes import AsyncBarrier as AsyncBarrier
from .recipes import AsyncCountDownLatch as AsyncCountDownLatch
from .recipes import AsyncDoubleBarrier as AsyncDoubleBarrier
from .recipes import AsyncElection as AsyncElection
from .recipes import AsyncGroup as AsyncGroup
from .recipes import AsyncLockSet as AsyncLockSet
from .recipes import AsyncMultiLock as AsyncMultiLock
from .recipes import AsyncMutex as AsyncMutex
from .recipes import AsyncReadWriteLock as AsyncReadWriteLock
from .recipes import AsyncReentrantMutex as AsyncReentrantMutex
from .recipes import AsyncSemaphore as AsyncSemaphore
from .recipes import AsyncStateLock as AsyncStateLock
from .recipes import AsyncTimeWindowLock as AsyncTimeWindowLock
from .recipes import Barrier as Barrier
from .recipes import CountDownLatch as CountDownLatch
from .recipes import DoubleBarrier as DoubleBarrier
from .recipes import Election as Election
from .recipes import Group as Group
from .recipes import LockLostError as LockLostError
from .recipes import LockSet as LockSet
from .recipes import MultiLock as MultiLock
from .recipes import Mutex as Mutex
from .recipes import NotAcquired as NotAcquired
from .recipes import ReadWriteLock as ReadWriteLock
from .recipes import ReentrantMutex as ReentrantMutex
from .recipes import Semaphore as Semaphore
from .recipes import StateLock as StateLock
from .recipes import TimeWindowLock as TimeWindowLock
from .recipes import UnknownStamp as UnknownStamp
from .recipes import clear_permits as clear_permits
from .recipes import get_permits as get_permits
from .recipes import set_permits as set_permits

__all__ = [
    # faces
    "LockClient",
    "Session",
    "open_lock_client",
    "AsyncLockClient",
    "AsyncSession",
    # values
    "Result",
    "ClientStatistics",
    "LostListener",
    "Status",
    "Cause",
    "ErrorCode",
    "LockLost",
    "LostReason",
    "Pong",
    "Welcome",
    # the operator's records (client.holders() ...): text for people and JSON
    "describe_holders",
    "iso_utc",
    "record_json",
    # errors
    "LockClientError",
    "ServerError",
    "LimitExceeded",
    "AccessDenied",
    "TransportError",
    "ConnectionLost",
    "ServerUnavailable",
    "ClientTimeout",
    "ClientClosed",
    "BatchError",
    # lock recipes (docs/recipes.md)
    "recipes",
    "Mutex",
    "ReadWriteLock",
    "LockSet",
    "MultiLock",
    "Semaphore",
    "TimeWindowLock",
    "StateLock",
    "AsyncMutex",
    "AsyncReadWriteLock",
    "AsyncLockSet",
    "AsyncMultiLock",
    "AsyncSemaphore",
    "AsyncTimeWindowLock",
    "AsyncStateLock",
    "Election",
    "ReentrantMutex",
    "Barrier",
    "DoubleBarrier",
    "CountDownLatch",
    "Group",
    "AsyncElection",
    "AsyncReentrantMutex",
    "AsyncBarrier",
    "AsyncDoubleBarrier",
    "AsyncCountDownLatch",
    "AsyncGroup",
    "set_permits",
    "clear_permits",
    "get_permits",
    "LockLostError",
    "NotAcquired",
    "UnknownStamp",
    # transaction tree
    "Assert",
    "Abort",
    "Block",
    "If",
    "AnywayContinueAfter",
    "SelectConstantValue",
    "SelectOperatorValue",
    "SelectVarValue",
    "And",
    "Or",
    "Xor",
    "Not",
    "TRUE",
    "FALSE",
    "Exists",
    "SetVar",
    "DeleteVar",
    "CountBelow",
    "Waiting",
    "ArrivedBelow",
]
