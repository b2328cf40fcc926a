"""The pure, synchronous, deterministic lock engine (no I/O, no clock: takes ``now``), and
``LockCore``, the one door every change of lock state goes through."""

from ._core import BusyTable as BusyTable
from ._core import CoreStatistics as CoreStatistics
from ._core import Listed as Listed
from ._core import LockCore as LockCore
from ._core import Output as Output
from ._core import SessionsListing as SessionsListing
from ._core import Visibility as Visibility
from ._core import VisibleCounts as VisibleCounts
from ._door import Door as Door
from ._engine import Engine as Engine
from ._engine import EngineLimits as EngineLimits
from ._engine import EngineStatistics as EngineStatistics
from ._eval import same_value as same_value
from ._sharded import ShardedDict as ShardedDict
from ._store import BigTable as BigTable
from ._store import EngineError as EngineError
from ._waiting import WaitLimits as WaitLimits
from ._waiting import WaitQueue as WaitQueue
from ._waiting import WaitStatistics as WaitStatistics
from ._waiting import dependencies as dependencies

__all__ = [
    "SessionsListing",
    "Visibility",
    "VisibleCounts",
    "BigTable",
    "BusyTable",
    "CoreStatistics",
    "Door",
    "Engine",
    "EngineError",
    "EngineLimits",
    "EngineStatistics",
    "Listed",
    "LockCore",
    "Output",
    "ShardedDict",
    "WaitLimits",
    "WaitQueue",
    "WaitStatistics",
    "dependencies",
    "same_value",
]
