"""The client's seams, on the import graph of tests/test_layering.py (which also checks that
no package, ``client`` included, has an import circle): a session names its client only
through the port (``client._port``), so the session modules never import their face."""

from __future__ import annotations

from test_layering import FILES, import_graph


def test_sessions_reach_their_client_only_through_the_port() -> None:
    """The session modules import the port, never the client modules; the faces import
    their sessions (one way)."""
    graph = import_graph(FILES)
    for session, face in (
        ("client._sync_session", "client._sync"),
        ("client._async_session", "client._async"),
    ):
        assert "client._port" in graph[session]
        assert face not in graph[session]
        assert session in graph[face]
