"""The etcd client over etcd's JSON gateway (``transport="gateway"``) against a hostile or
broken endpoint: a fake server on loopback that speaks HTTP/1.1 badly on purpose (issue 29's
attacks; the gRPC transport's are in test_etcd_grpc.py). Every answer it can give -- huge, endless,
malformed, slow, or JSON of the wrong shape -- must end in a bounded, clear EtcdError: never
a hang, never unbounded memory, never another exception type, and a write never reported as
"not applied" once it may have been.

Also the transport's own promises on a server that is not hostile but blunt: a kept-alive
connection the server closed is noticed before a write is sent on it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial

import pytest
import trio

from lockbench.etcd import EtcdCluster
from lockserver.replication._etcd import Etcd, EtcdError, EtcdUnavailable
from lockserver.replication._etcd_http import Endpoint, parse_endpoint

#: Seconds any one test may take (the client's own timeouts are 0.5 s here).
BOUND = 15
#: The client's answer bound in these tests: small, so "too large" is quick to reach.
SMALL = 256 * 1024

Handler = Callable[[trio.SocketStream], Awaitable[None]]


@asynccontextmanager
async def fake_etcd(handler: Handler) -> AsyncIterator[str]:
    """A server on a free loopback port running ``handler`` per connection; its address."""
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
        yield f"127.0.0.1:{listeners[0].socket.getsockname()[1]}"
        nursery.cancel_scope.cancel()


async def read_request(stream: trio.SocketStream) -> bytes:
    """Everything up to the end of one request (head and Content-Length body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    while len(body) < length:
        body += await stream.receive_some(65536)
    return data


def answer(body: bytes, status: str = "200 OK", extra: bytes = b"") -> bytes:
    return (
        b"HTTP/1.1 " + status.encode() + b"\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n" % len(body) + extra + b"\r\n" + body
    )


def replying(*payloads: bytes) -> Handler:
    """A handler answering each request on a connection with the next payload (raw bytes),
    then holding the connection open."""

    async def handler(stream: trio.SocketStream) -> None:
        for payload in payloads:
            if not await read_request(stream):
                return
            await stream.send_all(payload)
        await trio.sleep_forever()

    return handler


def quick(address: str, **options: object) -> Etcd:
    options.setdefault("transport", "gateway")
    return Etcd([address], timeout=0.5, max_answer=SMALL, **options)  # type: ignore[arg-type]


# --- huge, endless, slow ------------------------------------------------------------------------


async def test_a_huge_announced_answer_is_refused_before_its_body() -> None:
    """A Content-Length of 10 GB: refused as soon as the head arrives (no byte of the body
    read), a read raises EtcdUnavailable naming the size, a write says it may have applied."""
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 10000000000\r\n\r\n"
    with trio.fail_after(BOUND):
        async with fake_etcd(replying(head, head)) as address, quick(address) as etcd:
            with pytest.raises(EtcdUnavailable, match="announces 10000000000 bytes"):
                await etcd.get(b"k")
            with pytest.raises(EtcdUnavailable, match="may or may not") as caught:
                await etcd.put(b"k", b"v")
            assert caught.value.maybe_applied


async def test_an_endless_chunked_answer_stops_at_the_bound() -> None:
    """A chunked answer that never ends: the client stops reading past ``max_answer`` and
    raises; the server meanwhile finds the connection closed."""
    sent = [0]

    async def endless(stream: trio.SocketStream) -> None:
        await read_request(stream)
        await stream.send_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"%x\r\n%s\r\n" % (65536, b"x" * 65536)
        try:
            while sent[0] < 1000 * 65536:  # bounded: 64 MiB at most, 250x the client's bound
                await stream.send_all(chunk)
                sent[0] += 65536
        except trio.BrokenResourceError:
            pass

    with trio.fail_after(BOUND):
        async with fake_etcd(endless) as address, quick(address) as etcd:
            with pytest.raises(EtcdUnavailable, match=f"larger than {SMALL} bytes"):
                await etcd.get(b"k")
    assert sent[0] < 400 * 65536  # it stopped reading long before the server's end


async def test_a_slow_answer_is_cut_at_the_timeout() -> None:
    """An answer trickling one byte every 50 ms: the call ends after ``timeout`` (0.5 s)
    with EtcdUnavailable, not when (if ever) the answer completes."""

    async def trickle(stream: trio.SocketStream) -> None:
        await read_request(stream)
        for byte in answer(b'{"header":{}}' + b" " * 10000):
            await stream.send_all(bytes([byte]))
            await trio.sleep(0.05)

    with trio.fail_after(BOUND):
        async with fake_etcd(trickle) as address, quick(address) as etcd:
            with pytest.raises(EtcdUnavailable, match="no answer within the timeout"):
                await etcd.get(b"k")


async def test_a_server_that_never_answers_is_a_timeout() -> None:
    """Accepting and reading the request, never answering: EtcdUnavailable after timeout;
    a write says it may have applied (the request went out)."""
    with trio.fail_after(BOUND):
        async with fake_etcd(replying()) as address, quick(address) as etcd:
            with pytest.raises(EtcdUnavailable) as caught:
                await etcd.put(b"k", b"v")
            assert caught.value.maybe_applied


async def test_an_endless_head_is_refused() -> None:
    """Header lines that never end (64 KiB of them, no blank line): h11's bound on a head
    ends it with an error, not a buffer that grows."""

    async def endless_head(stream: trio.SocketStream) -> None:
        await read_request(stream)
        await stream.send_all(b"HTTP/1.1 200 OK\r\n")
        for i in range(4096):
            await stream.send_all(b"X-Filler-%d: %s\r\n" % (i, b"y" * 16))
        await trio.sleep_forever()

    with trio.fail_after(BOUND):
        async with fake_etcd(endless_head) as address, quick(address) as etcd:
            with pytest.raises(EtcdUnavailable, match="not valid HTTP"):
                await etcd.get(b"k")


# --- malformed ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        (b"SSH-2.0-OpenSSH_9.0\r\n\r\n", "not valid HTTP"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", "not valid HTTP"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n", "HTTP"),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            "not valid HTTP",
        ),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort", "complete message body"),
    ],
)
async def test_malformed_http_is_a_clear_error(payload: bytes, words: str) -> None:
    """Whatever bytes come back that are not HTTP/1.1: EtcdUnavailable naming the problem
    (the server closes after them)."""

    async def once(stream: trio.SocketStream) -> None:
        await read_request(stream)
        await stream.send_all(payload)
        await stream.aclose()

    with trio.fail_after(BOUND):
        async with fake_etcd(once) as address, quick(address) as etcd:
            with pytest.raises(EtcdUnavailable, match=words):
                await etcd.get(b"k")


@pytest.mark.parametrize(
    ("body", "call"),
    [
        (b'{"header": []}', "put"),
        (b'{"header": {"revision": "one"}}', "put"),
        (b'{"header": {"revision": "' + b"9" * 5000 + b'"}}', "put"),
        (b'{"kvs": "nope"}', "get"),
        (b'{"kvs": [{"key": "!!!not base64", "value": ""}]}', "get"),
        (b'{"kvs": [17]}', "get"),
        (b"[" * 100_000 + b"]" * 100_000, "get"),
        (b'{"succeeded": true, "responses": [1, 2, 3]}', "txn"),
        (b'"just a string"', "get"),
        (b'{"ID": {"x": 1}, "TTL": "5"}', "lease"),
        (b'{"header": {}, "kvs": [], "more": true}', "prefix"),
        (b'{"header": {"revision": "1"}, "kvs": ' + b"[" * 50 + b"]" * 50 + b"}", "prefix"),
        (b'{"error": ["not", "an", "object"], "code": "x"}', "get"),
    ],
)
async def test_json_of_the_wrong_shape_is_an_etcd_error(body: bytes, call: str) -> None:
    """JSON that etcd would never send (wrong types, bad base64, numbers past int64's digits,
    nesting too deep for the parser, a listing that says "more" with nothing in it): an
    EtcdError naming the endpoint, never a TypeError or a RecursionError."""
    calls = {
        "put": lambda e: e.put(b"k", b"v"),
        "get": lambda e: e.get(b"k"),
        "txn": lambda e: e.put_if_absent(b"k", b"v"),
        "lease": lambda e: e.lease_grant(5),
        "prefix": lambda e: e.get_prefix(b"p/"),
    }
    with trio.fail_after(BOUND):
        async with fake_etcd(replying(*[answer(body)] * 5)) as address, quick(address) as etcd:
            try:
                result = await calls[call](etcd)
            except EtcdError as e:
                assert address in str(e)
                return
            # Only the empty listing that says "more" may be read as what it is: empty.
            assert call == "prefix" and result[0] == []


async def test_a_failover_skips_a_hostile_endpoint_for_reads(etcd1: EtcdCluster) -> None:
    """A hostile endpoint listed first (it answers garbage): reads fail over to the real
    etcd and the client keeps using that one."""
    garbage = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n{{{"
    with trio.fail_after(BOUND):
        async with (
            fake_etcd(replying(garbage, garbage)) as address,
            Etcd([address, *etcd1.endpoints], timeout=2.0, transport="gateway") as etcd,
        ):
            for _ in range(3):
                assert await etcd.get(b"absent") is None
            assert etcd.endpoint == f"http://{etcd1.endpoints[0]}"


# --- watches ------------------------------------------------------------------------------------


def stream_head() -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


CREATED = json.dumps({"result": {"header": {}, "created": True}}).encode() + b"\n"


def watching(*pieces: bytes, then_sleep: bool = True) -> Handler:
    """A watch endpoint: the stream head, "created", then ``pieces`` as chunks."""

    async def handler(stream: trio.SocketStream) -> None:
        await read_request(stream)
        await stream.send_all(stream_head() + chunk(CREATED))
        for piece in pieces:
            await stream.send_all(chunk(piece))
        if then_sleep:
            await trio.sleep_forever()
        await stream.send_all(b"0\r\n\r\n")

    return handler


async def first_batch(address: str) -> object:
    async with quick(address) as etcd, etcd.watch(b"p/", start_revision=1) as events:
        return await events.__anext__()


async def test_a_watch_line_that_never_ends_is_bounded() -> None:
    """A watch answer line that grows past ``max_answer`` without a newline: the stream
    raises EtcdUnavailable saying so."""
    with trio.fail_after(BOUND):
        async with fake_etcd(watching(*[b"x" * 65536] * 8)) as address:
            with pytest.raises(EtcdUnavailable, match=f"longer than {SMALL} bytes"):
                await first_batch(address)


async def test_a_watch_line_that_stalls_is_cut() -> None:
    """A watch answer that begins and then stops (no newline, no more bytes): EtcdUnavailable
    after ``timeout``, while waiting for the *next* line is unbounded (a quiet group)."""
    with trio.fail_after(BOUND):
        async with fake_etcd(watching(b'{"result": {"events": [')) as address:
            with pytest.raises(EtcdUnavailable, match=r"did not arrive whole within 0\.5 s"):
                await first_batch(address)
        async with fake_etcd(watching()) as address:
            with trio.move_on_after(1.5) as waited:
                await first_batch(address)
            assert waited.cancelled_caught


@pytest.mark.parametrize(
    ("line", "words"),
    [
        (b"not json\n", "no JSON"),
        (b'{"result": "x"}\n', "cannot read"),
        (b'{"result": {"events": "x"}}\n', "cannot read"),
        (b'{"result": {"events": [{"kv": []}]}}\n', "cannot read"),
        (b'{"result": {"events": [{"kv": {"key": "%%%"}}]}}\n', "cannot read"),
        (b'{"error": {"grpc_code": 14, "message": "boom"}}\n', "boom"),
        (b'{"result": {"canceled": true, "cancel_reason": "gone"}}\n', "gone"),
    ],
)
async def test_a_malformed_watch_line_is_an_etcd_error(line: bytes, words: str) -> None:
    """Each kind of bad watch line ends the stream with an EtcdError naming it."""
    with trio.fail_after(BOUND):
        async with fake_etcd(watching(line)) as address:
            with pytest.raises(EtcdError, match=words):
                await first_batch(address)


async def test_a_watch_stream_that_ends_raises() -> None:
    """The server ending the stream (a clean end of the chunked answer): EtcdUnavailable,
    so the caller resumes; never a quiet end of iteration."""
    with trio.fail_after(BOUND):
        async with fake_etcd(watching(then_sleep=False)) as address:
            with pytest.raises(EtcdUnavailable, match="ended the watch stream"):
                await first_batch(address)


async def test_endless_fragments_of_one_revision_are_bounded() -> None:
    """Fragments that keep adding events to one revision (etcd never sends that: one
    revision is one request, at most etcd's request limit): the held-back events are
    bounded by ``max_answer`` too."""
    event = {"kv": {"key": "cC94", "value": "eHh4" * 4000, "mod_revision": "7"}}
    piece = json.dumps({"result": {"events": [event] * 8, "fragment": True}}).encode() + b"\n"
    with trio.fail_after(BOUND):
        async with fake_etcd(watching(*[piece] * 20)) as address:
            with pytest.raises(EtcdUnavailable, match="across fragments"):
                await first_batch(address)


async def test_fragments_are_joined_at_revision_boundaries() -> None:
    """A response cut in fragments: each batch ends at a revision boundary (revision 7's
    events, split across two fragments, arrive in one batch)."""

    def event(key: str, revision: int) -> dict[str, object]:
        return {"kv": {"key": key, "value": "", "mod_revision": str(revision)}}

    pieces = [
        {"events": [event("cC8x", 6), event("cC8y", 7)], "fragment": True},
        {"events": [event("cC8z", 7), event("cC8w", 8)]},
    ]
    lines = [json.dumps({"result": p}).encode() + b"\n" for p in pieces]
    with trio.fail_after(BOUND):
        async with (
            fake_etcd(watching(*lines)) as address,
            quick(address) as etcd,
            etcd.watch(b"p/", start_revision=1) as events,
        ):
            first = await events.__anext__()
            second = await events.__anext__()
    assert [e.mod_revision for e in first] == [6]
    assert [e.mod_revision for e in second] == [7, 7, 8]


# --- kept-alive connections ---------------------------------------------------------------------


async def test_a_kept_alive_connection_the_server_closed_is_not_used_for_a_write() -> None:
    """A server that answers, then closes the idle connection: the next put sees the close
    before sending (a peek), opens a new connection and succeeds, never "maybe applied"."""
    puts = [0]
    ok = answer(b'{"header": {"revision": "5"}}')

    async def close_after_each(stream: trio.SocketStream) -> None:
        if await read_request(stream):
            puts[0] += 1
            await stream.send_all(ok)
        await stream.aclose()

    with trio.fail_after(BOUND):
        async with fake_etcd(close_after_each) as address, quick(address) as etcd:
            for _ in range(5):
                assert await etcd.put(b"k", b"v") == 5
                await trio.sleep(0.05)  # the server's close arrives
            assert puts[0] == 5
            assert etcd.statistics().connections_opened == 5


async def test_connections_are_reused_against_etcd(etcd1: EtcdCluster) -> None:
    """Against etcd, sequential calls share one kept-alive connection."""
    with trio.fail_after(BOUND):
        async with Etcd(etcd1.endpoints, transport="gateway") as etcd:
            for i in range(20):
                await etcd.put(b"reuse", b"%d" % i)
                await etcd.get(b"reuse")
            assert etcd.statistics().connections_opened == 1


# --- endpoints ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "endpoint"),
    [
        ("h:1", Endpoint("http", "h", 1)),
        ("https://h:2/", Endpoint("https", "h", 2)),
        ("HTTPS://h:2", Endpoint("https", "h", 2)),
        ("[::1]:2379", Endpoint("http", "::1", 2379)),
        ("https://[fe80::1]:2379", Endpoint("https", "fe80::1", 2379)),
    ],
)
def test_endpoints_parse(text: str, endpoint: Endpoint) -> None:
    """HOST:PORT, with an optional http/https scheme; IPv6 in brackets."""
    assert parse_endpoint(text) == endpoint
    assert parse_endpoint(endpoint.url) == endpoint


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("ftp://h:1", "scheme is http:// or https://"),
        ("h", "not HOST:PORT"),
        ("h:0", "not HOST:PORT"),
        ("h:65536", "not HOST:PORT"),
        ("h:12x", "not HOST:PORT"),
        ("https://h:1/v3", "only HOST:PORT"),
        ("https://user@h:1", "only HOST:PORT"),
        ("::1:2379", "brackets"),
        ("[]:1", "brackets hold an IPv6"),
        ("a b:1", "no spaces"),
    ],
)
def test_bad_endpoints_are_refused(text: str, words: str) -> None:
    """Each malformed endpoint is a ValueError naming it and the rule."""
    with pytest.raises(ValueError, match=words):
        parse_endpoint(text)


def test_mixed_schemes_and_tls_on_plain_endpoints_are_refused() -> None:
    """One cluster, one way in: http and https endpoints together are refused, and so are
    TLS settings with plain endpoints."""
    import ssl

    with pytest.raises(ValueError, match="mix http:// and https://"):
        Etcd(["http://a:1", "https://b:2"])
    with pytest.raises(ValueError, match="plain http://"):
        Etcd(["http://a:1"], tls=ssl.create_default_context())
    with pytest.raises(ValueError, match="both a user and a password"):
        Etcd(["a:1"], user="u")
    assert Etcd(["a:1"], tls=ssl.create_default_context()).endpoints == ("https://a:1",)
