"""Linearizability of the register workload: is there one order of the operations, each taking
effect at one instant inside its own interval, that a single register per key explains?

The register workload's operations (``Op`` with ``workload="register"``): ``read`` (``value``
is what it returned, ``None`` = the key is absent), ``write`` (``value`` the value written;
``None`` deletes), ``cas`` (``value`` is ``[expected, new]``; an ``ok`` cas found ``expected``
and wrote ``new``; a cas that found another value is ``fail``). Outcomes follow Jepsen:
``ok`` took effect inside ``[invoke, complete]``; ``fail`` certainly did not take effect and
is dropped; ``unknown`` may have taken effect at any instant from ``invoke`` on, or never. An
unknown read tells nothing and is dropped.

Theory of operation (Wing & Gong's search with Lowe's just-in-time linearization, the
algorithm of Knossos' ``wgl`` checker and of porcupine; this is our own code):

- **P-compositionality.** Linearizability is local (Herlihy & Wing): a history is
  linearizable iff each key's sub-history is. Each key is checked alone.
- **The search.** The key's ``ok`` operations sit in one doubly linked list of call and
  return entries in time order (a call before a return at the same instant: touching
  intervals count as concurrent, which can only accept more). An operation can take effect
  next iff its call comes before the first return still in the list. The search walks the
  list from the head: at a call it tries the operation against the model; if the model
  accepts it and the pair (operations taken, model state) is new, it lifts the call and its
  return out of the list (dancing links), pushes the choice and starts over from the head; at
  a return (an operation that had to take effect by now did not) it first tries the unknown
  operations invoked by then, then backtracks to the latest choice and tries the next
  candidate after it. The list empty of ``ok`` operations means a linearization was found;
  unknown operations still unplaced are the ones that never took effect.
- **Unknown operations late.** Unknown operations wait in their own list, ordered by invoke,
  and are tried only once every ``ok`` candidate at that point failed: a write that timed out
  is placed as late as the history allows, which is where a later read usually needs it,
  instead of early, where it would contradict every read until then.
- **Memoization** of (operations taken, model state): a configuration seen once is never
  explored again. The set of operations taken is kept compact as ``(k, rest)``: operations
  are numbered by invoke, all below ``k`` are taken, ``rest`` is a bitset of those above, so
  the key stays small however long the history.
- **Pruning unknown operations no one could have seen** (sound and complete): an unknown
  write or cas whose written value no ``ok`` read returned and no cas expected cannot change
  the verdict (placed anywhere, only a write can follow it), so it is dropped before the
  search, repeated to a fixpoint. That keeps a partition's many timed-out writes from blowing
  up the search.
- **A bound** on the configurations explored per key and on the time spent ends the search
  in an explicit ``unknown`` verdict saying which bound was hit, never a silent pass.
- **The witness** of a violation: the longest linearizable prefix the search found (its
  length, its last operations, the register's value after it), the operation that could not
  be placed after it, and the operations that could have come first there.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final, Literal

import attrs

from ._history import Op

__all__ = [
    "DEFAULT_MAX_STATES",
    "KeyResult",
    "LinearizabilityResult",
    "Witness",
    "check_register",
    "describe_op",
]

#: Configurations (operations taken, state) explored per key before giving up with "unknown".
DEFAULT_MAX_STATES: Final = 2_000_000
#: Operations of the longest prefix and of the candidates kept in a witness.
WITNESS_OPS: Final = 8

Verdict = Literal["valid", "invalid", "unknown"]

_READ, _WRITE, _CAS = 0, 1, 2
_HEAD_TIME = float("-inf")
_CLOCK_EVERY = 1024  # search steps between two looks at the time bound


def describe_op(op: Op) -> str:
    """One op in a line: ``p3 read k1 -> 7 [12.000100, 12.004000] ok``."""
    if op.f == "read":
        what = f"read {op.key} -> {op.value!r}"
    elif op.f == "cas" and isinstance(op.value, list) and len(op.value) == 2:
        what = f"cas {op.key} {op.value[0]!r} -> {op.value[1]!r}"
    else:
        what = f"{op.f} {op.key} {op.value!r}"
    end = "..." if op.complete is None else f"{op.complete:.6f}"
    return f"{op.process or '?'} {what} [{op.invoke:.6f}, {end}] {op.outcome}"


@attrs.frozen
class Witness:
    """Why one key's history has no linearization: after the longest linearizable prefix the
    search found (``prefix_length`` operations, the last of which are ``prefix_tail``, in
    order), the register held ``state`` and ``blocker`` could not take effect before it
    returned, whichever of ``candidates`` (the operations that could still come first)
    went before it."""

    key: str
    blocker: Op
    state: Any
    prefix_length: int
    prefix_tail: tuple[Op, ...]
    candidates: tuple[Op, ...]
    explanation: str

    def to_json(self) -> dict[str, Any]:
        """As a JSON-able map (operations as their history records)."""
        return {
            "key": self.key,
            "blocker": self.blocker.to_json(),
            "state": self.state,
            "prefix_length": self.prefix_length,
            "prefix_tail": [op.to_json() for op in self.prefix_tail],
            "candidates": [op.to_json() for op in self.candidates],
            "explanation": self.explanation,
        }


@attrs.frozen
class KeyResult:
    """One key's verdict. ``ops``: the ``ok`` operations checked; ``unknown``: the unknown
    writes and cas kept; ``pruned``: those dropped as unobservable; ``dropped``: failed
    operations and unknown reads; ``states``: configurations explored; ``reason``: why the
    verdict is unknown (which bound was hit)."""

    key: str
    verdict: Verdict
    ops: int
    unknown: int
    pruned: int
    dropped: int
    states: int
    seconds: float
    witness: Witness | None = None
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        """As a JSON-able map."""
        data = attrs.asdict(self, recurse=False)
        data["witness"] = None if self.witness is None else self.witness.to_json()
        return data


@attrs.frozen
class LinearizabilityResult:
    """The register workload's verdict: ``invalid`` if any key is, else ``unknown`` if any
    key's search hit its bound, else ``valid`` (also when there was nothing to check)."""

    verdict: Verdict
    keys: tuple[KeyResult, ...]

    @property
    def ops(self) -> int:
        """Operations checked (ok, plus unknown ones kept), every key."""
        return sum(k.ops + k.unknown for k in self.keys)

    @property
    def witnesses(self) -> tuple[Witness, ...]:
        """The witness of every invalid key."""
        return tuple(k.witness for k in self.keys if k.witness is not None)


class _Interner:
    """Values to small ints (0 is absent), equal when their JSON is, and back."""

    def __init__(self) -> None:
        self.ids: dict[object, int] = {}
        self.values: list[Any] = [None]

    def __call__(self, value: Any) -> int:
        if value is None:
            return 0
        kind = type(value)
        # scalars keyed by (type, value): 1, 1.0 and True stay apart, as in JSON
        token: object = (kind, value) if kind in (int, str, float, bool) else _canonical(value)
        n = self.ids.get(token)
        if n is None:
            n = self.ids[token] = len(self.values)
            self.values.append(value)
        return n


def _encode(op: Op, intern: _Interner) -> tuple[int, int, int]:
    """(kind, a, b) for the model: read a, write a, cas a -> b (ValueError when malformed)."""
    if op.f == "read":
        return _READ, intern(op.value), 0
    if op.f == "write":
        return _WRITE, intern(op.value), 0
    if op.f == "cas":
        if not isinstance(op.value, list | tuple) or len(op.value) != 2:
            raise ValueError(f"a cas needs value [expected, new], got {describe_op(op)}")
        return _CAS, intern(op.value[0]), intern(op.value[1])
    raise ValueError(f"the register workload has read, write and cas, got {describe_op(op)}")


def _prune(unknown: list[tuple[Op, tuple[int, int, int]]], observed: set[int]) -> int:
    """Drop (in place) unknown writes/cas whose written value nothing observed; to a
    fixpoint, since a dropped cas no longer observes its expected value. Returns how many."""
    before = len(unknown)
    while True:
        seen = observed | {a for _, (kind, a, _) in unknown if kind == _CAS}
        keep = [u for u in unknown if (u[1][1] if u[1][0] == _WRITE else u[1][2]) in seen]
        if len(keep) == len(unknown):
            return before - len(unknown)
        unknown[:] = keep


class _Bound(Exception):
    """The search hit a bound (the message says which) after exploring ``states``."""

    def __init__(self, message: str, states: int) -> None:
        super().__init__(message)
        self.states = states


def _search(
    key: str,
    known: Sequence[Op],
    kcode: Sequence[tuple[int, int, int]],
    unknown: Sequence[Op],
    ucode: Sequence[tuple[int, int, int]],
    values: Sequence[Any],
    max_states: int,
    deadline: float | None,
    clock: Callable[[], float],
) -> tuple[Witness | None, int]:
    """The just-in-time search over one key (see the module header). Returns (witness or
    None when linearizable, configurations explored); raises _Bound."""
    n = len(known)
    # The known list: entry 2i is op i's call, 2i+1 its return; HEAD is the sentinel.
    order = sorted(
        [(op.invoke, 0, 2 * i) for i, op in enumerate(known)]
        + [(op.complete, 1, 2 * i + 1) for i, op in enumerate(known)]
    )
    head = 2 * n
    nxt = [-1] * (2 * n + 1)
    prv = [-1] * (2 * n + 1)
    last = head
    for _, _, e in order:
        nxt[last] = e
        prv[e] = last
        last = e
    ret_time = [0.0] * (2 * n)
    for i, op in enumerate(known):
        assert op.complete is not None
        ret_time[2 * i + 1] = op.complete
    # The unknown list, by invoke; UHEAD is its sentinel.
    m = len(unknown)
    uhead = m
    unxt = [*range(1, m), -1, 0] if m else [-1]
    uprv = [uhead, *range(m - 1), -1] if m else [-1]
    uinvoke = [op.invoke for op in unknown]

    state = 0  # the register starts absent
    k = rest = ku = restu = 0  # ops taken: all known below k plus bitset rest above; same for ku
    depth = 0  # known ops taken
    cache: set[tuple[int, int, int, int, int]] = set()
    # a choice: (entry or unknown op index, is_unknown, state, k, rest, ku, restu, bound)
    stack: list[tuple[int, bool, int, int, int, int, int, float]] = []
    best = -1
    witness: Witness | None = None
    steps = 0

    cur = nxt[head]
    ucur = -1
    bound = _HEAD_TIME
    in_unknown = False
    while True:
        steps += 1
        if deadline is not None and steps % _CLOCK_EVERY == 0 and clock() > deadline:
            raise _Bound(f"search bound hit: time limit ({len(cache):,} states)", len(cache))
        if not in_unknown:
            if cur == -1:  # cannot happen while a known op is left: its return is in the list
                return None, len(cache)
            if cur & 1 == 0:  # a call: try this op now
                i = cur >> 1
                kind, a, b = kcode[i]
                if kind == _WRITE:
                    new = a
                elif state != a:
                    cur = nxt[cur]
                    continue
                else:
                    new = state if kind == _READ else b
                j = i - k
                nrest = rest | (1 << j)
                nk = k
                if j == 0:
                    t = (nrest ^ (nrest + 1)).bit_length() - 1
                    nrest >>= t
                    nk += t
                config = (nk, nrest, ku, restu, new)
                if config in cache:
                    cur = nxt[cur]
                    continue
                cache.add(config)
                if len(cache) > max_states:
                    raise _Bound(f"search bound hit: {max_states:,} states explored", max_states)
                stack.append((cur, False, state, k, rest, ku, restu, bound))
                r = cur + 1  # lift the call and its return
                p, q = prv[cur], nxt[cur]
                nxt[p] = q
                if q != -1:
                    prv[q] = p
                p, q = prv[r], nxt[r]
                nxt[p] = q
                if q != -1:
                    prv[q] = p
                state, k, rest = new, nk, nrest
                depth += 1
                if depth == n:
                    return None, len(cache)
                cur = nxt[head]
                continue
            # a return: op (cur >> 1) had to take effect by now; try the unknown ops first
            in_unknown = True
            bound = ret_time[cur]
            ucur = unxt[uhead]
        # the unknown candidates invoked by `bound`
        if ucur != -1 and uinvoke[ucur] <= bound:
            kind, a, b = ucode[ucur]
            if kind == _CAS and state != a:
                ucur = unxt[ucur]
                continue
            new = a if kind == _WRITE else b
            j = ucur - ku
            nrestu = restu | (1 << j)
            nku = ku
            if j == 0:
                t = (nrestu ^ (nrestu + 1)).bit_length() - 1
                nrestu >>= t
                nku += t
            config = (k, rest, nku, nrestu, new)
            if config in cache:
                ucur = unxt[ucur]
                continue
            cache.add(config)
            if len(cache) > max_states:
                raise _Bound(f"search bound hit: {max_states:,} states explored", max_states)
            stack.append((ucur, True, state, k, rest, ku, restu, bound))
            p, q = uprv[ucur], unxt[ucur]
            unxt[p] = q
            if q != -1:
                uprv[q] = p
            state, ku, restu = new, nku, nrestu
            in_unknown = False
            cur = nxt[head]
            continue
        # nothing can take effect here: remember the deepest dead end, then backtrack
        if depth > best:
            best = depth
            witness = _dead_end(
                key, known, unknown, values, stack, state, nxt, head, unxt, uhead, bound
            )
        if not stack:
            assert witness is not None
            return witness, len(cache)
        e, was_unknown, state, k, rest, ku, restu, bound = stack.pop()
        if was_unknown:
            p, q = uprv[e], unxt[e]
            unxt[p] = e
            if q != -1:
                uprv[q] = e
            ucur = unxt[e]
            in_unknown = True
        else:
            r = e + 1  # unlift the return, then the call
            p, q = prv[r], nxt[r]
            nxt[p] = r
            if q != -1:
                prv[q] = r
            p, q = prv[e], nxt[e]
            nxt[p] = e
            prv[q] = e
            depth -= 1
            cur = nxt[e]
            in_unknown = False


def _dead_end(
    key: str,
    known: Sequence[Op],
    unknown: Sequence[Op],
    values: Sequence[Any],
    stack: Sequence[tuple[int, bool, int, int, int, int, int, float]],
    state: int,
    nxt: Sequence[int],
    head: int,
    unxt: Sequence[int],
    uhead: int,
    bound: float,
) -> Witness:
    """The witness of a dead end: the first return still in the list is the operation that
    could not be placed; the calls before it (and the unknown operations invoked by then)
    are the ones that could have come first. The explanation is added at the end."""
    tail = tuple(
        unknown[e] if was_unknown else known[e >> 1] for e, was_unknown, *_ in stack[-WITNESS_OPS:]
    )
    candidates: list[Op] = []
    e = nxt[head]
    while e & 1 == 0:
        if len(candidates) < WITNESS_OPS:
            candidates.append(known[e >> 1])
        e = nxt[e]
    blocker = known[e >> 1]
    candidates = [op for op in candidates if op is not blocker]
    j = unxt[uhead]  # the unknown ops not taken, invoked by then
    while j != -1 and unknown[j].invoke <= bound and len(candidates) < 2 * WITNESS_OPS:
        candidates.append(unknown[j])
        j = unxt[j]
    return Witness(
        key=key,
        blocker=blocker,
        state=values[state],
        prefix_length=len(stack),
        prefix_tail=tail,
        candidates=tuple(candidates),
        explanation="",
    )


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _explain(w: Witness, ops: Sequence[Op]) -> str:
    """Why no order works, in a sentence."""
    blocker = w.blocker
    written = {"null"}  # the register starts absent
    for op in ops:
        if op.f == "write":
            written.add(_canonical(op.value))
        elif op.f == "cas" and isinstance(op.value, list | tuple) and len(op.value) == 2:
            written.add(_canonical(op.value[1]))
    needed: Any = None
    what = ""
    if blocker.f == "read":
        needed, what = blocker.value, "returned"
    elif blocker.f == "cas" and isinstance(blocker.value, list | tuple):
        needed, what = blocker.value[0], "expected"
    if what and _canonical(needed) not in written:
        return f"{describe_op(blocker)} {what} {needed!r}, a value no operation wrote"
    last = f", the last {describe_op(w.prefix_tail[-1])}" if w.prefix_tail else ""
    others = len(w.candidates)
    order = (
        "and no other operation could come first"
        if not others
        else f"whichever of the {others} operations that could still come first goes before it"
    )
    return (
        f"after the longest linearizable prefix ({w.prefix_length} operations{last}) "
        f"{w.key!r} holds {w.state!r}; {describe_op(blocker)}"
        + (f" ({what} {needed!r})" if what else "")
        + f" cannot take effect before it returned, {order}"
    )


def check_register(
    ops: Iterable[Op],
    *,
    max_states: int = DEFAULT_MAX_STATES,
    time_limit: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> LinearizabilityResult:
    """Check the register workload's operations of ``ops`` (others are ignored), key by key.

    ``max_states`` bounds the configurations explored per key; ``time_limit`` (seconds on
    ``clock``) the whole check: a key whose search hits either is ``unknown``, and so are the
    keys not reached. ValueError names a malformed register operation."""
    if max_states < 1:
        raise ValueError(f"max_states must be >= 1, got {max_states}")
    by_key: dict[str, list[Op]] = defaultdict(list)
    for op in ops:
        if op.workload == "register":
            by_key[op.key].append(op)
    deadline = None if time_limit is None else clock() + time_limit
    results = []
    for key in sorted(by_key):
        results.append(_check_key(key, by_key[key], max_states, deadline, clock))
    verdicts = {r.verdict for r in results}
    verdict: Verdict = (
        "invalid" if "invalid" in verdicts else "unknown" if "unknown" in verdicts else "valid"
    )
    return LinearizabilityResult(verdict=verdict, keys=tuple(results))


def _check_key(
    key: str,
    ops: Sequence[Op],
    max_states: int,
    deadline: float | None,
    clock: Callable[[], float],
) -> KeyResult:
    started = clock()
    intern = _Interner()
    known: list[tuple[Op, tuple[int, int, int]]] = []
    unknown: list[tuple[Op, tuple[int, int, int]]] = []
    dropped = 0
    for op in ops:
        code = _encode(op, intern)
        if op.outcome == "ok":
            known.append((op, code))
        elif op.outcome == "unknown" and code[0] != _READ:
            unknown.append((op, code))
        else:
            dropped += 1
    observed = {a for _, (kind, a, _) in known if kind != _WRITE}
    pruned = _prune(unknown, observed)
    known.sort(key=lambda oc: oc[0].invoke)
    unknown.sort(key=lambda oc: oc[0].invoke)
    base = KeyResult(
        key=key,
        verdict="valid",
        ops=len(known),
        unknown=len(unknown),
        pruned=pruned,
        dropped=dropped,
        states=0,
        seconds=0.0,
    )
    if not known:
        return base
    if deadline is not None and clock() > deadline:
        return attrs.evolve(
            base, verdict="unknown", reason="search bound hit: time limit reached before this key"
        )
    try:
        witness, states = _search(
            key,
            [op for op, _ in known],
            [c for _, c in known],
            [op for op, _ in unknown],
            [c for _, c in unknown],
            intern.values,
            max_states,
            deadline,
            clock,
        )
    except _Bound as exc:
        return attrs.evolve(
            base, verdict="unknown", states=exc.states, seconds=clock() - started, reason=str(exc)
        )
    if witness is not None:
        witness = attrs.evolve(witness, explanation=_explain(witness, ops))
    return attrs.evolve(
        base,
        verdict="valid" if witness is None else "invalid",
        states=states,
        seconds=clock() - started,
        witness=witness,
    )
