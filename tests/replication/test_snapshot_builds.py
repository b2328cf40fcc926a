"""A snapshot is the same in the pure and the compiled build (lockserver/_build.py): one made
by either loads in the other, and the state it restores goes on exactly as the original
does. A group may mix replicas of both builds.

The other build runs in a child process that imports the hot modules from their ``.py``
files even where compiled ones are beside them; when the suite itself runs pure, both sides
are pure and this checks the snapshot's round trip across processes."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from lockserver._build import build
from lockserver.replication._group import GroupState

from .test_group_state import _script_log, comparable, replay

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.both_builds("compares a snapshot across the builds")

# The child: pure Python for the project's packages (a path hook that knows no extension
# modules, for their folders only), then the same replay as the parent's.
_CHILD = r"""
import importlib.machinery as m, pickle, sys
root, tests, cut = sys.argv[1], sys.argv[2], int(sys.argv[3])
pure = m.FileFinder.path_hook(
    (m.SourceFileLoader, m.SOURCE_SUFFIXES), (m.SourcelessFileLoader, m.BYTECODE_SUFFIXES)
)
ours = {root + "/protocol", root + "/lockserver"}
ours |= {f"{root}/lockserver/{sub}" for sub in ("engine", "shell", "http", "replication")}

def hook(path):
    if path in ours:
        return pure(path)
    raise ImportError(path)

sys.path_hooks.insert(0, hook)
sys.path_importer_cache.clear()
sys.path.insert(0, tests)
from lockserver._build import build
from lockserver.replication._group import GroupState
from replication.test_group_state import _script_log, comparable, replay

events = _script_log()
theirs = sys.stdin.buffer.read()
state, outs = replay(events, GroupState.restore(theirs), cut)
mine = replay(events[:cut])[0].snapshot()
result = (build(), comparable(outs), state.fingerprint(), mine)
sys.stdout.buffer.write(pickle.dumps(result))
"""


def test_a_snapshot_loads_in_the_other_build_and_goes_on_the_same() -> None:
    """A snapshot taken midway through a contended log by this process's build, restored by a
    pure process, applies the rest of the log with the same outputs and ends in the same
    state (fingerprint) as here; and the pure process's snapshot, restored here, does too."""
    events = _script_log()
    cut = len(events) // 2
    first, _ = replay(events[:cut])
    here, outs_here = replay(events, GroupState.restore(first.snapshot()), cut)
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, str(ROOT), str(ROOT / "tests"), str(cut)],
        input=first.snapshot(),
        capture_output=True,
        check=False,
        cwd=ROOT,
    )
    assert child.returncode == 0, child.stderr.decode()
    their_build, outs_there, fingerprint_there, their_snapshot = pickle.loads(child.stdout)
    assert their_build == "pure"
    assert outs_there == comparable(outs_here)
    assert fingerprint_there == here.fingerprint()
    back, outs_back = replay(events, GroupState.restore(their_snapshot), cut)
    assert comparable(outs_back) == comparable(outs_here)
    assert back.fingerprint() == here.fingerprint()
    assert build() in ("pure", "compiled")
