"""The inspection listings over HTTP: ``/v1/holders``, ``/v1/sessions``, ``/v1/waiters``, and
the status page's busiest tables and longest waits.

``HttpListings`` turns a query string into the protocol's listing request and serves it
through the checks a protocol ``holders`` / ``sessions`` / ``waiters`` request passes
(``RequestHandler.page_at``: the namespace check, the principal's visibility) and the
door's own listing code (``page_at``); it adds only the HTTP half: parsing the query,
and rendering the page as JSON with the records of ``protocol.record_to_json``.

Rules kept (issue 16 section 3, docs/operations.md "HTTP endpoints"):
- **The same request, the same answer.** The parameters are the listing's fields
  (``namespace``, ``table``, ``var``, ``session``, ``match``, ``cursor``, ``limit``) and
  are checked by the protocol's own decoder (``request_from_wire``, with the server's
  ``max_name`` / ``max_text``), so a bad value gets the protocol's error text; the page is
  the door's (same bounds, same cursors: a cursor from HTTP works in the protocol and back).
- **Bad input gets a precise 400** with ``{"error": ...}``: an unknown, repeated or
  valueless parameter, bad percent-encoding (``%`` not followed by two hex digits, or bytes
  that are not UTF-8), a ``limit`` that is not a decimal integer in 1..1000, a field over its
  limit, a bad cursor. A namespace the token may not use is 403 (FORBIDDEN).
- A page is as of the request's time: on a single server what was due expires first, and
  those sessions' ``lost`` events are delivered to the connections they are for, as after
  any request; a replica reads its applied state and changes nothing (only the log may).
"""

from __future__ import annotations

import re
from typing import Any, Final
from urllib.parse import unquote_to_bytes

from lockserver._auth import Principal
from lockserver._peer import Peer
from lockserver.engine import Door, EngineError, SessionsListing
from lockserver.http import Endpoints, HttpRequest, HttpResponse
from protocol import (
    MAX_PAGE,
    ErrorCode,
    HoldersPage,
    ListQuery,
    ProtocolError,
    SessionsPage,
    TreeLimits,
    WaitersPage,
    record_to_json,
    request_from_wire,
)

from ._requests import RequestHandler, sessions_page

__all__ = ["LONGEST_WAITS", "PARAMETERS", "TOP_TABLES", "HttpListings", "parse_query"]

#: The query parameters of a listing (the protocol request's fields but ``type`` and ``id``).
PARAMETERS: Final = ("namespace", "table", "var", "session", "match", "cursor", "limit")
#: How many tables and waiters ``/v1/status`` shows.
TOP_TABLES: Final = 10
LONGEST_WAITS: Final = 10

_BAD_PERCENT: Final = re.compile(r"%(?![0-9A-Fa-f]{2})")
_DIGITS: Final = re.compile(r"[0-9]+")
_STATUS_OF: Final = {ErrorCode.FORBIDDEN: 403, ErrorCode.INTERNAL_ERROR: 500}


class QueryError(ValueError):
    """A query string that is not a listing's: the message says what is wrong."""


def parse_query(query: str) -> dict[str, Any]:
    """The listing fields of a query string (``limit`` as an int, the rest as str);
    raises :class:`QueryError` naming the first thing wrong. ``+`` is a space; an empty
    value is kept (``table=`` is the prefix that matches every table)."""
    fields: dict[str, Any] = {}
    if not query:
        return fields
    for part in query.split("&"):
        if not part:
            raise QueryError("an empty parameter in the query (two '&' in a row, or one at an end)")
        raw_name, eq, raw_value = part.partition("=")
        name = _decode(raw_name, "a parameter name")
        if name not in PARAMETERS:
            raise QueryError(f"unknown parameter {name!r} (known: {', '.join(PARAMETERS)})")
        if not eq:
            raise QueryError(f"parameter {name!r} has no value ({name}=...)")
        if name in fields:
            raise QueryError(f"parameter {name!r} is given more than once")
        value = _decode(raw_value, f"parameter {name!r}")
        if name == "limit":
            # Decimal digits only (int() would take "+5", " 5", "5_0" and other scripts'
            # digits); past 4 significant digits it is out of range (and int() may refuse it).
            if _DIGITS.fullmatch(value) is None or len(value.lstrip("0")) > 4:
                raise QueryError(
                    f"limit must be an integer in 1..{MAX_PAGE} (MAX_PAGE), got {value!r}"
                )
            fields[name] = int(value)  # the protocol's decoder checks the range
        else:
            fields[name] = value
    return fields


def _decode(raw: str, what: str) -> str:
    """Percent-decode ``raw`` (``+`` is a space) as UTF-8, strictly."""
    bad = _BAD_PERCENT.search(raw)
    if bad is not None:
        raise QueryError(
            f"{what} is badly percent-encoded: {raw[bad.start() : bad.start() + 3]!r} is not "
            "'%' and two hex digits"
        )
    try:
        return unquote_to_bytes(raw.replace("+", " ")).decode("utf-8")
    except UnicodeDecodeError:
        raise QueryError(f"{what} is not UTF-8 once percent-decoded") from None


def to_json(page: HoldersPage | SessionsPage | WaitersPage) -> dict[str, Any]:
    """A page as the HTTP reply's JSON: ``{"<kind>": [records], "cursor": str | null}``."""
    records: tuple[Any, ...]
    if type(page) is HoldersPage:
        key, records = "holders", page.holders
    elif type(page) is SessionsPage:
        key, records = "sessions", page.sessions
    else:
        key, records = "waiters", page.waiters  # type: ignore[union-attr]
    return {key: [record_to_json(r) for r in records], "cursor": page.cursor}


class HttpListings:
    """The listing endpoints and the status page's activity, served through ``requests``
    (the shell's request handler) and ``core`` (the door); ``limits`` are the server's
    name and text limits the protocol's decoder checks."""

    def __init__(self, requests: RequestHandler, core: Door[Peer], limits: TreeLimits) -> None:
        self.requests = requests
        self.core = core
        self.limits = limits

    def install(self, endpoints: Endpoints) -> None:
        """Route ``/v1/holders``, ``/v1/sessions`` and ``/v1/waiters`` (private: with tokens,
        a bearer token is needed) and give ``/v1/status`` its activity."""
        for kind in ("holders", "sessions", "waiters"):
            endpoints.add_route(f"/v1/{kind}", self._handler(kind), private=True)
        endpoints.activity = self.activity

    def _handler(self, kind: str) -> Any:
        def handler(request: HttpRequest, principal: Principal, now: float) -> HttpResponse:
            return self.listing(kind, request.query, principal, now)

        return handler

    def listing(self, kind: str, query: str, principal: Principal, now: float) -> HttpResponse:
        """The answer to ``GET /v1/<kind>?<query>`` asked by ``principal`` at ``now``: 200
        with the page, 400 / 403 with ``{"error": ...}``."""
        try:
            fields = parse_query(query)
            request: Any = request_from_wire({"type": kind, "id": 0, **fields}, self.limits)
        except QueryError as exc:
            return HttpResponse.error(400, f"{kind}: {exc}")
        except ProtocolError as exc:
            return HttpResponse.error(400, exc.message)
        answer = self._ask(kind, request.query, principal, now)
        if type(answer) is EngineError:
            return HttpResponse.error(_STATUS_OF.get(answer.code, 400), answer.message)
        return HttpResponse.json(200, to_json(answer))

    def _ask(self, kind: str, query: ListQuery, principal: Principal, now: float) -> Any:
        """One listing through the request handler's check and the door's ``page_at``;
        returns the answer (a page, or the EngineError that refused it)."""
        answer = self.requests.page_at(kind, query, principal, now)
        if type(answer) is SessionsListing:
            return sessions_page(answer)
        return answer

    def activity(self, principal: Principal, now: float) -> dict[str, Any]:
        """The status page's busiest tables (the :data:`TOP_TABLES` holding the most
        variables, with how many of the ``tables`` were looked at) and longest waits (the
        :data:`LONGEST_WAITS` oldest parked transactions, the waiters listing's records),
        of what ``principal`` may see. Bounded: at most ``BUSIEST_SCAN`` tables and one
        listing page."""
        visible = self.requests.visible(principal)
        tables, looked = self.core.busiest_tables(TOP_TABLES, visible=visible)
        waits = self._ask("waiters", ListQuery(limit=LONGEST_WAITS), principal, now)
        return {
            "busiest_tables": [
                {"namespace": t.namespace, "table": t.table, "held": t.held} for t in tables
            ],
            "busiest_tables_scanned": looked,
            "longest_waits": to_json(waits)["waiters"] if type(waits) is WaitersPage else [],
        }
