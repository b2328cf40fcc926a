"""The fenced resource: a write is accepted only with a fence at least the highest accepted
for its lock, every write offered is recorded with its verdict, and bad input is answered
with an error, recorded nowhere, and changes nothing."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator

import pytest

from lockbench.faults import ResourceWrite
from lockbench.faults._resource import MAX_LINE, FencedResource, ResourceClient


@pytest.fixture
def resource() -> Iterator[tuple[FencedResource, list[ResourceWrite]]]:
    records: list[ResourceWrite] = []
    ticks = iter(range(1_000_000))
    store = FencedResource("127.0.0.1", lambda: float(next(ticks)), records.append).start()
    try:
        yield store, records
    finally:
        store.close()


def _raw(address: tuple[str, int], payload: bytes) -> list[dict[str, object]]:
    with socket.create_connection(address, timeout=5) as s:
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return [json.loads(line) for line in data.splitlines()]


def test_fences_order_the_writes_per_lock(
    resource: tuple[FencedResource, list[ResourceWrite]],
) -> None:
    """Equal or higher fences pass, a lower one is refused (and says the highest), and each
    lock has its own highest fence."""
    store, records = resource
    client = ResourceClient(store.address)
    try:
        assert client.write("m0", "a", 10) == (True, None)
        assert client.write("m0", "a", 10) == (True, 10)  # the same holder writes twice
        assert client.write("m0", "b", 12) == (True, 10)
        assert client.write("m0", "a", 10) == (False, 12)  # the stale holder is refused
        assert client.write("m1", "c", 3) == (True, None)  # another lock, its own order
    finally:
        client.close()
    assert [(r.lock, r.holder, r.fence, r.accepted, r.highest) for r in records] == [
        ("m0", "a", 10, True, None),
        ("m0", "a", 10, True, 10),
        ("m0", "b", 12, True, 10),
        ("m0", "a", 10, False, 12),
        ("m1", "c", 3, True, None),
    ]
    assert [r.time for r in records] == sorted(r.time for r in records)
    assert (store.accepted, store.refused) == (4, 1)


@pytest.mark.parametrize(
    ("line", "why"),
    [
        (b"not json\n", "not JSON"),
        (b"[1, 2]\n", "JSON object"),
        (b'{"lock": "", "holder": "a", "fence": 1}\n', "lock"),
        (b'{"lock": "m", "holder": 5, "fence": 1}\n', "holder"),
        (b'{"lock": "m", "holder": "a", "fence": "7"}\n', "fence"),
        (b'{"lock": "m", "holder": "a", "fence": -1}\n', "fence"),
        (b'{"lock": "m", "holder": "a", "fence": true}\n', "fence"),
        (b'{"lock": "m", "holder": "a"}\n', "fence"),
        (b"x" * (MAX_LINE + 10) + b"\n", "at most"),
        (b'{"lock": "m", "holder": "a", "fence": 1}', "at most"),  # no newline: torn
    ],
)
def test_bad_input_is_answered_and_recorded_nowhere(
    resource: tuple[FencedResource, list[ResourceWrite]], line: bytes, why: str
) -> None:
    """Each malformed write gets one error line naming the problem, then the connection ends;
    nothing is recorded and the highest fences do not move."""
    store, records = resource
    answers = _raw(store.address, line)
    assert len(answers) == 1
    assert why in str(answers[0]["error"])
    assert records == []
    assert store.highest == {}
    assert store.errors == 1


def test_a_bad_line_after_good_ones_keeps_what_was_done(
    resource: tuple[FencedResource, list[ResourceWrite]],
) -> None:
    """Good writes before a bad line stand; the bad one ends the connection."""
    store, records = resource
    answers = _raw(
        store.address,
        b'{"lock": "m", "holder": "a", "fence": 5}\n{"lock": 1}\n'
        b'{"lock": "m", "holder": "a", "fence": 9}\n',
    )
    assert answers[0] == {"accepted": True, "highest": None}
    assert "error" in answers[1]
    assert len(answers) == 2  # the third line was never read
    assert [r.fence for r in records] == [5]


def test_concurrent_writers_get_decisions_in_record_order(
    resource: tuple[FencedResource, list[ResourceWrite]],
) -> None:
    """Many connections at once: the records' order is the decisions' order, so replaying
    the records reproduces every verdict."""
    store, records = resource

    def writer(k: int) -> None:
        client = ResourceClient(store.address)
        try:
            for i in range(50):
                assert client.write("m", f"w{k}", (i * 7 + k * 13) % 100) is not None
        finally:
            client.close()

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(records) == 400
    highest: int | None = None
    for r in records:
        assert r.highest == highest
        assert r.accepted == (highest is None or (r.fence is not None and r.fence >= highest))
        if r.accepted:
            highest = r.fence


def test_the_client_reports_an_unreachable_resource_as_none() -> None:
    """No resource listening: the write's fate is unknown to the client (None), no crash."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = s.getsockname()
    client = ResourceClient(address, timeout=1)
    assert client.write("m", "a", 1) is None
    client.close()
