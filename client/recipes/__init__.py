"""Lock recipes: every lock kind of the seed documents, each acquired and released in one
atomic transaction, and the coordination recipes built on them (leader election, reentrant
mutex, barriers, countdown latch, group membership), with a sync face (over
:class:`~client.Session`) and an async face for trio and asyncio (over
:class:`~client.AsyncSession`). See docs/recipes.md."""

from ._async import AsyncLock as AsyncLock
from ._async import AsyncLockSet as AsyncLockSet
from ._async import AsyncMultiLock as AsyncMultiLock
from ._async import AsyncMutex as AsyncMutex
from ._async import AsyncReadLock as AsyncReadLock
from ._async import AsyncReadWriteLock as AsyncReadWriteLock
from ._async import AsyncSemaphore as AsyncSemaphore
from ._async import AsyncStateLock as AsyncStateLock
from ._async import AsyncTimeWindowLock as AsyncTimeWindowLock
from ._async import AsyncWriteLock as AsyncWriteLock
from ._async_coord import AsyncBarrier as AsyncBarrier
from ._async_coord import AsyncCountDownLatch as AsyncCountDownLatch
from ._async_coord import AsyncDoubleBarrier as AsyncDoubleBarrier
from ._async_coord import AsyncElection as AsyncElection
from ._async_coord import AsyncGroup as AsyncGroup
from ._async_coord import AsyncReentrantMutex as AsyncReentrantMutex
from ._async_coord import AsyncWatch as AsyncWatch
from ._barrier import BARRIER_OUT_TABLE as BARRIER_OUT_TABLE
from ._barrier import BARRIER_TABLE as BARRIER_TABLE
from ._base import CANCELLED_TABLE as CANCELLED_TABLE
from ._base import TOMBSTONE_LINGER as TOMBSTONE_LINGER
from ._base import LockLostError as LockLostError
from ._base import NotAcquired as NotAcquired
from ._base import UnknownStamp as UnknownStamp
from ._election import ELECTION_TABLE as ELECTION_TABLE
from ._election import ELECTION_VALUE_TABLE as ELECTION_VALUE_TABLE
from ._election import LeaderChange as LeaderChange
from ._election import LeaderInfo as LeaderInfo
from ._group import GROUP_META_TABLE as GROUP_META_TABLE
from ._group import GROUP_TABLE as GROUP_TABLE
from ._group import GroupChange as GroupChange
from ._group import Member as Member
from ._kinds import CLAIM_TABLE as CLAIM_TABLE
from ._kinds import DONE as DONE
from ._kinds import FAILED as FAILED
from ._kinds import IN_PROGRESS as IN_PROGRESS
from ._kinds import MUTEX_TABLE as MUTEX_TABLE
from ._kinds import PERMITS_TABLES as PERMITS_TABLES
from ._kinds import READ_TABLE as READ_TABLE
from ._kinds import SEMAPHORE_TABLE as SEMAPHORE_TABLE
from ._kinds import STATE_TABLE as STATE_TABLE
from ._kinds import WINDOW_TABLE as WINDOW_TABLE
from ._kinds import WRITE_TABLE as WRITE_TABLE
from ._latch import LATCH_TABLE as LATCH_TABLE
from ._permits import clear_permits as clear_permits
from ._permits import get_permits as get_permits
from ._permits import set_permits as set_permits
from ._sync import LockSet as LockSet
from ._sync import MultiLock as MultiLock
from ._sync import Mutex as Mutex
from ._sync import ReadLock as ReadLock
from ._sync import ReadWriteLock as ReadWriteLock
from ._sync import Semaphore as Semaphore
from ._sync import StateLock as StateLock
from ._sync import SyncLock as SyncLock
from ._sync import TimeWindowLock as TimeWindowLock
from ._sync import WriteLock as WriteLock
from ._sync_coord import Barrier as Barrier
from ._sync_coord import CountDownLatch as CountDownLatch
from ._sync_coord import DoubleBarrier as DoubleBarrier
from ._sync_coord import Election as Election
from ._sync_coord import Group as Group
from ._sync_coord import ReentrantMutex as ReentrantMutex

__all__ = [
    # sync face
    "Mutex",
    "ReadWriteLock",
    "ReadLock",
    "WriteLock",
    "LockSet",
    "MultiLock",
    "Semaphore",
    "TimeWindowLock",
    "StateLock",
    "SyncLock",
    "Election",
    "ReentrantMutex",
    "Barrier",
    "DoubleBarrier",
    "CountDownLatch",
    "Group",
    # async face (trio or asyncio)
    "AsyncMutex",
    "AsyncReadWriteLock",
    "AsyncReadLock",
    "AsyncWriteLock",
    "AsyncLockSet",
    "AsyncMultiLock",
    "AsyncSemaphore",
    "AsyncTimeWindowLock",
    "AsyncStateLock",
    "AsyncLock",
    "AsyncElection",
    "AsyncReentrantMutex",
    "AsyncBarrier",
    "AsyncDoubleBarrier",
    "AsyncCountDownLatch",
    "AsyncGroup",
    "AsyncWatch",
    # what the coordination recipes report
    "LeaderInfo",
    "LeaderChange",
    "Member",
    "GroupChange",
    # permits (both faces)
    "set_permits",
    "clear_permits",
    "get_permits",
    # errors
    "LockLostError",
    "NotAcquired",
    "UnknownStamp",
    # task states and tables
    "DONE",
    "FAILED",
    "IN_PROGRESS",
    "MUTEX_TABLE",
    "CANCELLED_TABLE",
    "TOMBSTONE_LINGER",
    "READ_TABLE",
    "WRITE_TABLE",
    "PERMITS_TABLES",
    "SEMAPHORE_TABLE",
    "WINDOW_TABLE",
    "CLAIM_TABLE",
    "STATE_TABLE",
    "ELECTION_TABLE",
    "ELECTION_VALUE_TABLE",
    "BARRIER_TABLE",
    "BARRIER_OUT_TABLE",
    "LATCH_TABLE",
    "GROUP_TABLE",
    "GROUP_META_TABLE",
]
