"""The async face's per-request parking (client/_loops.py) on each loop: a resolved slot wakes
its caller with the value or the error; a caller cancelled first abandons its request exactly
once; under asyncio, a cancellation that lands after the reply leaves the slot resolved and
abandons nothing (the face counts that reply as dropped)."""

from __future__ import annotations

import asyncio

import pytest
import trio
import trio.testing

from client._loops import FutureSlot, Slot, TrioSlot, hooks_for_running_loop


async def test_trio_slot_wakes_its_caller_or_abandons_when_cancelled() -> None:
    """Under trio: the reader's resolve wakes the parked caller; a cancelled caller's
    abort calls abandon once and the slot stays unresolved."""
    assert hooks_for_running_loop().slot is TrioSlot
    abandoned: list[str] = []
    slot = TrioSlot()
    async with trio.open_nursery() as nursery:

        async def waiter() -> None:
            await slot.wait(lambda: abandoned.append("x"))
            assert slot.unwrap() == 42

        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        slot.resolve(42, None)
    assert abandoned == [] and slot.done

    failing = TrioSlot()
    failing.resolve(None, KeyError("k"))
    with pytest.raises(KeyError):
        failing.unwrap()

    cancelled = TrioSlot()
    with trio.CancelScope() as scope:
        scope.cancel()
        await cancelled.wait(lambda: abandoned.append("cancelled"))
    assert scope.cancelled_caught and abandoned == ["cancelled"] and not cancelled.done


def test_future_slot_wakes_abandons_and_survives_a_late_cancellation() -> None:
    """Under asyncio: resolve wakes the waiter; a waiter cancelled before any reply
    abandons; a waiter cancelled after its reply was set does not abandon (the slot is
    resolved, the caller sees the cancellation)."""

    async def main() -> None:
        assert hooks_for_running_loop().slot is FutureSlot
        abandoned: list[str] = []

        slot = FutureSlot()
        task = asyncio.create_task(slot.wait(lambda: abandoned.append("woken")))
        await asyncio.sleep(0)  # the task parks on its future
        slot.resolve("v", None)
        await task
        assert slot.unwrap() == "v" and abandoned == []

        early = FutureSlot()
        task = asyncio.create_task(early.wait(lambda: abandoned.append("early")))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert abandoned == ["early"] and not early.done

        late = FutureSlot()
        task = asyncio.create_task(late.wait(lambda: abandoned.append("late")))
        await asyncio.sleep(0)
        late.resolve("reply", None)  # the reply is set ...
        task.cancel()  # ... and the caller is cancelled in the same loop iteration
        with pytest.raises(asyncio.CancelledError):
            await task
        assert late.done and late.unwrap() == "reply" and abandoned == ["early"]

    asyncio.run(main())


def test_a_plain_slot_has_no_way_to_wait() -> None:
    """The base class only holds the resolution; the loops' subclasses wait and wake."""
    slot = Slot()
    assert (slot.done, slot.unwrap()) == (False, None)
    with pytest.raises(NotImplementedError):
        slot.resolve(1, None)
