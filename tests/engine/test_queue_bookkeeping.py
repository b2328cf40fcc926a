"""The engine keeps the wait queue's bookkeeping (issue 32): what parked transactions count
in the store budget, their pending setters, and the changes and session ends the queue
watches are changed only through the engine's methods for the queue; the queue's module
never reaches into the store."""

from __future__ import annotations

import ast
from pathlib import Path

from lockserver.engine import EngineLimits
from lockserver.engine import _waiting as waiting_module
from protocol import Assert, ErrorCode, SetVar

from ._helpers import NS, START, make_engine, run

KEY = (NS, "t", "v")


def test_reserve_bytes_counts_up_to_the_budget_and_refuses_past_it() -> None:
    """``reserve_bytes`` counts what fits exactly at ``max_store_bytes``; one byte more is
    refused with STORE_FULL and counts nothing; ``release_bytes`` gives it back."""
    engine = make_engine(limits=EngineLimits(max_store_bytes=1000))
    assert engine.reserve_bytes(600) is None
    assert engine.reserve_bytes(400) is None  # at the bound
    assert engine.stored == 1000
    refused = engine.reserve_bytes(1)  # past it
    assert refused is not None and refused.code is ErrorCode.STORE_FULL
    assert "max_store_bytes=1000" in refused.message and "1000 counted now" in refused.message
    assert engine.stored == 1000
    engine.release_bytes(400)
    engine.release_bytes(600)
    assert engine.stored == 0
    assert engine.reserve_bytes(1000) is None


def test_pending_setters_are_counted_per_session_and_leave_at_zero() -> None:
    """Each ``add_pending_setter`` counts one parked setter of a session; each
    ``remove_pending_setter`` takes one back; a session's count and then the key go at 0."""
    engine = make_engine()
    engine.add_pending_setter(KEY, "a")
    engine.add_pending_setter(KEY, "a")
    engine.add_pending_setter(KEY, "b")
    assert engine.pending_sets == {KEY: {"a": 2, "b": 1}}
    engine.remove_pending_setter(KEY, "a")
    assert engine.pending_sets == {KEY: {"a": 1, "b": 1}}
    engine.remove_pending_setter(KEY, "b")
    assert engine.pending_sets == {KEY: {"a": 1}}
    engine.remove_pending_setter(KEY, "a")
    assert engine.pending_sets == {}


def test_watching_collects_changes_and_ended_sessions_until_unwatched() -> None:
    """While watched, commits show in ``changed`` and ended sessions in ``ended_sessions``
    (taken by ``drain_changes`` / ``drain_ended``, in the order they ended);
    ``unwatch_changes`` stops both and forgets the ended sessions, not the changes."""
    engine = make_engine()
    run(engine, "a", Assert(SetVar("T", "x", 1)))
    assert not engine.changed and not engine.track_changes
    engine.watch_changes()
    assert engine.track_changes
    run(engine, "b", Assert(SetVar("T", "y", 1)))
    engine.end_session("b", now=START)
    engine.end_session("a", now=START)
    assert set(engine.changed) == {(NS, "T", "x"), (NS, "T", "y")}
    assert list(engine.ended_sessions) == ["b", "a"]
    assert engine.drain_ended() == ["b", "a"]
    assert engine.drain_ended() == [] and not engine.ended_sessions
    run(engine, "c", Assert(SetVar("T", "z", 1)))
    engine.end_session("c", now=START)
    engine.unwatch_changes()
    assert not engine.track_changes and not engine.ended_sessions
    assert engine.drain_changes() == {(NS, "T", "x"), (NS, "T", "y"), (NS, "T", "z")}
    run(engine, "d", Assert(SetVar("T", "x", 1)))
    engine.end_session("d", now=START)
    assert not engine.changed and not engine.ended_sessions


def test_clear_changes_empties_the_view_in_place() -> None:
    """``clear_changes`` forgets the changes collected without making a new set: a view
    taken before it is empty after it and shows the next change (the wait queue reads
    ``changed`` and clears it, once per pass); ``drain_changes`` then takes only what came
    after; clearing with nothing collected, or while not watching, changes nothing."""
    engine = make_engine()
    engine.clear_changes()
    assert not engine.changed
    engine.watch_changes()
    run(engine, "a", Assert(SetVar("T", "x", 1)))
    view = engine.changed
    assert set(view) == {(NS, "T", "x")}
    engine.clear_changes()
    assert not view and engine.changed is view and engine.track_changes
    run(engine, "a", Assert(SetVar("T", "y", 1)))
    assert set(view) == {(NS, "T", "y")}
    assert engine.drain_changes() == {(NS, "T", "y")}
    engine.unwatch_changes()
    engine.clear_changes()
    assert not engine.changed and not engine.track_changes


def _reaches_engine(node: ast.AST) -> bool:
    """Whether an expression is the engine or is reached through it (``engine.x``,
    ``self.engine.x[k]``, ``engine.x.y``...)."""
    while isinstance(node, ast.Attribute | ast.Subscript):
        if isinstance(node, ast.Attribute) and node.attr == "engine":
            return True
        node = node.value
    return isinstance(node, ast.Name) and node.id == "engine"


def _is_engine(node: ast.AST) -> bool:
    """``engine`` or ``self.engine`` (or ``anything.engine``) itself."""
    return (isinstance(node, ast.Name) and node.id == "engine") or (
        isinstance(node, ast.Attribute) and node.attr == "engine"
    )


def _forbidden(source: str) -> list[str]:
    """What in ``source`` changes the engine's bookkeeping itself or reaches into the store:
    a name of the store or of its mutable parts (``.store``, ``.pending_sets``, ``Store``,
    ``store_full``: so no alias of them either), a target reached through the engine
    (``engine.x = ...``, ``engine.x[k] += ...``, ``del engine.x[k]``), and any reach past
    one attribute of the engine (``engine.x.y``, ``engine.x[k]``)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in ("store", "pending_sets"):
            found.append(f"line {node.lineno}: .{node.attr}")
        if isinstance(node, ast.Name) and node.id in ("Store", "store_full"):
            found.append(f"line {node.lineno}: {node.id}")
        if isinstance(node, ast.alias) and node.name in ("Store", "store_full"):
            found.append(f"imports {node.name}")
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign | ast.Delete):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            if (
                isinstance(target, ast.Attribute | ast.Subscript)
                and not _is_engine(target)
                and _reaches_engine(target)
            ):
                found.append(f"line {target.lineno}: changes {ast.unparse(target)}")
        if isinstance(node, ast.Attribute | ast.Subscript):
            inner = node.value
            if (
                isinstance(inner, ast.Attribute | ast.Subscript)
                and not _is_engine(inner)
                and _reaches_engine(inner)
            ):
                found.append(f"line {node.lineno}: reaches into {ast.unparse(node)}")
    return found


def test_the_wait_queue_never_changes_the_engines_bookkeeping_itself() -> None:
    """``_waiting.py`` never names the store or its pending setters, never assigns, augments
    or deletes anything reached through the engine, and never goes past one attribute of the
    engine: it calls the engine's methods and reads its views (``_forbidden``)."""
    # The source beside the module (in the compiled build __file__ names the .so).
    source = (Path(waiting_module.__file__).parent / "_waiting.py").read_text(encoding="utf-8")
    assert _forbidden(source) == []


def test_the_source_check_finds_each_reach_it_forbids() -> None:
    """``_forbidden`` finds each kind of reach it names (the way ``_waiting.py`` did it
    before issue 32), and passes the engine's methods and views."""
    bad = [
        "engine.store.stored += w.cost",
        "self.engine.store.ended.clear()",
        "store = self.engine.store",
        "engine.track_changes = True",
        "del self.engine.pending_sets[key]",
        "self.engine.pending_sets[key][sid] -= 1",
        "pending = engine.pending_sets.setdefault(key, {})",
        "pending = engine.pending_sets",
        "limit = engine.limits.max_store_bytes",
        "from ._store import EngineError, store_full",
    ]
    good = [
        "refusal = engine.reserve_bytes(shape.cost)",
        "self.engine.remove_pending_setter(key, sid)",
        "if not self.engine.ended_sessions: pass",
        "for key in engine.changed: pass",
        "self.engine = engine",
        "from ._store import EngineError",
    ]
    for line in bad:
        assert _forbidden(line), line
    for line in good:
        assert _forbidden(line) == [], line
