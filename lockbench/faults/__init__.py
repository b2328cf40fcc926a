"""The fault lab: a replicated group (or etcd's own lock) on hosts made of network namespaces,
faults injected on a schedule, every operation recorded, and the whole history checked.

Importing the package starts nothing; :mod:`lockbench.faults._history` is the history format
every part reads and writes (docs in its header). :func:`run_lab` runs one lab
(:class:`LabConfig`: the system, nodes, nemeses from :data:`NEMESES`, workloads with
:class:`WorkloadSettings`), as ``lockbench faults run`` does.
"""

from ._history import OUTCOMES as OUTCOMES
from ._history import Fault as Fault
from ._history import History as History
from ._history import HistoryWriter as HistoryWriter
from ._history import Meta as Meta
from ._history import Op as Op
from ._history import ResourceWrite as ResourceWrite
from ._history import read_history as read_history
from ._lab import LabConfig as LabConfig
from ._lab import LabRun as LabRun
from ._lab import run_lab as run_lab
from ._nemesis import KINDS as NEMESES
from ._workloads import WorkloadSettings as WorkloadSettings

__all__ = [
    "OUTCOMES",
    "Fault",
    "NEMESES",
    "History",
    "HistoryWriter",
    "LabConfig",
    "LabRun",
    "Meta",
    "Op",
    "ResourceWrite",
    "WorkloadSettings",
    "read_history",
    "run_lab",
]
