"""The serving shell: the trio side of the server, composing everything else.

It owns accepting connections (``_server``: ``Server``, ``serve``, ``RunningServer``), the read
path (``_reading``: the epoll poller and ``_busypoll``, its busy-poll policy), serving
requests through the lock core's door (``_requests``), and the HTTP listings answered through
the same checks (``_http_listings``), and the statistics record (``_statistics``). One call
through the door per request; timers (expiry, trust ticks) live here too.

May import: the standard library, trio, ``protocol``, ``lockserver.engine``, the HTTP face
(``lockserver.http``), replication (``lockserver.replication``) and the foundations at the top
of ``lockserver`` (settings, auth, trust, build, the peer). Nothing below imports the shell
(tests/test_layering.py).
"""

from ._server import RunningServer as RunningServer
from ._server import serve as serve

__all__ = ["RunningServer", "serve"]
