"""The HTTP face: HTTP/1.1 on the protocol's port, and what its paths answer.

It owns telling an HTTP request from a frame and serving one HTTP connection with h11
(``_http``), the router of health, readiness, status, metrics and the status page
(``_endpoints``, ``_static/status.html``), and what monitoring reads (``_metrics``: the
request-duration histogram, the status page's history, the Prometheus collector).

May import: the standard library, trio, h11, prometheus_client, ``protocol`` and the
foundations at the top of ``lockserver`` (settings, auth, the peer's socket helpers, GC
pauses). Never the engine, replication or the shell: the shell hands it what it shows
(tests/test_layering.py).
"""

from ._endpoints import Endpoints as Endpoints
from ._http import HttpConnection as HttpConnection
from ._http import HttpCounters as HttpCounters
from ._http import HttpLimits as HttpLimits
from ._http import HttpRequest as HttpRequest
from ._http import HttpResponse as HttpResponse
from ._http import is_http as is_http
from ._http import too_many as too_many
from ._metrics import Durations as Durations
from ._metrics import History as History
from ._metrics import ServerCollector as ServerCollector

__all__ = [
    "Durations",
    "Endpoints",
    "History",
    "HttpConnection",
    "HttpCounters",
    "HttpLimits",
    "HttpRequest",
    "HttpResponse",
    "ServerCollector",
    "is_http",
    "too_many",
]
