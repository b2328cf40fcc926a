"""The fault lab: a replicated group (or etcd's own lock) on hosts made of network namespaces,
faults injected on a schedule, every operation recorded, and the whole history checked.

Importing the package starts nothing; :mod:`lockbench.faults._history` is the history format
every part reads and writes (docs in its header).
"""

from ._history import OUTCOMES as OUTCOMES
from ._history import Fault as Fault
from ._history import History as History
from ._history import HistoryWriter as HistoryWriter
from ._history import Meta as Meta
from ._history import Op as Op
from ._history import ResourceWrite as ResourceWrite
from ._history import read_history as read_history
from ._linear import KeyResult as KeyResult
from ._linear import LinearizabilityResult as LinearizabilityResult
from ._linear import Witness as Witness
from ._linear import check_register as check_register

__all__ = [
    "OUTCOMES",
    "Fault",
    "History",
    "HistoryWriter",
    "KeyResult",
    "LinearizabilityResult",
    "Meta",
    "Op",
    "ResourceWrite",
    "Witness",
    "check_register",
    "read_history",
]
