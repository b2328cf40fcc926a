"""Face methods made from operations written once: ``blocking(op)`` and ``awaitable(op)``.

Why: a call of the client (``_calls``), of a session over several servers, or of a recipe
(``recipes/_ops`` and the coordination modules) is a generator written once, with the public
signature and docstring; a face's method for it would only repeat that signature and say
``return self._drive(op(self, ...))`` (``return await ...`` on the async face). These two
makers write that method once: a face declares ``holders = blocking(_calls.holders)`` or
``holders = awaitable(_calls.holders)``, one line per face, and the method has the
operation's signature (minus its first parameter, the face object), name and docstring, for
``help()``, ``inspect.signature`` and a user's type checker (``ParamSpec``) alike.

The face object must have ``_drive(op)``: run the operation to its end and return its result
(the sync face blocking, the async face as a coroutine). Hot paths (a session's ``execute``,
a recipe's ``acquire``) keep their own methods: the maker adds a call with ``*args`` /
``**kwargs`` packing, which costs little on a listing and would show on the hot path.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

__all__ = ["MADE_BY", "Awaiting", "Blocking", "awaitable", "blocking"]

P = ParamSpec("P")
T = TypeVar("T")

#: The attribute naming the maker of a made method ("blocking" or "awaitable"), for the test
#: that every class with one has the matching ``_drive``.
MADE_BY = "__made_by__"

#: An operation: a generator function whose first parameter is the face object.
Operation = Callable[Concatenate[Any, P], Generator[Any, Any, T]]


class Blocking(Protocol):
    """What a method made by :func:`blocking` needs of its object (mypy holds a class to it
    where the method is used: "Invalid self argument" names a class without ``_drive``)."""

    def _drive(self, op: Any, /) -> Any: ...


class Awaiting(Protocol):
    """What a method made by :func:`awaitable` needs of its object."""

    def _drive(self, op: Any, /) -> Awaitable[Any]: ...


def blocking(op: Operation[P, T]) -> Callable[Concatenate[Blocking, P], T]:
    """A sync face's method running ``op`` with the face's blocking ``_drive``."""

    def method(self: Blocking, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._drive(op(self, *args, **kwargs))  # type: ignore[no-any-return]

    _describe(method, op, "blocking")
    return method


def awaitable(op: Operation[P, T]) -> Callable[Concatenate[Awaiting, P], Coroutine[Any, Any, T]]:
    """An async face's method running ``op`` with the face's awaitable ``_drive``."""

    async def method(self: Awaiting, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self._drive(op(self, *args, **kwargs))  # type: ignore[no-any-return]

    _describe(method, op, "awaitable")
    return method


def _describe(method: Callable[..., Any], op: Callable[..., Any], maker: str) -> None:
    """Give ``method`` the operation's name, docstring and signature as a method's: its
    first parameter (the face object) called ``self``, without the operation's annotations
    of it and of the generator it returns (``inspect.signature(Cls.name)`` reads
    ``(self, ...)``, a bound method's ``(...)``)."""
    functools.update_wrapper(method, op)
    signature = inspect.signature(op)
    first, *rest = signature.parameters.values()
    method.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[first.replace(name="self", annotation=inspect.Parameter.empty), *rest],
        return_annotation=inspect.Signature.empty,
    )
    method.__annotations__ = {
        name: value
        for name, value in op.__annotations__.items()
        if name not in (first.name, "return")
    }
    setattr(method, MADE_BY, maker)
