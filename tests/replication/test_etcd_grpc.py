"""The etcd client's gRPC transport (the default, ``Etcd(..., transport="grpc")``,
``etcd://``): every call through etcd's gRPC API directly (HTTP/2 with h2, protobuf), issue 29.
(tests/replication/test_etcd_client.py and test_etcd_security.py run each of their tests over
both transports; this module holds what is the gRPC transport's own.)

Against real etcd members: the same results and errors as the gateway (every kind of call
side by side, a put's revision, a watch's batches in order, a missing lease, a compacted
start), connections kept, a group of replicas running through ``etcd://`` and one through
``etcd+gateway://``, and TLS with client certificates and auth (the token sent as gRPC's
``token`` metadata, renewed when etcd revokes it).

Against a hostile server (h2's own server side on loopback, speaking gRPC badly on purpose):
a message larger than the bound, a stream reset, garbage instead of HTTP/2, a message that is
not protobuf, a grpc-status of etcd's: each a clear, bounded EtcdError (a write that may have
gone out says so), and the next call opens a new connection. And etcd's PINGs (it sends one
as each request arrives): acknowledged with the next request during a unary call, at once
when a server floods them or during a watch.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import attrs
import h2.config
import h2.connection
import h2.events
import pytest
import trio

from lockbench.etcd import ETCD, SKIP_REASON, EtcdCluster, started, wipe
from lockserver import ServerConfig
from lockserver.replication import _etcd_rpc_pb2 as pb
from lockserver.replication._etcd import (
    MAX_VALUE,
    Compacted,
    Compare,
    Etcd,
    EtcdError,
    EtcdUnavailable,
    KeyValue,
    LeaseGone,
    TxnDelete,
    TxnPut,
    TxnRange,
    TxnResult,
    prefix_end,
)
from lockserver.replication._etcd_access import etcd_endpoints, etcd_transport

from .test_etcd_security import two_replicas_hand_a_lock_over

#: Seconds any one test may take.
BOUND = 30

_groups = itertools.count()


def grpc(cluster: EtcdCluster, **changes: object) -> Etcd:
    """A gRPC client of ``cluster`` as a replica would be."""
    options: dict[str, object] = {**cluster.client_options(), **changes}
    return Etcd(cluster.urls, timeout=2.0, transport="grpc", **options)  # type: ignore[arg-type]


# --- against etcd -------------------------------------------------------------------------------


async def test_puts_and_watches_over_grpc_agree_with_the_gateway(etcd1: EtcdCluster) -> None:
    """Puts through gRPC return the revisions a gateway read sees; a gRPC watch from before
    them gives every put and delete, in order, with keys, values and revisions."""
    with trio.fail_after(BOUND):
        async with grpc(etcd1) as etcd, Etcd(etcd1.endpoints, transport="gateway") as gateway:
            assert etcd.transport == "grpc" and gateway.transport == "gateway"
            start = await gateway.current_revision() + 1
            revisions = [await etcd.put(b"/w/%d" % i, b"v%d" % i) for i in range(5)]
            assert revisions == list(range(start, start + 5))
            kv = await gateway.get(b"/w/4")
            assert kv is not None and (kv.value, kv.mod_revision) == (b"v4", revisions[-1])
            assert await gateway.delete(b"/w/0") == 1
            deleted = revisions[-1] + 1
            seen = []
            async with etcd.watch(b"/w/", start_revision=start) as batches:
                async for batch in batches:
                    seen += [(e.kind, e.key, e.value, e.mod_revision) for e in batch]
                    if seen[-1][3] == deleted:
                        break
            assert seen == [
                *[("put", b"/w/%d" % i, b"v%d" % i, revisions[i]) for i in range(5)],
                ("delete", b"/w/0", b"", deleted),
            ]


async def calls(etcd: Etcd, p: bytes) -> list[object]:
    """Every kind of call of the client under prefix ``p``, and what each returned, with
    revisions counted from the first and the lease ID replaced by its name."""
    base = await etcd.current_revision()
    lease, ttl = await etcd.lease_grant(30)

    def norm(value: object) -> object:
        if isinstance(value, KeyValue):
            return attrs.evolve(
                value,
                key=value.key.removeprefix(p),
                mod_revision=value.mod_revision - base,
                create_revision=value.create_revision - base,
                lease=value.lease and -1,
            )
        if isinstance(value, TxnResult):
            return (value.succeeded, value.revision - base, norm(value.results))
        if isinstance(value, tuple | list):
            return [norm(v) for v in value]
        return value

    out: list[object] = [ttl]
    out.append(await etcd.put(p + b"1", b"one") - base)
    out.append(await etcd.put(p + b"2", b"two", lease=lease) - base)
    out.append(norm(await etcd.get(p + b"1")))
    out.append(norm(await etcd.get(p + b"none")))
    kvs, at = await etcd.get_prefix(p)
    out += [norm(kvs), at - base, await etcd.mod_revision(p + b"1") - base]
    out.append(norm(await etcd.get_prefix(p, limit=1))[0])  # type: ignore[index]
    one = base + 1
    out.append(
        norm(
            await etcd.txn(
                [
                    Compare(p + b"1", "mod_revision", "==", one),
                    Compare(p + b"1", "value", "==", b"one"),
                ],
                [TxnPut(p + b"3", b"three"), TxnRange(p, prefix_end(p)), TxnDelete(p + b"2")],
            )
        )
    )
    out.append(
        norm(
            await etcd.txn(
                [Compare(p + b"1", "version", ">", 5)], [TxnDelete(p)], [TxnRange(p + b"1")]
            )
        )
    )
    ok, revision = await etcd.put_if_absent(p + b"1", b"again")
    out.append((ok, revision - base))
    ok, revision = await etcd.put_if_mod_revision(p + b"1", b"uno", one)
    out.append((ok, revision - base))
    out.append(await etcd.lease_keepalive(lease))
    out.append((await etcd.lease_time_to_live(lease))[1])
    out += [await etcd.lease_revoke(lease), await etcd.lease_revoke(lease)]
    out.append(await etcd.lease_time_to_live(lease))
    with pytest.raises(LeaseGone) as gone:
        await etcd.lease_keepalive(lease)
    out.append(gone.value.lease_id == lease)
    out.append(await etcd.delete(p + b"3"))
    out.append(await etcd.delete_prefix(p))
    status = await etcd.status()
    out.append(sorted(status))
    out.append(status["revision"] - base)
    last = await etcd.put(p + b"4", b"four")
    await etcd.compact(last)
    await etcd.compact(last)  # twice: not an error
    with pytest.raises(Compacted) as compacted:
        await etcd.get_prefix(p, revision=one)
    out.append(compacted.value.compact_revision - base)
    with pytest.raises(EtcdError, match="future revision") as future:
        await etcd.get_prefix(p, revision=last + 100)
    out.append(future.value.code)
    return out


async def test_every_call_gives_the_same_results_both_ways(etcd1: EtcdCluster) -> None:
    """The same calls (keys, listings, transactions with compares and each kind of
    operation, deletes, leases, status, compaction and its errors) give the same results
    through gRPC and through the gateway."""
    with trio.fail_after(BOUND):
        async with grpc(etcd1) as etcd, Etcd(etcd1.endpoints, transport="gateway") as gateway:
            over_grpc = await calls(etcd, b"/same/grpc/")
            over_gateway = await calls(gateway, b"/same/gateway/")
    assert over_grpc == over_gateway
    assert over_grpc[1:3] == [1, 2]  # the sequence ran (revisions counted from the base)


async def test_a_put_on_a_missing_lease_is_lease_gone(etcd1: EtcdCluster) -> None:
    """etcd's refusal over gRPC is the same EtcdError as over the gateway: LeaseGone naming
    the lease, and nothing written."""
    with trio.fail_after(BOUND):
        async with grpc(etcd1) as etcd:
            with pytest.raises(LeaseGone) as caught:
                await etcd.put(b"/l", b"x", lease=123456789)
            assert caught.value.lease_id == 123456789
            assert await etcd.get(b"/l") is None


async def test_a_watch_from_a_compacted_revision_raises_compacted(etcd1: EtcdCluster) -> None:
    """A gRPC watch asked to start before etcd's compaction raises Compacted with etcd's
    compact revision."""
    with trio.fail_after(BOUND):
        async with grpc(etcd1) as etcd:
            first = await etcd.put(b"/c", b"1")
            last = await etcd.put(b"/c", b"2")
            await etcd.compact(last)
            with pytest.raises(Compacted) as caught:
                async with etcd.watch(b"/c", start_revision=first) as batches:
                    await batches.__anext__()
            assert caught.value.compact_revision == last


async def test_grpc_connections_are_kept(etcd1: EtcdCluster) -> None:
    """Sequential puts share one HTTP/2 connection; a watch has one of its own."""
    with trio.fail_after(BOUND):
        async with grpc(etcd1) as etcd:
            for i in range(20):
                await etcd.put(b"/k", b"%d" % i)
            assert etcd.statistics().connections_opened == 1
            async with etcd.watch(b"/k", start_revision=1):
                pass
            assert etcd.statistics().connections_opened == 2


@pytest.mark.parametrize(
    ("scheme", "transport"), [("etcd://", "grpc"), ("etcd+gateway://", "gateway")]
)
async def test_a_group_runs_through_either_transport(
    etcd1: EtcdCluster, scheme: str, transport: str
) -> None:
    """Two replicas given ``etcd://`` (gRPC) or ``etcd+gateway://``: a lock granted through
    one is refused through the other, released, then granted there; both replicas' clients
    speak the transport named."""
    config = ServerConfig(
        port=0,
        replicate=scheme + ",".join(etcd1.endpoints),
        group=f"g{next(_groups)}",
        replica_lease_ttl=2,
    )
    with trio.fail_after(BOUND):
        async with two_replicas_hand_a_lock_over(config) as replicas:
            for running in replicas:
                assert running.replica.etcd.transport == transport


@pytest.mark.parametrize(
    ("text", "transport", "urls"),
    [
        ("etcd://a:1,b:2", "grpc", ("http://a:1", "http://b:2")),
        ("etcds://a:1", "grpc", ("https://a:1",)),
        ("https://a:1", "grpc", ("https://a:1",)),
        ("etcd+grpc://a:1,b:2", "grpc", ("http://a:1", "http://b:2")),
        ("ETCDS+GRPC://a:1", "grpc", ("https://a:1",)),
        ("etcd+gateway://a:1", "gateway", ("http://a:1",)),
        ("Etcds+Gateway://a:1,b:2", "gateway", ("https://a:1", "https://b:2")),
    ],
)
def test_replicate_names_the_transport(text: str, transport: str, urls: tuple[str, ...]) -> None:
    """gRPC is the default; ``+gateway`` asks for the JSON gateway, ``+grpc`` is accepted."""
    assert etcd_transport(text) == transport
    assert etcd_endpoints(text) == urls


def test_the_transport_is_checked() -> None:
    assert Etcd(["127.0.0.1:1"]).transport == "grpc"
    with pytest.raises(ValueError, match="transport"):
        Etcd(["127.0.0.1:1"], transport="http3")  # type: ignore[arg-type]


async def test_a_context_set_for_h2_is_refused_by_the_gateway(secure: EtcdCluster) -> None:
    """A gRPC client sets its TLS context to offer h2 (ALPN); given to a gateway client too,
    that context is refused with a clear error instead of h11 meeting HTTP/2."""
    tls = secure.client_options()["tls"]
    with trio.fail_after(BOUND):
        async with grpc(secure, tls=tls) as etcd:
            await etcd.put(b"/lockserver/h2", b"v")
        async with Etcd(
            secure.urls, transport="gateway", **{**secure.client_options(), "tls": tls}
        ) as gateway:
            with pytest.raises(EtcdUnavailable, match="negotiated h2"):
                await gateway.get(b"/lockserver/h2")


# --- TLS, client certificates and auth ----------------------------------------------------------


@pytest.fixture(scope="module")
def secure_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    if ETCD is None:
        pytest.skip(SKIP_REASON)
    yield from started(
        tmp_path_factory.mktemp("secure"), 1, tls=True, client_cert_auth=True, auth=True
    )


@pytest.fixture
def secure(secure_module: EtcdCluster) -> EtcdCluster:
    if not secure_module.healthy(0):
        secure_module.restart(0)
    wipe(secure_module)
    return secure_module


async def test_grpc_through_tls_client_certificates_and_auth(secure: EtcdCluster) -> None:
    """Over mutual TLS (ALPN h2) with etcd's auth: puts and a watch carry the token as gRPC
    metadata; a revoked token (a password change) is renewed by itself and the put after it
    is applied exactly once (the key's version counts the puts)."""
    with trio.fail_after(BOUND):
        async with grpc(secure) as etcd:
            first = await etcd.put(b"/lockserver/t", b"1")
            assert etcd.statistics().tokens == 1
            secure.change_password()
            second = await etcd.put(b"/lockserver/t", b"2")
            assert etcd.statistics().tokens == 2
            kv = await etcd.get(b"/lockserver/t")
            assert kv is not None and (kv.value, kv.version) == (b"2", 2)
            async with etcd.watch(b"/lockserver/t", start_revision=first) as batches:
                seen = [e.mod_revision for e in await batches.__anext__()]
                while seen[-1] < second:
                    seen += [e.mod_revision for e in await batches.__anext__()]
            assert seen == [first, second]


async def test_grpc_outside_the_users_prefix_is_refused(secure: EtcdCluster) -> None:
    """etcd's permission check answers the gRPC call: a clear auth error, nothing written."""
    with trio.fail_after(BOUND):
        async with grpc(secure) as etcd:
            with pytest.raises(EtcdError, match="permission"):
                await etcd.put(b"/elsewhere", b"x")


# --- a hostile server ---------------------------------------------------------------------------

Handler = Callable[[trio.SocketStream], Awaitable[None]]


@asynccontextmanager
async def fake_etcd(handler: Handler) -> AsyncIterator[tuple[str, list[int]]]:
    """A server on a free loopback port running ``handler`` per connection: its address and
    a list counting the connections it took."""
    count: list[int] = []

    async def counted(stream: trio.SocketStream) -> None:
        count.append(1)
        await handler(stream)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, counted, 0, host="127.0.0.1"))
        yield f"127.0.0.1:{listeners[0].socket.getsockname()[1]}", count
        nursery.cancel_scope.cancel()


def frame(message: bytes, *, length: int | None = None, flag: int = 0) -> bytes:
    return struct.pack(">BI", flag, len(message) if length is None else length) + message


Reply = Callable[[h2.connection.H2Connection, int], None]


async def h2_server(stream: trio.SocketStream) -> h2.connection.H2Connection:
    """h2's server side on ``stream``, its preface sent."""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    conn.initiate_connection()
    await stream.send_all(conn.data_to_send())
    return conn


def serving(reply: Reply, raw: bytes = b"") -> Handler:
    """An HTTP/2 server that answers each request (once its headers are in) with ``reply``
    and then the bytes ``raw`` as they are, and keeps the connection open."""

    async def handler(stream: trio.SocketStream) -> None:
        conn = await h2_server(stream)
        while data := await stream.receive_some(65536):
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.RequestReceived):
                    reply(conn, event.stream_id)
                    await stream.send_all(conn.data_to_send() + raw)
            await stream.send_all(conn.data_to_send())
        await trio.sleep_forever()

    return handler


def grpc_headers(conn: h2.connection.H2Connection, stream: int) -> None:
    conn.send_headers(stream, [(":status", "200"), ("content-type", "application/grpc")])


def answering(data: bytes, status: str = "0", message: str = "") -> Reply:
    def reply(conn: h2.connection.H2Connection, stream: int) -> None:
        grpc_headers(conn, stream)
        if data:
            conn.send_data(stream, data)
        conn.send_headers(stream, [("grpc-status", status), ("grpc-message", message)], True)

    return reply


def resetting(conn: h2.connection.H2Connection, stream: int) -> None:
    conn.reset_stream(stream, error_code=2)


def quick(address: str) -> Etcd:
    return Etcd([address], timeout=0.5, transport="grpc", max_answer=64 * 1024)


def put_answer(revision: int) -> bytes:
    answer: bytes = pb.PutResponse(header=pb.ResponseHeader(revision=revision)).SerializeToString()
    return answer


@pytest.mark.parametrize(
    ("reply", "words"),
    [
        (answering(frame(b"", length=10**9)), "more than 65536"),
        (answering(frame(b"x" * 10, flag=1)), "compressed"),
        (answering(frame(b"\xff\xff\xff")), "cannot read"),
        (answering(frame(b"abc", length=10)), "middle of a message"),
        (answering(b""), "without an answer"),
        (answering(frame(put_answer(1)) * 2), "more than one message"),
        (resetting, "reset"),
    ],
    ids=["huge", "compressed", "not-protobuf", "cut", "empty", "two", "reset"],
)
async def test_a_hostile_answer_to_a_put_is_a_clear_maybe_applied_error(
    reply: Reply, words: str
) -> None:
    """Every broken answer to a put is an EtcdUnavailable naming what is wrong, the put
    maybe applied (it was sent); when the transport broke, the next call opens a new
    connection."""
    with trio.fail_after(BOUND):
        async with fake_etcd(serving(reply)) as (address, connections), quick(address) as etcd:
            for attempt in (1, 2):
                with pytest.raises(EtcdUnavailable, match=words) as caught:
                    await etcd.put(b"/k", b"v")
                # The put may be in (it was sent).
                assert caught.value.maybe_applied
                if "cannot read" in words:
                    # HTTP/2 ended the call cleanly, only its message is unreadable (as an
                    # answer that is not JSON from the gateway): the connection stays in use.
                    assert len(connections) == 1
                else:
                    # The transport failed: the connection is dropped.
                    assert len(connections) == attempt


async def test_a_frame_larger_than_http2_allows_is_a_clear_error() -> None:
    """A DATA frame over the 16 KiB we allow (SETTINGS_MAX_FRAME_SIZE): a clear error, the
    put maybe applied, the connection dropped."""
    oversized = struct.pack(">I", 20000)[1:] + b"\0\0" + struct.pack(">I", 1) + b"x" * 20000
    with trio.fail_after(BOUND):
        async with (
            fake_etcd(serving(grpc_headers, oversized)) as (address, connections),
            quick(address) as etcd,
        ):
            with pytest.raises(EtcdUnavailable, match="FrameTooLarge") as caught:
                await etcd.put(b"/k", b"v")
            assert caught.value.maybe_applied
            with pytest.raises(EtcdUnavailable):
                await etcd.put(b"/k", b"v")
            assert len(connections) == 2


async def test_etcds_grpc_status_is_its_error() -> None:
    """A grpc-status other than OK is etcd's error with its message (percent-decoded)."""
    reply = answering(b"", status="9", message="etcdserver%3A something refused")
    with trio.fail_after(BOUND):
        async with fake_etcd(serving(reply)) as (address, _), quick(address) as etcd:
            with pytest.raises(EtcdError, match="etcdserver: something refused") as caught:
                await etcd.put(b"/k", b"v")
            assert caught.value.code == 9


async def test_garbage_instead_of_http2_is_a_clear_error() -> None:
    """A server that answers with bytes that are not HTTP/2: an EtcdError saying so."""

    async def handler(stream: trio.SocketStream) -> None:
        await stream.receive_some(65536)
        await stream.send_all(b"HTTP/1.1 400 Bad Request\r\n\r\n" + b"\0" * 100)
        await trio.sleep_forever()

    with trio.fail_after(BOUND):
        async with fake_etcd(handler) as (address, _), quick(address) as etcd:
            with pytest.raises(EtcdUnavailable, match="does not speak HTTP/2") as caught:
                await etcd.put(b"/k", b"v")
            assert caught.value.maybe_applied


async def test_a_put_answered_well_returns_its_revision() -> None:
    """The fake server itself is sound: a proper answer is read (so the failures above are
    the hostile answers', not the fake's)."""
    with trio.fail_after(BOUND):
        async with (
            fake_etcd(serving(answering(frame(put_answer(42))))) as (address, connections),
            quick(address) as etcd,
        ):
            assert await etcd.put(b"/k", b"v") == 42
            assert await etcd.put(b"/k", b"v") == 42
            assert len(connections) == 1


@pytest.mark.parametrize(
    ("reply", "words"),
    [
        (answering(frame(b"\xff\xff\xff")), "cannot read.*not a RangeResponse"),
        (answering(b"", status="14", message="etcdserver: no leader"), "no leader"),
        (resetting, "reset"),
        (answering(frame(b"", length=10**9)), "more than 65536"),
    ],
    ids=["not-protobuf", "unavailable", "reset", "huge"],
)
async def test_a_hostile_endpoint_first_is_skipped_by_reads(
    etcd1: EtcdCluster, reply: Reply, words: str
) -> None:
    """A hostile gRPC endpoint listed first: a read (a range, a keepalive, a status) fails
    over to the real etcd, which the client then keeps using; a write (a transaction, a
    delete) that reached the hostile one says it may have been applied and names why."""
    hostile_options: dict[str, Any] = {"timeout": 2.0, "transport": "grpc", "max_answer": 65536}
    with trio.fail_after(BOUND):
        async with fake_etcd(serving(reply)) as (address, _):
            async with Etcd([address, *etcd1.endpoints], **hostile_options) as etcd:
                assert await etcd.get(b"/absent") is None
                assert etcd.endpoint == f"http://{etcd1.endpoints[0]}"
                lease, _ = await etcd.lease_grant(10)
                assert await etcd.lease_keepalive(lease) == 10
            async with Etcd([address, *etcd1.endpoints], **hostile_options) as etcd:
                with pytest.raises(
                    EtcdUnavailable, match=words.replace("RangeResponse", "TxnResponse")
                ) as caught:
                    await etcd.put_if_absent(b"/hostile", b"v")
                assert caught.value.maybe_applied
                assert await etcd.get(b"/hostile") is None  # the real etcd never saw it
            async with quick(address) as etcd:
                with pytest.raises(
                    EtcdUnavailable, match=words.replace("RangeResponse", "StatusResponse")
                ):
                    await etcd.status()


async def test_a_large_request_goes_out_as_flow_control_allows(etcd1: EtcdCluster) -> None:
    """A value of MAX_VALUE bytes is larger than etcd's initial HTTP/2 window (64 KiB) and
    frame size (16 KiB): it is sent in frames as etcd's WINDOW_UPDATEs allow, and read back."""
    value = bytes(range(256)) * (MAX_VALUE // 256)
    with trio.fail_after(BOUND):
        async with grpc(etcd1) as etcd:
            for i in range(3):
                revision = await etcd.put(b"/big/%d" % i, value)
                kv = await etcd.get(b"/big/%d" % i)
                assert kv is not None and (kv.value, kv.mod_revision) == (value, revision)
            assert etcd.statistics().connections_opened == 1


async def test_a_watch_message_that_is_not_protobuf_is_an_etcd_error() -> None:
    """A watch whose "created" is followed by a message that is not a WatchResponse: the
    iterator raises an EtcdError naming the watch, bounded."""

    def reply(conn: h2.connection.H2Connection, stream: int) -> None:
        grpc_headers(conn, stream)
        conn.send_data(stream, frame(pb.WatchResponse(created=True).SerializeToString()))
        conn.send_data(stream, frame(b"\xff\xff\xff"))

    with trio.fail_after(BOUND):
        async with (
            fake_etcd(serving(reply)) as (address, _),
            quick(address) as etcd,
            etcd.watch(b"/w/", start_revision=1) as batches,
        ):
            with pytest.raises(EtcdError, match=r"Watch.*cannot read"):
                await batches.__anext__()


async def test_a_watch_message_that_stalls_is_cut() -> None:
    """A watch message that has begun but never ends: EtcdUnavailable within the timeout."""

    def reply(conn: h2.connection.H2Connection, stream: int) -> None:
        grpc_headers(conn, stream)
        conn.send_data(stream, frame(pb.WatchResponse(created=True).SerializeToString()))
        conn.send_data(stream, frame(b"abc", length=1000))

    with trio.fail_after(BOUND):
        async with (
            fake_etcd(serving(reply)) as (address, _),
            quick(address) as etcd,
            etcd.watch(b"/w/", start_revision=1) as batches,
        ):
            with pytest.raises(EtcdUnavailable, match="did not arrive whole"):
                await batches.__anext__()


# --- PING ACKs ----------------------------------------------------------------------------------


def pinging(pings: int, acks: int, chunks: list[list[str]]) -> Handler:
    """An HTTP/2 server that, as etcd (grpc-go) does, answers each request's arrival with
    ``pings`` PINGs in a write of their own, and answers the call (a put's revision 7, or a
    watch's "created") once ``acks`` PING ACKs have come since. Records the event names of
    every chunk it receives in ``chunks``."""

    async def handler(stream: trio.SocketStream) -> None:
        conn = await h2_server(stream)
        waiting: list[tuple[int, bytes]] = []  # (stream, path) of the calls not answered
        acked = 0
        while data := await stream.receive_some(65536):
            events = conn.receive_data(data)
            chunks.append([type(e).__name__ for e in events])
            for event in events:
                if isinstance(event, h2.events.RequestReceived):
                    waiting.append((event.stream_id, dict(event.headers)[b":path"]))
                    acked = 0
                    for i in range(pings):
                        conn.ping(struct.pack(">Q", i))
                    await stream.send_all(conn.data_to_send())
                elif isinstance(event, h2.events.PingAckReceived):
                    acked += 1
            if acked >= acks:
                for call, path in waiting:
                    if path.endswith(b"/Watch"):
                        grpc_headers(conn, call)
                        created = pb.WatchResponse(created=True).SerializeToString()
                        conn.send_data(call, frame(created))
                    else:
                        answering(frame(put_answer(7)))(conn, call)
                waiting.clear()
            await stream.send_all(conn.data_to_send())
        await trio.sleep_forever()

    return handler


async def test_a_ping_during_a_put_is_acknowledged_with_the_next_request() -> None:
    """etcd PINGs each request as it arrives: the client acknowledges such a PING in the
    same write as its next request (one write, and one wake-up of etcd, fewer per put),
    never in a write of its own; every PING but the last put's is acknowledged."""
    chunks: list[list[str]] = []
    with trio.fail_after(BOUND):
        async with fake_etcd(pinging(1, 0, chunks)) as (address, _), quick(address) as etcd:
            for _ in range(4):
                assert await etcd.put(b"/k", b"v") == 7
    requests = [c for c in chunks if "RequestReceived" in c]
    assert len(requests) == 4
    # The first PING's ACK may go with the ACK of the server's SETTINGS (sent at once); from
    # the third request on, each carries the PING of the put before.
    assert [c.count("PingAckReceived") for c in requests[2:]] == [1, 1], chunks
    assert sum(c.count("PingAckReceived") for c in chunks) == 3, chunks
    assert ["PingAckReceived"] not in chunks, chunks


async def test_a_held_ack_follows_the_next_request_so_etcd_pings_every_other_put() -> None:
    """etcd (grpc-go) PINGs a request's DATA only while no PING of its is unacknowledged. The
    held ACK leaves after the next request in the same write, so that request finds the
    PING still out and is not PINGed: a server with that rule PINGs every other put."""
    pinged: list[int] = []

    async def handler(stream: trio.SocketStream) -> None:
        conn = await h2_server(stream)
        outstanding = False
        while data := await stream.receive_some(65536):
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.DataReceived) and not outstanding:
                    conn.ping(struct.pack(">Q", len(pinged)))
                    pinged.append(event.stream_id)
                    outstanding = True
                elif isinstance(event, h2.events.PingAckReceived):
                    outstanding = False
                elif isinstance(event, h2.events.StreamEnded):
                    answering(frame(put_answer(7)))(conn, event.stream_id)
            await stream.send_all(conn.data_to_send())
        await trio.sleep_forever()

    with trio.fail_after(BOUND):
        async with fake_etcd(handler) as (address, _), quick(address) as etcd:
            for _ in range(9):
                assert await etcd.put(b"/k", b"v") == 7
    # Put n is stream 2n - 1. The first put's ACK may leave at once, with the ACK of the
    # server's SETTINGS; from the second put on, every other one is PINGed.
    later = [stream for stream in pinged if stream >= 3]
    assert len(later) == 4, pinged
    assert all(b - a == 4 for a, b in itertools.pairwise(later)), pinged


async def test_a_flood_of_pings_during_a_put_is_acknowledged_during_it() -> None:
    """A server that PINGs 100 times during one call gets the ACKs past the few the client
    holds (1 KiB of them) during the call: the put is answered, and nothing grows."""
    chunks: list[list[str]] = []
    with trio.fail_after(BOUND):
        async with fake_etcd(pinging(100, 40, chunks)) as (address, _), quick(address) as etcd:
            assert await etcd.put(b"/k", b"v") == 7
    assert sum(c.count("PingAckReceived") for c in chunks) >= 40


async def test_a_ping_during_a_watch_is_acknowledged_at_once() -> None:
    """A streaming call (a watch) holds nothing back: a PING before its "created" is
    acknowledged at once (this server sends "created" only then)."""
    chunks: list[list[str]] = []
    with trio.fail_after(BOUND):
        async with (
            fake_etcd(pinging(1, 1, chunks)) as (address, _),
            quick(address) as etcd,
            etcd.watch(b"/w/", start_revision=1),
        ):
            pass
    assert sum(c.count("PingAckReceived") for c in chunks) == 1, chunks
