"""The lab's workloads against real servers on loopback (no namespaces): each records what it
did as the history format says, the register's transactions behave as a register, a grant's
guarantee and fence are recorded, critical sections write to the fenced resource, and the
same workloads run against etcd's lock and KV."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import ThreadedServer

from client import LockClient
from lockbench.etcd import ETCD, SKIP_REASON, EtcdCluster, started
from lockbench.faults import History, HistoryWriter, Op, read_history
from lockbench.faults._resource import FencedResource
from lockbench.faults._workloads import (
    REGISTER_SESSION,
    REGISTER_TABLE,
    Context,
    WorkloadSettings,
    start_threads,
)
from lockbench.safety import check

FAST = WorkloadSettings(hold_max=0.02, long_hold=0.05, think_max=0.01, register_think=0.002)


def _run(
    tmp_path: Path,
    system: str,
    workloads: dict[str, int],
    *,
    servers: list[str] = (),  # type: ignore[assignment]
    etcd: list[str] = (),  # type: ignore[assignment]
    seconds: float = 1.5,
    settings: WorkloadSettings = FAST,
) -> History:
    """Run ``workloads`` for ``seconds`` of lab time and read back the history."""
    path = tmp_path / "history.jsonl"
    origin = time.monotonic()
    errors: list[str] = []
    with HistoryWriter(path) as writer:
        resource = FencedResource(
            "127.0.0.1", lambda: time.monotonic() - origin, writer.write
        ).start()
        try:
            ctx = Context(
                system=system,
                name="c1",
                servers=list(servers),
                etcd=list(etcd),
                resource=resource.address,
                origin=origin,
                stop_at=seconds,
                seed=5,
                writer=writer,
                settings=settings,
            )
            threads = start_threads(ctx, workloads, errors)
            for t in threads:
                t.join(timeout=seconds + 20)
            assert not any(t.is_alive() for t in threads)
        finally:
            resource.close()
    assert errors == []
    return read_history(path)


def _replay_register(ops: list[Op]) -> None:
    """One process's register operations, replayed in order through a dict: every ok read
    saw the model's value, every cas was ok exactly when the model held its expected value,
    every write was ok."""
    model: dict[str, object] = {}
    for op in sorted(ops, key=lambda o: o.invoke):
        assert op.outcome == "ok" or (op.f == "cas" and op.outcome == "fail"), op
        if op.f == "read":
            assert op.value == model.get(op.key), op
        elif op.f == "write":
            model[op.key] = op.value
        else:
            expected, new = op.value
            assert (op.outcome == "ok") == (model.get(op.key) == expected), op
            if op.outcome == "ok":
                model[op.key] = new


@pytest.fixture
def lockserver(threaded_server: ThreadedServer) -> list[str]:  # type: ignore[type-arg]
    return [f"127.0.0.1:{threaded_server.port}"]


def test_register_transactions_behave_as_registers(tmp_path: Path, lockserver: list[str]) -> None:
    """One register thread (a sequential history): reads, writes and compare-and-sets, each
    one transaction, replay exactly through a model; a cas that found another value is
    'fail' and says which statement aborted."""
    history = _run(tmp_path, "lockserver", {"register": 1}, servers=lockserver)
    ops = [o for o in history.ops if o.workload == "register"]
    assert len(ops) > 50
    assert {o.f for o in ops} == {"read", "write", "cas"}
    assert {o.process for o in ops} == {"c1-register0"}
    _replay_register(ops)
    failed = [o for o in ops if o.outcome == "fail"]
    assert failed and all(o.error == "STATEMENT at 0:/AssertOp/" for o in failed)
    assert all(o.node == lockserver[0] for o in ops)


def test_the_registers_outlive_their_writers(tmp_path: Path, lockserver: list[str]) -> None:
    """The workers close their clients without ending the shared register session: the last
    values written are still there for the next reader."""
    history = _run(tmp_path, "lockserver", {"register": 2}, servers=lockserver, seconds=0.5)
    written = {o.key for o in history.ops if o.f == "write" and o.outcome == "ok"}
    assert written
    host, port = lockserver[0].split(":")
    with LockClient(host, int(port)) as c:
        s = c.session(session_id=REGISTER_SESSION, keepalive=False)
        from client import SelectVarValue

        r = s.execute(
            "lab",
            [SelectVarValue("v", REGISTER_TABLE, k, ignore_this_session=False) for k in written],
        )
        assert all(v is not None for _, v in r.data)


def test_register_keys_change_with_the_period(tmp_path: Path, lockserver: list[str]) -> None:
    """Every key_period seconds the workload moves to fresh registers (``r<period>.<k>``),
    ``keys`` at a time, so no key's history grows without bound."""
    settings = WorkloadSettings(register_think=0.002, key_period=0.4, keys=2)
    # 3 s is 7 periods, of which 3 must see an operation: a loaded machine (the suite on parallel
    # workers) can stall the worker for a period or two; 1.5 s (4 periods) failed so.
    history = _run(
        tmp_path, "lockserver", {"register": 1}, servers=lockserver, seconds=3.0, settings=settings
    )
    keys = {o.key for o in history.ops}
    periods = {k.split(".")[0] for k in keys}
    assert len(periods) >= 3
    assert {k.split(".")[1] for k in keys} == {"0", "1"}
    for o in history.ops:
        assert o.key.startswith(f"r{int(o.invoke // 0.4)}.")


def test_lock_workloads_record_grants_holds_and_resource_writes(
    tmp_path: Path, lockserver: list[str]
) -> None:
    """Mutexes, readers-writer locks and the semaphore: every granted acquire carries its
    fence and the holder's guarantee (after its completion, at most a session max age
    later); the critical sections obey the lock rules; exclusive holders write to the
    resource twice with their grant's fence, and nothing was refused on one server."""
    history = _run(
        tmp_path,
        "lockserver",
        {"mutex": 2, "rw": 3, "semaphore": 3},
        servers=lockserver,
        seconds=2.0,
    )
    acquires = [o for o in history.ops if o.f == "acquire"]
    granted = [o for o in acquires if o.outcome == "ok"]
    assert {o.workload for o in granted} == {"mutex", "rw", "semaphore"}
    for o in granted:
        assert o.fence is not None
        assert o.complete is not None
        assert o.complete < o.value["valid_until"] <= o.complete + FAST.max_age
    releases = [o for o in history.ops if o.f == "release"]
    assert releases and all(o.outcome == "ok" for o in releases)
    report = check(history.holds)
    report.assert_ok()
    assert {i.mode for i in history.holds} == {"w", "r", "s"}
    assert all(i.capacity == FAST.permits for i in history.holds if i.mode == "s")
    exclusive = [i for i in history.holds if i.mode == "w"]
    writes_by_fence: dict[int | None, list[str]] = {}
    for w in history.writes:
        writes_by_fence.setdefault(w.fence, []).append(w.holder)
    for i in exclusive:
        assert writes_by_fence[i.fence] == [i.holder, i.holder]
    assert all(w.accepted for w in history.writes)
    assert len(history.writes) == 2 * len(exclusive)


def test_operations_in_flight_at_the_stop_are_recorded_unknown(tmp_path: Path) -> None:
    """An operation sent but not answered when the worker stops is written 'unknown' with no
    completion: it may still take effect, and the checkers must know it was sent."""
    path = tmp_path / "h.jsonl"
    with HistoryWriter(path) as writer:
        ctx = Context(
            system="lockserver",
            name="c1",
            servers=[],
            etcd=[],
            resource=("127.0.0.1", 1),
            origin=time.monotonic(),
            stop_at=10,
            seed=1,
            writer=writer,
            settings=FAST,
        )
        op = Op("c1-register0", "register", "write", "r0", 3, ctx.now(), None, "unknown")
        done = threading.Event()

        def other_thread() -> None:
            ctx.begin(op)
            done.set()

        t = threading.Thread(target=other_thread)
        t.start()
        t.join()
        assert done.is_set()
        assert ctx.flush_inflight("stopped") == 1
        assert ctx.flush_inflight("stopped") == 0
    (recorded,) = read_history(path).ops
    assert (recorded.outcome, recorded.complete, recorded.error) == ("unknown", None, "stopped")
    assert recorded.value == 3


@pytest.fixture(scope="module")
def etcd_member(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    if ETCD is None:
        pytest.skip(SKIP_REASON)
    yield from started(tmp_path_factory.mktemp("etcd"), 1)


def test_etcd_register_and_lock_workloads(tmp_path: Path, etcd_member: EtcdCluster) -> None:
    """The reference workloads: the register over etcd's KV replays through the model (one
    thread), and etcd's lock grants carry the lock key's create revision as the fence,
    increasing grant after grant, with the lease's deadline as the guarantee."""
    history = _run(
        tmp_path,
        "etcd",
        {"register": 1, "mutex": 2},
        etcd=etcd_member.endpoints,
        settings=WorkloadSettings(
            hold_max=0.02, long_hold=0.05, think_max=0.01, register_think=0.002, max_age=3
        ),
    )
    register = [o for o in history.ops if o.workload == "register"]
    assert len(register) > 20
    _replay_register(register)
    granted = [o for o in history.ops if o.f == "acquire" and o.outcome == "ok"]
    assert len(granted) > 5
    for o in granted:
        assert o.fence is not None and o.fence > 0
        assert o.complete is not None
        assert o.complete < o.value["valid_until"] <= o.complete + 3
    check(history.holds).assert_ok()
    for lock in ("m0", "m1"):
        fences = [i.fence for i in sorted(history.holds, key=lambda i: i.start) if i.lock == lock]
        assert fences == sorted(fences)
    assert all(w.accepted for w in history.writes)
    assert all(o.outcome == "ok" for o in history.ops if o.f == "release")
