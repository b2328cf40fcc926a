"""``encode_execute``: the client's per-call encoder of an execute request.

Apart from _codec.py, which may be compiled with mypyc (lockserver/_build.py): this function
validates arguments of any type with the messages' own errors, and a compiled function would
refuse (or convert) an argument of another type than declared before it could. It is the
client's path, not the server's, so it gains nothing from compiling.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Final

from ._codec import _execute_wire, _packer, pack, request_to_wire
from ._framing import frame
from ._messages import Execute, SessionSpec, Transaction
from ._ops import Statement
from ._trees import node_to_wire

__all__ = ["encode_execute"]

_MAX_ID: Final = 2**64 - 1


def encode_execute(
    request_id: int,
    session: SessionSpec,
    namespace: str,
    statements: Iterable[Statement],
    *,
    transaction_id: str = "",
    description: str = "",
    min_uptime: float = 0.0,
    min_trust: float = 0.0,
    wait: float | None = None,
) -> bytes:
    """The framed bytes of ``Execute(request_id, session, Transaction(namespace, statements,
    ...), wait)``, validated exactly as building those would validate them (same errors), but
    without building them: the client's per-call path.

    Why: the two validated frozen objects cost more than the encoding itself, and a client
    builds them only to encode them at once. Anything unusual (a statement sequence that is
    not a list or tuple, a value needing a precise error) takes the building path.
    """
    if (
        type(request_id) is int
        and 0 <= request_id <= _MAX_ID
        and type(session) is SessionSpec
        and type(namespace) is str
        and (type(statements) is list or type(statements) is tuple)
        and type(transaction_id) is str
        and type(description) is str
        and (type(min_uptime) is float or type(min_uptime) is int)
        and 0 <= min_uptime < math.inf
        and (type(min_trust) is float or type(min_trust) is int)
        and 0 <= min_trust <= 1
        and (wait is None or ((type(wait) is float or type(wait) is int) and 0 <= wait < math.inf))
        and namespace.strip()
    ):
        wire_statements = []
        for st in statements:
            if not isinstance(st, Statement):
                break
            wire_statements.append(node_to_wire(st))
        else:
            return frame(
                _packer.pack(
                    _execute_wire(
                        request_id,
                        session,
                        namespace,
                        wire_statements,
                        transaction_id,
                        description,
                        min_uptime,
                        min_trust,
                        wait,
                    )
                )
            )
    tx = Transaction(
        namespace,
        statements,
        transaction_id=transaction_id,
        description=description,
        min_uptime=min_uptime,
        min_trust=min_trust,
    )
    return frame(pack(request_to_wire(Execute(request_id, session, tx, wait))))
