"""etcd's unary gRPC methods as the client calls them, and their messages as the gateway's
JSON: the bridge that lets :mod:`lockserver.replication._etcd` build one request body and
read one answer whichever transport carried the call. No I/O here.

This module owns the table from a call (named by its gateway path, ``/v3/kv/range``) to its
gRPC method (``/etcdserverpb.KV/Range``) and message types (``_etcd_rpc.proto``), and the two
conversions: a request body in the gateway's JSON to the method's protobuf bytes
(:func:`request_message`), and an answer's protobuf bytes to the gateway's JSON of it
(:func:`answer_json`).

Why one representation: the gateway is itself a gRPC client that turns JSON into these same
messages and back with protobuf's JSON mapping and etcd's field names (``OrigName``: the
names in rpc.proto, as ``raftTerm``, ``grantedTTL``, ``response_range``). Doing the same
mapping here gives, for a gRPC answer, exactly the JSON the gateway would have sent (bytes
in base64, 64-bit integers as decimal strings, zero fields left out), so every reading of
an answer in ``_etcd.py`` / ``_etcd_json.py`` serves both transports and exists once.

Why not ``google.protobuf.json_format`` itself (``ParseDict`` / ``MessageToDict`` with
``preserving_proto_field_name``), which is that mapping: it is written for every message
and option, in Python, and cost a put ~40 µs of CPU on the loaded test machine (~13 µs
idle); the replica's put is on every acquire's path. :func:`json_of` and :func:`fill` do
the subset these messages use (no maps, floats or 32-bit integers) in a few lines over
``ListFields()``, which upb runs in C: ~10 µs together, loaded. json_format stays their
oracle: tests/replication/test_etcd_messages.py checks both against it on generated
messages of every type here.

The one call not in the table is the streaming ``Watch`` (``_etcd_grpc_watch.py``).
``LeaseKeepAlive`` is a bidirectional stream in etcd; the client sends it one request and
half-closes, so it runs as a unary exchange: etcd answers the request, sees the end of the
client's side and ends the call with OK (etcd's ``leaseKeepAlive`` loop returns on EOF) --
what the gateway itself does with each POST to ``/v3/lease/keepalive``. A kept stream would
save one HEADERS frame per renewal (every TTL/3 seconds) at the price of a reader task and a
stream to watch over; not worth it.
"""

from __future__ import annotations

import base64
from typing import Any, Final

import attrs
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from . import _etcd_rpc_pb2 as pb

__all__ = ["METHODS", "Method", "answer_json", "fill", "json_of", "request_message"]

_MESSAGE: Final = FieldDescriptor.TYPE_MESSAGE
_BYTES: Final = FieldDescriptor.TYPE_BYTES
_ENUM: Final = FieldDescriptor.TYPE_ENUM
#: The integer types protobuf's JSON mapping writes as decimal strings (64-bit ones).
_INT64: Final = frozenset(
    {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
    }
)


@attrs.frozen
class Method:
    """One unary gRPC method of etcd: its path and its request and response types."""

    name: str
    request: type[Message]
    response: type[Message]


#: Each call of the client, by its gateway path: the gRPC method that does the same.
METHODS: Final[dict[str, Method]] = {
    "/v3/kv/range": Method("/etcdserverpb.KV/Range", pb.RangeRequest, pb.RangeResponse),
    "/v3/kv/put": Method("/etcdserverpb.KV/Put", pb.PutRequest, pb.PutResponse),
    "/v3/kv/txn": Method("/etcdserverpb.KV/Txn", pb.TxnRequest, pb.TxnResponse),
    "/v3/kv/deleterange": Method(
        "/etcdserverpb.KV/DeleteRange", pb.DeleteRangeRequest, pb.DeleteRangeResponse
    ),
    "/v3/kv/compaction": Method(
        "/etcdserverpb.KV/Compact", pb.CompactionRequest, pb.CompactionResponse
    ),
    "/v3/lease/grant": Method(
        "/etcdserverpb.Lease/LeaseGrant", pb.LeaseGrantRequest, pb.LeaseGrantResponse
    ),
    "/v3/lease/revoke": Method(
        "/etcdserverpb.Lease/LeaseRevoke", pb.LeaseRevokeRequest, pb.LeaseRevokeResponse
    ),
    "/v3/lease/keepalive": Method(
        "/etcdserverpb.Lease/LeaseKeepAlive", pb.LeaseKeepAliveRequest, pb.LeaseKeepAliveResponse
    ),
    "/v3/lease/timetolive": Method(
        "/etcdserverpb.Lease/LeaseTimeToLive",
        pb.LeaseTimeToLiveRequest,
        pb.LeaseTimeToLiveResponse,
    ),
    "/v3/maintenance/status": Method(
        "/etcdserverpb.Maintenance/Status", pb.StatusRequest, pb.StatusResponse
    ),
    "/v3/auth/authenticate": Method(
        "/etcdserverpb.Auth/Authenticate", pb.AuthenticateRequest, pb.AuthenticateResponse
    ),
}


def request_message(path: str, body: dict[str, Any]) -> bytes:
    """The protobuf bytes of the request ``body`` (the gateway's JSON of a call to
    ``path``) for its gRPC method. ``body`` is the client's own, so a field this module does
    not know is a bug here (a KeyError)."""
    data: bytes = fill(METHODS[path].request(), body).SerializeToString()
    return data


def answer_json(path: str, data: bytes) -> dict[str, Any]:
    """The gateway's JSON of the answer ``data`` to a call to ``path``. Raises protobuf's
    ``DecodeError`` when ``data`` is not that answer (a hostile or broken server)."""
    return json_of(METHODS[path].response.FromString(data))


def json_of(message: Message) -> dict[str, Any]:
    """``message`` in protobuf's JSON mapping with the proto's field names, as
    ``json_format.MessageToDict(message, preserving_proto_field_name=True)`` gives it for
    the messages of ``_etcd_rpc.proto``: fields set only (presence: a oneof member or a
    message field even when empty), bytes base64, 64-bit integers as strings, enums by name
    (by number when unknown)."""
    out: dict[str, Any] = {}
    for field, value in message.ListFields():
        kind = field.type
        if field.is_repeated:
            out[field.name] = [_json_value(field, kind, item) for item in value]
        else:
            out[field.name] = _json_value(field, kind, value)
    return out


def _json_value(field: FieldDescriptor, kind: int, value: Any) -> Any:
    if kind == _MESSAGE:
        return json_of(value)
    if kind == _BYTES:
        return base64.b64encode(value).decode("ascii")
    if kind in _INT64:
        return str(value)
    if kind == _ENUM:
        named = field.enum_type.values_by_number.get(value)
        return value if named is None else named.name
    return value  # bool, string


def fill(message: Message, body: dict[str, Any]) -> Message:
    """``message`` with the fields of ``body`` (protobuf's JSON mapping with the proto's
    field names, as ``json_format.ParseDict`` reads it for these messages: bytes base64,
    64-bit integers as strings or ints, enums by name; an empty object still sets a message
    field); returns ``message``."""
    fields = message.DESCRIPTOR.fields_by_name
    for name, value in body.items():
        field = fields[name]
        kind = field.type
        if kind == _MESSAGE:
            if field.is_repeated:
                repeated = getattr(message, name)
                for item in value:
                    fill(repeated.add(), item)
            else:
                sub = getattr(message, name)
                sub.SetInParent()
                fill(sub, value)
        elif field.is_repeated:
            getattr(message, name).extend(_field_value(field, kind, item) for item in value)
        else:
            setattr(message, name, _field_value(field, kind, value))
    return message


def _field_value(field: FieldDescriptor, kind: int, value: Any) -> Any:
    if kind == _BYTES:
        return base64.b64decode(value)
    if kind in _INT64:
        return int(value)
    if kind == _ENUM:
        return field.enum_type.values_by_name[value].number
    return value
