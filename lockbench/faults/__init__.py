"""The fault lab: a replicated group (or etcd's own lock) on hosts made of network namespaces,
faults injected on a schedule, every operation recorded, and the whole history checked.

Importing the package starts nothing; :mod:`lockbench.faults._history` is the history format
every part reads and writes (docs in its header). :func:`run_lab` runs one lab
(:class:`LabConfig`: the system, nodes, nemeses from :data:`NEMESES`, workloads with
:class:`WorkloadSettings`), as ``lockbench faults run`` does. The checkers read a history and
judge it: :func:`check` (the :class:`Verdict`: linearizability of the register workload, the
lock rules, availability), :func:`write_report` (summary, timeline, verdict as JSON lines)
and :func:`check_main` (the body of ``lockbench faults check``).
"""

from ._availability import AvailabilityResult as AvailabilityResult
from ._availability import Counts as Counts
from ._availability import FaultWindow as FaultWindow
from ._availability import Recovery as Recovery
from ._check_cli import check_main as check_main
from ._findings import Finding as Finding
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
from ._linear import KeyResult as KeyResult
from ._linear import LinearizabilityResult as LinearizabilityResult
from ._linear import Witness as Witness
from ._linear import check_register as check_register
from ._locks import GUARANTEE_FIELD as GUARANTEE_FIELD
from ._locks import LockResult as LockResult
from ._nemesis import KINDS as NEMESES
from ._report import ReportFiles as ReportFiles
from ._report import write_report as write_report
from ._verdict import CheckerResult as CheckerResult
from ._verdict import Verdict as Verdict
from ._verdict import check as check
from ._workloads import WorkloadSettings as WorkloadSettings

__all__ = [
    "GUARANTEE_FIELD",
    "NEMESES",
    "OUTCOMES",
    "AvailabilityResult",
    "CheckerResult",
    "Counts",
    "Fault",
    "FaultWindow",
    "Finding",
    "History",
    "HistoryWriter",
    "KeyResult",
    "LabConfig",
    "LabRun",
    "LinearizabilityResult",
    "LockResult",
    "Meta",
    "Op",
    "Recovery",
    "ReportFiles",
    "ResourceWrite",
    "Verdict",
    "Witness",
    "WorkloadSettings",
    "check",
    "check_main",
    "check_register",
    "read_history",
    "run_lab",
    "write_report",
]
