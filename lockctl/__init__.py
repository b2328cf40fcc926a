"""lockctl: the operator's command for lockserver (docs/operations.md#lockctl).

``lockctl [--server HOST:PORT] [--token TOKEN] [--json] COMMAND ...``: the server's status,
ending a session, and running a command while holding a lock (``lockctl lock``). It talks to
the server through the ``client`` package like any application.
"""

from ._cli import main as main

__all__ = ["main"]
