"""The transaction tree vocabulary: immutable statement and operator nodes.

Why: a transaction is an expression tree (SEMANTICS.md). Nodes are frozen attrs classes that
validate their arguments at construction, so a malformed tree is refused where it is built
(by a user, or by the decoder from the wire) with a message naming what is wrong; the engine can
then evaluate without re-checking anything.

Two kinds of node:
- *operators* evaluate to a bool: And, Or, Xor, Not, TRUE, FALSE, Exists, SetVar, DeleteVar
  (SetVar and DeleteVar are the *change* operators), and the extensions CountBelow, Waiting
  and ArrivedBelow;
- *statements* are what a transaction executes: Assert, Abort, Block, If, AnywayContinueAfter,
  SelectConstantValue, SelectOperatorValue, SelectVarValue.
A transaction's top level holds statements only; an operator must be wrapped.

``PATH_NAME`` is the node's name in a failed-statement path ("AssertOp"...), ``WIRE_NAME`` its op
name on the wire (PROTOCOL.md). Class and argument names follow the client API of the issue.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import attrs

__all__ = [
    "Node",
    "Operator",
    "Statement",
    "ChangeOperator",
    "Assert",
    "Abort",
    "Block",
    "If",
    "AnywayContinueAfter",
    "SelectConstantValue",
    "SelectOperatorValue",
    "SelectVarValue",
    "And",
    "Or",
    "Xor",
    "Not",
    "TrueOp",
    "FalseOp",
    "TRUE",
    "FALSE",
    "Exists",
    "CountBelow",
    "Waiting",
    "ArrivedBelow",
    "SetVar",
    "DeleteVar",
    "check_value",
    "value_size",
    "MAX_VALUE_DEPTH",
    "MIN_SECONDS",
    "ELEMENT_SIZE",
]

MAX_VALUE_DEPTH = 32  # nesting bound for user values carried in a tree
#: The shortest duration a request may give, in seconds (a session's max age, an entry's ttl
#: or period): below it the arithmetic on the server's clock means nothing (a period of
#: 1e-300 s makes the window index infinite).
MIN_SECONDS = 0.001
#: What one element of a user value counts in its size (see ``value_size``): about what the
#: server stores per element (a small dict is 64 bytes, a list 56, a float 24), so a value's
#: size follows its memory, not its wire length (an empty map is 1 byte on the wire).
ELEMENT_SIZE = 32
_INT_MIN = -(2**63)
_INT_MAX = 2**64 - 1


class Node:
    """Base of every tree node."""

    __slots__ = ()
    PATH_NAME: ClassVar[str]
    WIRE_NAME: ClassVar[str]


class Operator(Node):
    """A node that evaluates to a bool."""

    __slots__ = ()


class ChangeOperator(Operator):
    """An operator that changes data (SetVar, DeleteVar); true when the change happened."""

    __slots__ = ()


class Statement(Node):
    """A node a transaction executes; only Assert, Abort and SelectVarValue can abort."""

    __slots__ = ()


def check_value(value: Any, what: str = "value", _depth: int = 0) -> None:
    """Raise ValueError unless ``value`` is a msgpack-representable user value.

    Accepted: None, bool, int (64-bit range), finite or infinite float, str, bytes, and lists,
    tuples and str-keyed dicts of those, nested at most MAX_VALUE_DEPTH deep.
    """
    t = type(value)
    if value is None or t is bool or t is str or t is float or t is bytes:
        return
    if t is int:
        if not _INT_MIN <= value <= _INT_MAX:
            raise ValueError(f"{what}: integer {value} does not fit in 64 bits")
        return
    if _depth >= MAX_VALUE_DEPTH:
        raise ValueError(f"{what}: nested deeper than {MAX_VALUE_DEPTH} levels")
    if t is list or t is tuple:
        for i, item in enumerate(value):
            check_value(item, f"{what}[{i}]", _depth + 1)
        return
    if t is dict:
        for k, v in value.items():
            if type(k) is not str:
                raise ValueError(f"{what}: map keys must be strings, got {type(k).__name__}")
            check_value(v, f"{what}[{k!r}]", _depth + 1)
        return
    raise ValueError(
        f"{what}: {t.__name__} is not a wire value (use None, bool, int, "
        "float, str, bytes, list or dict)"
    )


def value_size(value: Any, limit: int | None = None) -> int:
    """The size a user value counts as (its limit is the server's ``max_value``): ELEMENT_SIZE
    (32) for every element (nil, bool, number, string, binary, array, map, and every map
    key), plus the UTF-8 length of every string and the length of every binary. With
    ``limit``, counting stops as soon as the size passes it (the result is then some number
    above ``limit``): a hostile value costs at most ``limit`` / 32 steps."""
    t = type(value)
    if t is str:
        return ELEMENT_SIZE + (len(value) if value.isascii() else _utf8_len(value))
    if t is bytes:
        return ELEMENT_SIZE + len(value)
    if t is not list and t is not tuple and t is not dict:
        return ELEMENT_SIZE
    bound = -1 if limit is None else limit
    size = 0
    stack: list[Any] = [value]
    while stack:
        v = stack.pop()
        t = type(v)
        size += ELEMENT_SIZE
        if t is str:
            size += len(v) if v.isascii() else _utf8_len(v)
        elif t is bytes:
            size += len(v)
        elif t is list or t is tuple:
            stack.extend(v)
        elif t is dict:
            for k, item in v.items():
                size += ELEMENT_SIZE + (
                    len(k) if type(k) is not str or k.isascii() else _utf8_len(k)
                )
                stack.append(item)
        if size > bound >= 0:
            return size
    return size


def _utf8_len(s: str) -> int:
    return len(s.encode("utf-8", "surrogatepass"))


# --- validators -------------------------------------------------------------------------------


def _name(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) is not str:
        raise TypeError(
            f"{type(inst).__name__}.{attribute.name} must be a str, got {type(value).__name__}"
        )
    if not value.strip():
        raise ValueError(f"{type(inst).__name__}.{attribute.name} must not be blank")


def _opt_str(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and type(value) is not str:
        raise TypeError(
            f"{type(inst).__name__}.{attribute.name} must be a str or None, "
            f"got {type(value).__name__}"
        )


def _flag(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) is not bool:
        raise TypeError(
            f"{type(inst).__name__}.{attribute.name} must be a bool, got {type(value).__name__}"
        )


def _user_value(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    check_value(value, f"{type(inst).__name__}.{attribute.name}")


def _operator(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, Operator):
        raise TypeError(
            f"{type(inst).__name__}.{attribute.name} must be an operator "
            f"(And, Or, Xor, Not, TRUE, FALSE, Exists, SetVar, DeleteVar), "
            f"got {_kind(value)}"
        )


def _statement(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, Statement):
        raise TypeError(
            f"{type(inst).__name__}.{attribute.name} must be a statement "
            f"(Assert, Abort, Block, If, AnywayContinueAfter, Select*), "
            f"got {_kind(value)}{_wrap_hint(value)}"
        )


def _opt_statement(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None:
        _statement(inst, attribute, value)


def _change(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, ChangeOperator):
        raise TypeError(
            f"{type(inst).__name__}.{attribute.name} must be SetVar or DeleteVar, "
            f"got {_kind(value)}"
        )


def _ttl(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is None:
        return
    if type(value) not in (int, float):
        # The type name only: repr() of a received value may be huge or nested too deeply.
        raise ValueError(
            f"{type(inst).__name__}.{attribute.name} must be a finite number of seconds "
            f">= {MIN_SECONDS:g} or None, got {type(value).__name__}"
        )
    if not math.isfinite(value) or value < MIN_SECONDS:
        raise ValueError(
            f"{type(inst).__name__}.{attribute.name} must be a finite number of seconds "
            f">= {MIN_SECONDS:g} or None, got {value!r}"
        )


def _kind(value: object) -> str:
    if isinstance(value, Operator):
        return f"operator {type(value).__name__}"
    if isinstance(value, Statement):
        return f"statement {type(value).__name__}"
    return type(value).__name__


def _wrap_hint(value: object) -> str:
    if isinstance(value, ChangeOperator):
        return " (wrap it in Assert, If, SelectOperatorValue or AnywayContinueAfter)"
    if isinstance(value, Operator):
        return " (wrap it in Assert, If or SelectOperatorValue)"
    return ""


def _block_items(inst: Block, attribute: attrs.Attribute[Any], value: tuple[Any, ...]) -> None:
    if not value:
        raise ValueError("Block needs at least one statement")
    for i, item in enumerate(value):
        if not isinstance(item, Statement):
            raise TypeError(
                f"Block.statements[{i}] must be a statement, got {_kind(item)}{_wrap_hint(item)}"
            )


# --- statements -------------------------------------------------------------------------------


@attrs.frozen
class Assert(Statement):
    """Abort the transaction (with this node's path) when ``condition`` is false."""

    PATH_NAME: ClassVar[str] = "AssertOp"
    WIRE_NAME: ClassVar[str] = "Assert"
    condition: Operator = attrs.field(validator=_operator)


@attrs.frozen
class Abort(Statement):
    """Always abort the transaction."""

    PATH_NAME: ClassVar[str] = "AbortOp"
    WIRE_NAME: ClassVar[str] = "Abort"


@attrs.frozen(init=False)
class Block(Statement):
    """Run statements in order; stop at the first abort. ``Block(s1, s2, ...)``."""

    PATH_NAME: ClassVar[str] = "BlockOp"
    WIRE_NAME: ClassVar[str] = "Block"
    statements: tuple[Statement, ...] = attrs.field(validator=_block_items)

    def __init__(self, *statements: Statement) -> None:
        self.__attrs_init__(tuple(statements))


@attrs.frozen
class If(Statement):
    """Run ``then`` when ``condition`` is true, else ``else_`` (if any). The condition may be a
    change operator (try-lock and branch)."""

    PATH_NAME: ClassVar[str] = "IfOp"
    WIRE_NAME: ClassVar[str] = "If"
    condition: Operator = attrs.field(validator=_operator)
    then: Statement = attrs.field(validator=_statement)
    else_: Statement | None = attrs.field(default=None, validator=_opt_statement)


@attrs.frozen
class AnywayContinueAfter(Statement):
    """Run a change (SetVar / DeleteVar) and ignore its result."""

    PATH_NAME: ClassVar[str] = "AnywayContinueAfterOp"
    WIRE_NAME: ClassVar[str] = "AnywayContinueAfter"
    change: ChangeOperator = attrs.field(validator=_change)
    reset_abort: bool = attrs.field(default=False, kw_only=True, validator=_flag)


@attrs.frozen
class SelectConstantValue(Statement):
    """Append ``(into, value)`` to the result data."""

    PATH_NAME: ClassVar[str] = "SelectConstantValueOp"
    WIRE_NAME: ClassVar[str] = "SelectConstantValue"
    into: str = attrs.field(validator=_name)
    value: Any = attrs.field(default=None, validator=_user_value)


@attrs.frozen
class SelectOperatorValue(Statement):
    """Evaluate ``operator`` and append ``(into, bool)`` to the result data."""

    PATH_NAME: ClassVar[str] = "SelectOperatorValueOp"
    WIRE_NAME: ClassVar[str] = "SelectOperatorValue"
    into: str = attrs.field(validator=_name)
    operator: Operator = attrs.field(validator=_operator)


@attrs.frozen
class SelectVarValue(Statement):
    """Append ``(into, record)``: the first matching entry record, a list of them
    (``select_many``), or None when nothing matches; abort instead when
    ``abort_if_not_found``."""

    PATH_NAME: ClassVar[str] = "SelectVarValueOp"
    WIRE_NAME: ClassVar[str] = "SelectVarValue"
    into: str = attrs.field(validator=_name)
    table: str = attrs.field(validator=_name)
    var: str = attrs.field(validator=_name)
    ignore_this_session: bool = attrs.field(default=True, kw_only=True, validator=_flag)
    abort_if_not_found: bool = attrs.field(default=False, kw_only=True, validator=_flag)
    select_many: bool = attrs.field(default=False, kw_only=True, validator=_flag)


# --- operators --------------------------------------------------------------------------------


@attrs.frozen
class And(Operator):
    """Both sides are always evaluated, left first (no short-circuit)."""

    PATH_NAME: ClassVar[str] = "AndOp"
    WIRE_NAME: ClassVar[str] = "And"
    left: Operator = attrs.field(validator=_operator)
    right: Operator = attrs.field(validator=_operator)


@attrs.frozen
class Or(Operator):
    """Both sides are always evaluated, left first (no short-circuit)."""

    PATH_NAME: ClassVar[str] = "OrOp"
    WIRE_NAME: ClassVar[str] = "Or"
    left: Operator = attrs.field(validator=_operator)
    right: Operator = attrs.field(validator=_operator)


@attrs.frozen
class Xor(Operator):
    """Both sides are always evaluated, left first."""

    PATH_NAME: ClassVar[str] = "XorOp"
    WIRE_NAME: ClassVar[str] = "Xor"
    left: Operator = attrs.field(validator=_operator)
    right: Operator = attrs.field(validator=_operator)


@attrs.frozen
class Not(Operator):
    """Logical negation."""

    PATH_NAME: ClassVar[str] = "NotOp"
    WIRE_NAME: ClassVar[str] = "Not"
    operand: Operator = attrs.field(validator=_operator)


@attrs.frozen
class TrueOp(Operator):
    """Constant true; use the ``TRUE`` instance."""

    PATH_NAME: ClassVar[str] = "TrueOp"
    WIRE_NAME: ClassVar[str] = "True"


@attrs.frozen
class FalseOp(Operator):
    """Constant false; use the ``FALSE`` instance."""

    PATH_NAME: ClassVar[str] = "FalseOp"
    WIRE_NAME: ClassVar[str] = "False"


TRUE = TrueOp()
FALSE = FalseOp()


@attrs.frozen
class Exists(Operator):
    """True when an entry of ``table``/``var`` exists (with ``value`` equal, when given).
    By default the caller's own entries are ignored."""

    PATH_NAME: ClassVar[str] = "ExistsOp"
    WIRE_NAME: ClassVar[str] = "Exists"
    table: str = attrs.field(validator=_name)
    var: str = attrs.field(validator=_name)
    value: Any = attrs.field(default=None, validator=_user_value)
    ignore_this_session: bool = attrs.field(default=True, kw_only=True, validator=_flag)


@attrs.frozen
class SetVar(ChangeOperator):
    """Exclusive (default): succeeds only when no entry exists at all, the caller's own
    included. ``allow_duplicates``: replaces the caller's entry in place or appends one.
    ``ttl`` (seconds) makes the entry expire by itself. ``period`` (seconds; extension) makes
    it expire at the end of the current period window of the server's clock (windows are
    ``[k*period, (k+1)*period)`` in Unix time), so an exclusive SetVar succeeds once per
    window. False on conflict, nothing changed."""

    PATH_NAME: ClassVar[str] = "SetVarOp"
    WIRE_NAME: ClassVar[str] = "SetVar"
    table: str = attrs.field(validator=_name)
    var: str = attrs.field(validator=_name)
    value: Any = attrs.field(default=None, validator=_user_value)
    description: str | None = attrs.field(default=None, kw_only=True, validator=_opt_str)
    ttl: float | None = attrs.field(default=None, kw_only=True, validator=_ttl)
    allow_duplicates: bool = attrs.field(default=False, kw_only=True, validator=_flag)
    period: float | None = attrs.field(default=None, kw_only=True, validator=_ttl)

    def __attrs_post_init__(self) -> None:
        if self.ttl is not None and self.period is not None:
            raise ValueError("SetVar takes ttl or period, not both")


def _limit(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) is not int or not 0 <= value <= _INT_MAX:
        raise ValueError(
            f"{type(inst).__name__}.{attribute.name} must be an integer >= 0, "
            f"got {value if type(value) is int else type(value).__name__}"
        )


def _opt_name(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None:
        _name(inst, attribute, value)


@attrs.frozen
class CountBelow(Operator):
    """Extension: true when ``table``/``var`` holds fewer than ``limit`` entries (the
    caller's own counted unless ``ignore_this_session``). With ``limit_table``/``limit_var``
    the limit is read from that variable's first entry when its value is an integer >= 0,
    so every client sees the same configured number (``limit`` is then the default)."""

    PATH_NAME: ClassVar[str] = "CountBelowOp"
    WIRE_NAME: ClassVar[str] = "CountBelow"
    table: str = attrs.field(validator=_name)
    var: str = attrs.field(validator=_name)
    limit: int = attrs.field(validator=_limit)
    limit_table: str | None = attrs.field(default=None, kw_only=True, validator=_opt_name)
    limit_var: str | None = attrs.field(default=None, kw_only=True, validator=_opt_name)
    ignore_this_session: bool = attrs.field(default=False, kw_only=True, validator=_flag)

    def __attrs_post_init__(self) -> None:
        if (self.limit_table is None) != (self.limit_var is None):
            raise ValueError("CountBelow takes limit_table and limit_var together")


@attrs.frozen
class Waiting(Operator):
    """Extension: true when a parked (waiting) transaction of another session would set
    ``table``/``var`` (it holds a SetVar on it). Lets a recipe give way to waiters, e.g.
    readers to a waiting writer (writer preference)."""

    PATH_NAME: ClassVar[str] = "WaitingOp"
    WIRE_NAME: ClassVar[str] = "Waiting"
    table: str = attrs.field(validator=_name)
    var: str = attrs.field(validator=_name)


@attrs.frozen
class ArrivedBelow(Operator):
    """Extension: true when fewer than ``limit`` sessions have *arrived* at ``table``/``var``:
    hold an entry of it, or have a parked (waiting) transaction that would set it (a SetVar on
    it, as ``Waiting`` sees them), each session counted once, the caller's own included. Lets
    parties meet in one transaction each (a barrier): a party's parked transaction counts for
    the others while it waits, so the last to arrive sees them all, and its commit lets the
    parked ones run in the same step."""

    PATH_NAME: ClassVar[str] = "ArrivedBelowOp"
    WIRE_NAME: ClassVar[str] = "ArrivedBelow"
    table: str = attrs.field(validator=_name)
    var: str = attrs.field(validator=_name)
    limit: int = attrs.field(validator=_limit)


@attrs.frozen
class DeleteVar(ChangeOperator):
    """Remove the caller's own entry (only when its value equals ``value``, if given).
    False when nothing matched."""

    PATH_NAME: ClassVar[str] = "DeleteVarOp"
    WIRE_NAME: ClassVar[str] = "DeleteVar"
    table: str = attrs.field(validator=_name)
    var: str = attrs.field(validator=_name)
    value: Any = attrs.field(default=None, validator=_user_value)
