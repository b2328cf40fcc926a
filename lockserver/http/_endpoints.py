"""What the server's HTTP paths answer: health, readiness, status, metrics and the status page.

``Endpoints`` is the router an ``HttpConnection`` (``_http.py``) calls once per request. It
owns the route table and every answer; it reads the server only through the shell's
statistics and the objects it is given, and decides nothing about lock state (the figures
come from ``LockCore.statistics`` through the shell, like a ``stats`` request's).

| path | answer |
|---|---|
| ``/healthz`` | 200 while the process serves at all |
| ``/readyz`` | 200 when the server would accept work, else 503 with the reasons |
| ``/v1/status`` | the figures of the status page as JSON |
| ``/metrics`` | Prometheus text format (``_metrics.ServerCollector``, a private registry) |
| ``/`` | the status page (``_static/status.html``, no external assets) |

The inspection listings of issue 16 (``/v1/holders``, ``/v1/sessions``, ``/v1/waiters``) and
the status's busiest tables and longest waits are served through the door by
``_http_listings.py``, which adds its routes with :meth:`Endpoints.add_route` and sets
:attr:`Endpoints.activity`.

Rules kept: with tokens configured, the data paths (``/v1/*``, ``/metrics``) need
``Authorization: Bearer <token>`` (any configured token; 401 otherwise); the probes and the
page, which carries no data, do not. A token restricted to some namespaces reads its own
counts in ``/v1/status`` and is refused ``/metrics`` (403), which shows the whole server
(issue 30, docs/security.md). Every answer is computed synchronously from figures the server
keeps anyway: a scrape costs what a ``stats`` request costs plus the rendering, once per turn
of its connection (``_http.py``).
"""

from __future__ import annotations

import importlib.resources
import time
from collections.abc import Callable
from typing import Any, Final

import attrs
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest

from lockserver._auth import ANONYMOUS, Authenticator, Principal
from lockserver._config import ServerConfig
from protocol import iso_utc

from ._http import HttpRequest, HttpResponse
from ._metrics import History, ServerCollector

__all__ = ["Endpoints", "Handler", "Route", "status_page"]

#: A path's answer: the request, who asked (``ANONYMOUS`` without tokens), the time.
Handler = Callable[[HttpRequest, Principal, float], HttpResponse]

_HTML: Final = "text/html; charset=utf-8"
#: The page may run its own inline script and style and fetch from this server, nothing else.
_PAGE_HEADERS: Final = (
    (
        "Content-Security-Policy",
        "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
        "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'",
    ),
    ("Referrer-Policy", "no-referrer"),
)
_UNAUTHORIZED_HEADERS: Final = (("WWW-Authenticate", 'Bearer realm="lockserver"'),)


@attrs.frozen
class Route:
    """One path: its handler, and whether it shows data (with tokens: needs a bearer token)."""

    handler: Handler
    private: bool


def status_page() -> bytes:
    """The status page's HTML, a data file of the package (shipped in the wheel)."""
    return importlib.resources.files("lockserver.http").joinpath("_static/status.html").read_bytes()


class Endpoints:
    """The route table and the answers. ``statistics(now, scope)`` is the shell's statistics
    map (with ``scope``, a principal's own counts); ``scope(principal)`` says whose counts
    a principal sees (None: the whole server);
    ``shutting_down()`` says whether the server is stopping; ``history`` is sampled by the
    shell's trust ticker; ``collector`` renders ``/metrics``; ``auth`` checks bearer tokens
    (None: no tokens configured, everything is open)."""

    def __init__(
        self,
        config: ServerConfig,
        *,
        statistics: Callable[[float, Principal | None], dict[str, Any]],
        scope: Callable[[Principal], Principal | None],
        shutting_down: Callable[[], bool],
        history: History,
        collector: ServerCollector,
        auth: Authenticator | None,
        instance: str,
    ) -> None:
        self.config = config
        self._statistics = statistics
        self._scope = scope
        self._shutting_down = shutting_down
        self.history = history
        self.auth = auth
        self.instance = instance
        self.registry = CollectorRegistry(auto_describe=False)  # this server's, not global
        self.registry.register(collector)
        self.page = status_page()
        self.routes: dict[str, Route] = {
            "/": Route(self.index, private=False),
            "/healthz": Route(self.healthz, private=False),
            "/readyz": Route(self.readyz, private=False),
            "/v1/status": Route(self.status, private=True),
            "/metrics": Route(self.metrics, private=True),
        }
        #: What ``/v1/status`` adds about the lock state as ``principal`` may see it (the
        #: busiest tables, the longest waits): set by the listings (``_http_listings.py``).
        self.activity: Callable[[Principal, float], dict[str, Any]] | None = None

    def add_route(self, path: str, handler: Handler, *, private: bool = True) -> None:
        """Serve ``path`` with ``handler`` (``private``: needs a token when tokens are
        configured). A path is routed once: adding it again is a bug."""
        if path in self.routes:
            raise ValueError(f"{path} is routed already")
        self.routes[path] = Route(handler, private)

    def __call__(self, request: HttpRequest, now: float) -> HttpResponse:
        """The answer to ``request`` at time ``now``."""
        route = self.routes.get(request.path)
        if route is None:
            return HttpResponse.error(404, f"no such endpoint: {request.path}")
        principal = ANONYMOUS
        if route.private and self.auth is not None:
            found = self._principal(request)
            if found is None:
                return HttpResponse.error(
                    401,
                    "a valid token is required: Authorization: Bearer <token>",
                    _UNAUTHORIZED_HEADERS,
                )
            principal = found
        return route.handler(request, principal, now)

    def _principal(self, request: HttpRequest) -> Principal | None:
        assert self.auth is not None
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        return self.auth.authenticate(token.strip())

    # --- the answers --------------------------------------------------------------------------

    def index(self, request: HttpRequest, principal: Principal, now: float) -> HttpResponse:
        return HttpResponse(200, self.page, _HTML, _PAGE_HEADERS)

    def healthz(self, request: HttpRequest, principal: Principal, now: float) -> HttpResponse:
        return HttpResponse.json(200, {"status": "ok"})

    def readyz(self, request: HttpRequest, principal: Principal, now: float) -> HttpResponse:
        reasons = self.not_ready(self._statistics(now, None))
        if reasons:
            return HttpResponse.json(503, {"ready": False, "reasons": reasons})
        return HttpResponse.json(200, {"ready": True})

    def not_ready(self, stats: dict[str, Any]) -> list[str]:
        """Why the server would not accept work now (empty: it would): shutting down, no
        room for another connection or session, its reliability below the ``ready_*``
        thresholds (the gate of every transaction's ``min_trust`` / ``min_uptime``), or, a
        replica, halted."""
        config = self.config
        server = stats["server"]
        engine = stats["engine"]
        trust = stats["trust"]
        reasons = []
        if self._shutting_down():
            reasons.append("the server is shutting down")
        if server["connections"] >= config.max_connections:
            reasons.append(
                f"{server['connections']} connections are open, the limit "
                f"(max_connections={config.max_connections})"
            )
        if engine["sessions"] >= config.max_sessions:
            reasons.append(
                f"{engine['sessions']} sessions are live, the limit "
                f"(max_sessions={config.max_sessions})"
            )
        if trust["trust"] < config.ready_min_trust:
            reasons.append(
                f"trust {trust['trust']:.3f} is below ready_min_trust={config.ready_min_trust:g}"
            )
        if trust["uptime"] < config.ready_min_uptime:
            reasons.append(
                f"uptime {trust['uptime']:.1f} s is below "
                f"ready_min_uptime={config.ready_min_uptime:g} s"
            )
        halted = stats.get("replication", {}).get("halted")
        if halted:  # a replica that halted serves no request (docs/replication.md)
            reasons.append(halted["reason"])
        return reasons

    def status(self, request: HttpRequest, principal: Principal, now: float) -> HttpResponse:
        scope = self._scope(principal)
        stats = self._statistics(now, scope)
        server = stats["server"]
        engine = stats["engine"]
        trust = stats["trust"]
        # Readiness is the whole server's, whoever asks.
        reasons = self.not_ready(stats if scope is None else self._statistics(now, None))
        uptime = engine["uptime"]
        wall = time.time()  # wall clock: for people, never for arithmetic
        started = wall - uptime
        return HttpResponse.json(
            200,
            {
                "time": iso_utc(wall),
                "version": server["version"],
                "build": server["build"],
                "host": server["host"],
                "address": server["address"],
                "instance": self.instance,
                "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
                "uptime": uptime,
                "ready": not reasons,
                "not_ready": reasons,
                "trust": trust["trust"],
                "norm": trust["norm"],
                "load": trust["rate"],
                "transactions_total": engine["transactions"],
                "transactions_per_second": self.history.rate,
                "connections": server["connections"],
                "http_connections": server["http_connections"],
                "sessions": engine["sessions"],
                "entries": engine["entries"],
                "waiters": stats["waiting"]["waiters"],
                "tables": engine["tables"],
                "namespaces": engine["namespaces"],
                "history": self.history.to_json(),
                **({} if self.activity is None else self.activity(principal, now)),
            },
        )

    def metrics(self, request: HttpRequest, principal: Principal, now: float) -> HttpResponse:
        if self._scope(principal) is not None:
            return HttpResponse.error(
                403,
                f"token {principal.name!r} may not read /metrics: it shows the whole server, "
                "for an admin token or one without a namespace restriction (docs/security.md)",
            )
        # The classic text format (0.0.4): what every Prometheus and its parsers read.
        return HttpResponse(200, generate_latest(self.registry), CONTENT_TYPE_PLAIN_0_0_4)
