"""The pure, synchronous, deterministic lock engine (no I/O, no clock: takes ``now``)."""

from ._engine import Engine as Engine
from ._engine import EngineLimits as EngineLimits
from ._engine import EngineStatistics as EngineStatistics
from ._eval import EngineError as EngineError
from ._eval import same_value as same_value

__all__ = ["Engine", "EngineError", "EngineLimits", "EngineStatistics", "same_value"]
