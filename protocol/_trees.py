"""Transaction trees to wire arrays and back (half of the codec; messages are in _codec.py).

Why: decoding a tree is where a hostile peer has the most room, so it is defensive: every node
is checked for shape and types, and the tree is bounded in depth and node count *while* it is
walked (a hostile tree costs at most ``max_ops`` node visits); every problem becomes a
:class:`ProtocolError` naming the node at fault by its path. Values are built through the
classes' validating constructors, except for the hot node shapes whose arguments were checked
inline: those go through generated unchecked constructors (``_unchecked_maker``), the same
objects for a fraction of the cost.

Wire layout: a node is an array ``[op_name, arg, ...]`` whose trailing optional arguments may
be omitted (PROTOCOL.md "Trees").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import attrs

from ._errors import ErrorCode, ProtocolError
from ._limits import TreeLimits
from ._ops import (
    ELEMENT_SIZE,
    FALSE,
    TRUE,
    Abort,
    And,
    AnywayContinueAfter,
    ArrivedBelow,
    Assert,
    Block,
    ChangeOperator,
    CountBelow,
    DeleteVar,
    Exists,
    If,
    Node,
    Not,
    Operator,
    Or,
    SelectConstantValue,
    SelectOperatorValue,
    SelectVarValue,
    SetVar,
    Statement,
    Waiting,
    Xor,
    value_size,
)

__all__ = [
    "DEFAULT_TREE_LIMITS",
    "TreeLimits",
    "node_from_wire",
    "node_to_wire",
    "statements_from_wire",
]


DEFAULT_TREE_LIMITS: Final = TreeLimits()

# --- trees ------------------------------------------------------------------------------------


def node_to_wire(node: Node) -> list[Any]:
    """Encode a tree node as ``[op_name, args...]`` (trailing defaults omitted)."""
    t = type(node)
    if t is Assert:
        return ["Assert", node_to_wire(node.condition)]  # type: ignore[attr-defined]
    if t is SetVar:
        n: Any = node
        return _trim(
            [
                "SetVar",
                n.table,
                n.var,
                n.value,
                n.description,
                n.ttl,
                n.allow_duplicates,
                n.period,
            ],
            _SETVAR_DEFAULTS,
        )
    if t is Not:
        return ["Not", node_to_wire(node.operand)]  # type: ignore[attr-defined]
    if t is Exists:
        n = node
        return _trim(["Exists", n.table, n.var, n.value, n.ignore_this_session], _EXISTS_DEFAULTS)
    if t is DeleteVar:
        n = node
        return _trim(["DeleteVar", n.table, n.var, n.value], _DELETE_DEFAULTS)
    if t is CountBelow:
        n = node
        return _trim(
            [
                "CountBelow",
                n.table,
                n.var,
                n.limit,
                n.limit_table,
                n.limit_var,
                n.ignore_this_session,
            ],
            _COUNT_DEFAULTS,
        )
    if t is Waiting:
        n = node
        return ["Waiting", n.table, n.var]
    if t is ArrivedBelow:
        n = node
        return ["ArrivedBelow", n.table, n.var, n.limit]
    if t in (And, Or, Xor):
        n = node
        return [t.WIRE_NAME, node_to_wire(n.left), node_to_wire(n.right)]
    if node is TRUE or t is type(TRUE):
        return ["True"]
    if node is FALSE or t is type(FALSE):
        return ["False"]
    if t is Abort:
        return ["Abort"]
    if t is Block:
        return ["Block", [node_to_wire(s) for s in node.statements]]  # type: ignore[attr-defined]
    if t is If:
        n = node
        out = ["If", node_to_wire(n.condition), node_to_wire(n.then)]
        if n.else_ is not None:
            out.append(node_to_wire(n.else_))
        return out
    if t is AnywayContinueAfter:
        n = node
        return _trim(["AnywayContinueAfter", node_to_wire(n.change), n.reset_abort], (False,))
    if t is SelectConstantValue:
        n = node
        return ["SelectConstantValue", n.into, n.value]
    if t is SelectOperatorValue:
        n = node
        return ["SelectOperatorValue", n.into, node_to_wire(n.operator)]
    if t is SelectVarValue:
        n = node
        return _trim(
            [
                "SelectVarValue",
                n.into,
                n.table,
                n.var,
                n.ignore_this_session,
                n.abort_if_not_found,
                n.select_many,
            ],
            (True, False, False),
        )
    raise TypeError(f"not a tree node: {node!r}")


_SETVAR_DEFAULTS = (None, None, None, False, None)
_COUNT_DEFAULTS = (None, None, False)
_EXISTS_DEFAULTS = (None, True)
_DELETE_DEFAULTS = (None,)


def _trim(out: list[Any], defaults: tuple[Any, ...]) -> list[Any]:
    """Drop trailing arguments that equal their defaults (``defaults`` aligns with the tail)."""
    first_opt = len(out) - len(defaults)
    while len(out) > first_opt and _same(out[-1], defaults[len(out) - 1 - first_opt]):
        out.pop()
    return out


def _same(a: Any, b: Any) -> bool:
    return a is b or (type(a) is type(b) and a == b)


def _unchecked_maker(cls: type[Any]) -> Callable[..., Any]:
    """A constructor of ``cls`` (a frozen, slotted attrs class) taking every field positionally
    and running no validator or converter: for values the decoder has already checked.

    Why generated: it stores each field through the slot's own descriptor, about a third
    cheaper than ``object.__setattr__`` and 2.5x cheaper than the validating ``__init__``; the
    decode of a small execute builds four such objects, so this is most of its cost.
    """
    names = [f.name for f in attrs.fields(cls)]
    setters: dict[str, Any] = {}
    for i, name in enumerate(names):
        owner = next(k for k in cls.__mro__ if name in vars(k))
        setters[f"_s{i}"] = vars(owner)[name].__set__
    body = "".join(f"    _s{i}(o, {name})\n" for i, name in enumerate(names))
    source = f"def make({', '.join(names)}):\n    o = _new(cls)\n{body}    return o\n"
    # __name__: the function belongs to the class's module (its __module__ says so).
    namespace: dict[str, Any] = {
        "__name__": cls.__module__,
        "_new": object.__new__,
        "cls": cls,
        **setters,
    }
    exec(source, namespace)  # a fixed template over attrs field names, nothing received
    return namespace["make"]  # type: ignore[no-any-return]


# Where a node sits, for error messages: built as a cheap tuple chain (parent, segment) while
# walking and formatted only when something is wrong (string formatting per node cost more
# than the rest of the decode on the hot path).
Where = tuple[Any, str] | str


def _fmt(where: Where) -> str:
    parts: list[str] = []
    while type(where) is tuple:
        where, segment = where
        parts.append(segment)
    parts.append(where)  # type: ignore[arg-type]
    return "".join(reversed(parts))


class _TreeDecoder:
    """Walks one wire tree, counting nodes and depth, building validated nodes."""

    __slots__ = ("limits", "max_depth", "max_name", "max_ops", "max_value", "ops")

    def __init__(self, limits: TreeLimits) -> None:
        self.limits = limits
        self.max_depth = limits.max_depth
        self.max_ops = limits.max_ops
        self.max_name = limits.max_name
        self.max_value = limits.max_value
        self.ops = 0

    def sized(self, node: Node, where: Where) -> Node:
        """``node`` (built by its validating constructor) when its names, description, value
        and durations are within the limits; else a ProtocolError naming the field."""
        limits = self.limits
        for field in _SIZED_FIELDS.get(type(node), ()):
            value = getattr(node, field)
            if field in _NAME_FIELDS:
                if value is not None and len(value) > limits.max_name:
                    raise _too_long(where, type(node), field, value, limits.max_name, "max_name")
            elif field == "description":
                if value is not None and len(value) > limits.max_text:
                    raise _too_long(where, type(node), field, value, limits.max_text, "max_text")
            elif field == "value":
                size = value_size(value, limits.max_value)
                if size > limits.max_value:
                    raise ProtocolError(
                        ErrorCode.TOO_LARGE,
                        f"{_fmt(where)}: {type(node).__name__}.value is larger than the "
                        f"limit of {limits.max_value} (max_value; a value counts "
                        f"{ELEMENT_SIZE} per element plus its strings' and binaries' bytes)",
                    )
            elif value is not None and value > limits.max_ttl:  # ttl, period
                raise ProtocolError(
                    ErrorCode.INVALID_TRANSACTION,
                    f"{_fmt(where)}: {type(node).__name__}.{field} {value:g} s exceeds the "
                    f"server's max_ttl of {limits.max_ttl:g} s",
                )
        return node

    def node(self, wire: Any, where: Where, depth: int) -> Node:
        if depth > self.max_depth:
            raise ProtocolError(
                ErrorCode.TREE_TOO_DEEP,
                f"{_fmt(where)}: tree nesting exceeds the limit of {self.max_depth} levels",
            )
        self.ops += 1
        if self.ops > self.max_ops:
            raise ProtocolError(
                ErrorCode.TOO_MANY_OPS,
                f"transaction has more than the limit of {self.max_ops} ops",
            )
        if type(wire) is not list or not wire:
            raise ProtocolError(
                ErrorCode.INVALID_TRANSACTION,
                f"{_fmt(where)}: a node must be a non-empty array [op, args...], "
                f"got {_wire_type(wire)}",
            )
        name = wire[0]
        spec = _NODE_SPECS.get(name) if type(name) is str else None
        if spec is None:
            raise ProtocolError(
                ErrorCode.INVALID_TRANSACTION,
                f"{_fmt(where)}: unknown op {_show(name)} (known: {_KNOWN_OPS})",
            )
        lo, hi, build, segment = spec
        nargs = len(wire) - 1
        if not lo <= nargs <= hi:
            want = str(lo) if lo == hi else f"{lo} to {hi}"
            raise ProtocolError(
                ErrorCode.INVALID_TRANSACTION,
                f"{_fmt(where)}: {name} takes {want} arguments, got {nargs}",
            )
        here = (where, segment)
        try:
            return build(self, wire, here, depth)
        except (TypeError, ValueError) as exc:
            raise ProtocolError(ErrorCode.INVALID_TRANSACTION, f"{_fmt(here)}: {exc}") from None

    def operator(self, wire: Any, where: Where, depth: int) -> Operator:
        node = self.node(wire, where, depth + 1)
        if not isinstance(node, Operator):
            raise ProtocolError(
                ErrorCode.INVALID_TRANSACTION,
                f"{_fmt(where)}: expected an operator, got statement {type(node).__name__}",
            )
        return node

    def statement(self, wire: Any, where: Where, depth: int) -> Statement:
        node = self.node(wire, where, depth + 1)
        if not isinstance(node, Statement):
            raise ProtocolError(
                ErrorCode.INVALID_TRANSACTION,
                f"{_fmt(where)}: expected a statement, got operator {type(node).__name__}; wrap "
                "operators in Assert, If, SelectOperatorValue or AnywayContinueAfter",
            )
        return node


_NAME_FIELDS: Final = frozenset({"table", "var", "into", "limit_table", "limit_var"})
# Node type -> the fields ``sized`` checks.
_SIZED_FIELDS: Final[dict[type, tuple[str, ...]]] = {
    SetVar: ("table", "var", "value", "description", "ttl", "period"),
    Exists: ("table", "var", "value"),
    DeleteVar: ("table", "var", "value"),
    CountBelow: ("table", "var", "limit_table", "limit_var"),
    Waiting: ("table", "var"),
    ArrivedBelow: ("table", "var"),
    SelectConstantValue: ("into", "value"),
    SelectOperatorValue: ("into",),
    SelectVarValue: ("into", "table", "var"),
}


def _too_long(
    where: Where, cls: type, field: str, value: str, limit: int, setting: str
) -> ProtocolError:
    return ProtocolError(
        ErrorCode.TOO_LARGE,
        f"{_fmt(where)}: {cls.__name__}.{field} is {len(value)} characters long, the limit is "
        f"{limit} ({setting})",
    )


def _arg(wire: list[Any], i: int, default: Any) -> Any:
    return wire[i] if len(wire) > i else default


def _bool_arg(wire: list[Any], i: int, default: bool) -> Any:
    # Any, not bool: the received value is returned unchecked for the node's own validator to
    # refuse with its message (a compiled build enforces a declared bool before that).
    value = _arg(wire, i, default)
    if value is None:  # nil on the wire means "the default"
        return default
    return value


# Fast builders for the hot nodes: the decoder has already checked the child kinds, so when
# the scalar arguments are plainly valid the node is built without re-running validators
# (~3x cheaper); anything unusual goes through the validating constructor for its message.
_SCALARS: Final = frozenset({type(None), bool, str, float, bytes})


def _plain_pair(table: Any, var: Any, max_name: int) -> bool:
    """Both are valid names within the length limit (the common table + variable check in
    one call)."""
    return (
        type(table) is str
        and type(var) is str
        and 0 < len(table) <= max_name
        and 0 < len(var) <= max_name
        and not table.isspace()
        and not var.isspace()
    )


def _plain_value(value: Any, max_value: int) -> bool:
    """A scalar that is plainly valid and within ``max_value`` (a str or bytes of at most
    ``max_value`` / 4 - 8 characters is: 4 bytes per character at most, plus its element)."""
    if value is None:
        return True
    t = type(value)
    if t is str or t is bytes:
        return len(value) * 4 + ELEMENT_SIZE <= max_value
    return t in _SCALARS or (t is int and -(2**63) <= value <= 2**64 - 1)


_mk_assert: Final = _unchecked_maker(Assert)
_mk_not: Final = _unchecked_maker(Not)
_mk_anyway: Final = _unchecked_maker(AnywayContinueAfter)
_mk_exists: Final = _unchecked_maker(Exists)
_mk_setvar: Final = _unchecked_maker(SetVar)
_mk_deletevar: Final = _unchecked_maker(DeleteVar)


def _b_assert(d: _TreeDecoder, w: list[Any], where: Where, depth: int) -> Node:
    return _mk_assert(d.operator(w[1], where, depth))  # type: ignore[no-any-return]


def _b_abort(d: _TreeDecoder, w: list[Any], where: Where, depth: int) -> Node:
    return Abort()


def _b_block(d: _TreeDecoder, w: list[Any], where: Where, depth: int) -> Node:
    items = w[1]
    if type(items) is not list or not items:
        raise ValueError("Block takes a non-empty array of statements")
    return Block(*[d.statement(s, (where, f"[{i}]"), depth) for i, s in enumerate(items)])


def _b_if(d: _TreeDecoder, w: list[Any], where: Where, depth: int) -> Node:
    cond = d.operator(w[1], (where, ".condition"), depth)
    then = d.statement(w[2], (where, ".then"), depth)
    other = _arg(w, 3, None)
    else_ = None if other is None else d.statement(other, (where, ".else"), depth)
    return If(cond, then, else_)


def _b_anyway(d: _TreeDecoder, w: list[Any], where: Where, depth: int) -> Node:
    change = d.operator(w[1], where, depth)
    reset = _bool_arg(w, 2, False)
    if type(reset) is bool and isinstance(change, ChangeOperator):
        return _mk_anyway(change, reset)  # type: ignore[no-any-return]
    return AnywayContinueAfter(change, reset_abort=reset)  # type: ignore[arg-type]


def _b_select_const(d: _TreeDecoder, w: list[Any], where: Where, depth: int) -> Node:
    return d.sized(SelectConstantValue(w[1], _arg(w, 2, None)), where)


def _b_select_op(d: _TreeDecoder, w: list[Any], where: Where, depth: int) -> Node:
    return d.sized(SelectOperatorValue(w[1], d.operator(w[2], where, depth)), where)


def _b_select_var(d: _TreeDecoder, w: list[Any], where: Where, depth: int) -> Node:
    node = SelectVarValue(
        w[1],
        w[2],
        w[3],
        ignore_this_session=_bool_arg(w, 4, True),
        abort_if_not_found=_bool_arg(w, 5, False),
        select_many=_bool_arg(w, 6, False),
    )
    return d.sized(node, where)


def _binary(cls: type[And | Or | Xor]) -> Callable[[_TreeDecoder, list[Any], Where, int], Node]:
    def build(d: _TreeDecoder, w: list[Any], where: Where, depth: int) -> Node:
        return cls(
            d.operator(w[1], (where, ".left"), depth), d.operator(w[2], (where, ".right"), depth)
        )

    return build


def _b_not(d: _TreeDecoder, w: list[Any], where: Where, depth: int) -> Node:
    return _mk_not(d.operator(w[1], where, depth))  # type: ignore[no-any-return]


def _b_true(d: _TreeDecoder, w: list[Any], where: Where, depth: int) -> Node:
    return TRUE


def _b_false(d: _TreeDecoder, w: list[Any], where: Where, depth: int) -> Node:
    return FALSE


def _b_exists(d: _TreeDecoder, w: list[Any], where: Where, depth: int) -> Node:
    n = len(w)
    table, var = w[1], w[2]
    value = w[3] if n > 3 else None
    ignore = w[4] if n > 4 else True
    if (
        _plain_pair(table, var, d.max_name)
        and _plain_value(value, d.max_value)
        and type(ignore) is bool
    ):
        return _mk_exists(table, var, value, ignore)  # type: ignore[no-any-return]
    return d.sized(Exists(table, var, value, ignore_this_session=_bool_arg(w, 4, True)), where)


def _b_setvar(d: _TreeDecoder, w: list[Any], where: Where, depth: int) -> Node:
    if len(w) <= 4:  # the common short form: [SetVar, table, var, value?]
        table, var = w[1], w[2]
        value = w[3] if len(w) > 3 else None
        if _plain_pair(table, var, d.max_name) and _plain_value(value, d.max_value):
            return _mk_setvar(table, var, value, None, None, False, None)  # type: ignore[no-any-return]
    node = SetVar(
        w[1],
        w[2],
        _arg(w, 3, None),
        description=_arg(w, 4, None),
        ttl=_arg(w, 5, None),
        allow_duplicates=_bool_arg(w, 6, False),
        period=_arg(w, 7, None),
    )
    return d.sized(node, where)


def _b_countbelow(d: _TreeDecoder, w: list[Any], where: Where, depth: int) -> Node:
    node = CountBelow(
        w[1],
        w[2],
        w[3],
        limit_table=_arg(w, 4, None),
        limit_var=_arg(w, 5, None),
        ignore_this_session=_bool_arg(w, 6, False),
    )
    return d.sized(node, where)


def _b_waiting(d: _TreeDecoder, w: list[Any], where: Where, depth: int) -> Node:
    return d.sized(Waiting(w[1], w[2]), where)


def _b_arrivedbelow(d: _TreeDecoder, w: list[Any], where: Where, depth: int) -> Node:
    return d.sized(ArrivedBelow(w[1], w[2], w[3]), where)


def _b_deletevar(d: _TreeDecoder, w: list[Any], where: Where, depth: int) -> Node:
    table, var = w[1], w[2]
    value = w[3] if len(w) > 3 else None
    if _plain_pair(table, var, d.max_name) and _plain_value(value, d.max_value):
        return _mk_deletevar(table, var, value)  # type: ignore[no-any-return]
    return d.sized(DeleteVar(table, var, value), where)


_Builder = Callable[[_TreeDecoder, list[Any], Where, int], Node]
# op name -> (min args, max args, builder, path segment "/name")
_NODE_SPECS: dict[str, tuple[int, int, _Builder, str]] = {
    "Assert": (1, 1, _b_assert, "/Assert"),
    "Abort": (0, 0, _b_abort, "/Abort"),
    "Block": (1, 1, _b_block, "/Block"),
    "If": (2, 3, _b_if, "/If"),
    "AnywayContinueAfter": (1, 2, _b_anyway, "/AnywayContinueAfter"),
    "SelectConstantValue": (1, 2, _b_select_const, "/SelectConstantValue"),
    "SelectOperatorValue": (2, 2, _b_select_op, "/SelectOperatorValue"),
    "SelectVarValue": (3, 6, _b_select_var, "/SelectVarValue"),
    "And": (2, 2, _binary(And), "/And"),
    "Or": (2, 2, _binary(Or), "/Or"),
    "Xor": (2, 2, _binary(Xor), "/Xor"),
    "Not": (1, 1, _b_not, "/Not"),
    "True": (0, 0, _b_true, "/True"),
    "False": (0, 0, _b_false, "/False"),
    "Exists": (2, 4, _b_exists, "/Exists"),
    "SetVar": (2, 7, _b_setvar, "/SetVar"),
    "CountBelow": (3, 6, _b_countbelow, "/CountBelow"),
    "Waiting": (2, 2, _b_waiting, "/Waiting"),
    "ArrivedBelow": (3, 3, _b_arrivedbelow, "/ArrivedBelow"),
    "DeleteVar": (2, 3, _b_deletevar, "/DeleteVar"),
}


def node_from_wire(wire: Any, limits: TreeLimits = DEFAULT_TREE_LIMITS) -> Node:
    """Decode one tree node (statement or operator)."""
    return _TreeDecoder(limits).node(wire, "node", 1)


def statements_from_wire(
    wire: Any, limits: TreeLimits = DEFAULT_TREE_LIMITS
) -> tuple[Statement, ...]:
    """Decode a transaction's top-level statement list."""
    if type(wire) is not list:
        raise ProtocolError(
            ErrorCode.INVALID_TRANSACTION,
            f"statements must be an array, got {_wire_type(wire)}",
        )
    if len(wire) == 1:
        # The acquire, [Assert(SetVar(table, var[, value]))], in one step: what the walk below
        # would build for it (two nodes, depth 2), without its eight calls (issue 32: the
        # pipelined path's decode).
        s = wire[0]
        if type(s) is list and len(s) == 2 and s[0] == "Assert":
            op = s[1]
            if (
                type(op) is list
                and 3 <= len(op) <= 4
                and op[0] == "SetVar"
                and limits.max_depth >= 2
                and limits.max_ops >= 2
            ):
                table, var = op[1], op[2]
                value = op[3] if len(op) > 3 else None
                if _plain_pair(table, var, limits.max_name) and _plain_value(
                    value, limits.max_value
                ):
                    return (_mk_assert(_mk_setvar(table, var, value, None, None, False, None)),)
    d = _TreeDecoder(limits)
    return tuple(
        [d.statement(s, _TOP[i] if i < 64 else f"statements[{i}]", 0) for i, s in enumerate(wire)]
    )


_TOP = [f"statements[{i}]" for i in range(64)]
_KNOWN_OPS = ", ".join(sorted(_NODE_SPECS))


_SHOW_MAX = 64


def _show(value: Any) -> str:
    """Render a received value for an error message, short and safe: repr() of a scalar (a long
    str or bytes cut at _SHOW_MAX), only the wire type of a container (repr() of a received
    array or map may be huge, or nested too deeply for repr's recursion limit)."""
    t = type(value)
    if t is str or t is bytes:
        return repr(value) if len(value) <= _SHOW_MAX else f"{value[:_SHOW_MAX]!r}..."
    if value is None or t is bool or t is int or t is float:
        return repr(value)
    return f"<{_wire_type(value)}>"


def _wire_type(value: Any) -> str:
    return {
        type(None): "nil",
        bool: "bool",
        int: "integer",
        float: "float",
        str: "string",
        bytes: "binary",
        list: "array",
        dict: "map",
    }.get(type(value), type(value).__name__)
