"""A sync client of a group leaves a replica that stops answering: a call that times out
closes that connection (the next call goes to another member), also when two threads wait
on the same connection at once -- the one that is not reading must give up without
deadlocking on the client's lock (it did: giving up took the lock it held)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from client import Assert, ClientTimeout, ConnectionLost, LockClient, SetVar
from protocol import PROTOCOL_VERSION, Connection, Reply, Role, Welcome


@pytest.fixture
def silent_replica() -> Iterator[str]:
    """A "replica" that completes the handshake, then never answers (a paused process)."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()
    conns: list[socket.socket] = []

    def serve() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                sock, _ = listener.accept()
            except TimeoutError:
                continue
            conns.append(sock)
            proto = Connection(Role.SERVER, require_hello=True)
            hello = None
            while hello is None:
                proto.receive_data(sock.recv(65536))
                hello = proto.next_message()
            proto.handshake_done()
            welcome = Welcome(PROTOCOL_VERSION, "silent", "h", {}, "group-x", None, "g", ())
            sock.sendall(proto.send(Reply(hello.request_id, welcome)))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        for sock in conns:
            sock.close()
        listener.close()


def test_two_threads_time_out_on_a_silent_replica_without_deadlock(silent_replica: str) -> None:
    """Two threads execute at once through a group client whose replica never answers: both
    get an error (ClientTimeout, or ConnectionLost for the one whose connection the other gave
    up) within about the timeout: none is left waiting on the client's lock."""
    other = socket.create_server(("127.0.0.1", 0))  # a second member that refuses nothing
    try:
        members = [silent_replica, f"127.0.0.1:{other.getsockname()[1]}"]
        client = LockClient(servers=[members], timeout=0.5, connect_timeout=0.5)
        session = client.session(keepalive=False)
        errors: list[BaseException] = []

        def call() -> None:
            try:
                session.execute("ns", [Assert(SetVar("L", "x", "v"))])
            except BaseException as exc:  # recorded for the assertion
                errors.append(exc)

        threads = [threading.Thread(target=call, daemon=True) for _ in range(2)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert not any(t.is_alive() for t in threads), "a thread is stuck (deadlock)"
        assert time.monotonic() - t0 < 5
        # one times out; the other times out too or finds the connection given up
        assert len(errors) == 2 and all(
            isinstance(e, (ClientTimeout, ConnectionLost)) for e in errors
        )
        assert any(isinstance(e, ClientTimeout) for e in errors)
        client.close()
    finally:
        other.close()
