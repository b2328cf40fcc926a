"""The bridge between etcd's gRPC messages and the gateway's JSON (``_etcd_messages.py``)
gives what protobuf's own JSON mapping gives (``json_format`` with the proto's field names,
the mapping etcd's gateway uses): on generated messages of every type in ``_etcd_rpc.proto``,
``json_of`` equals ``MessageToDict`` and ``fill`` of that JSON equals ``ParseDict`` and the
message itself. So a gRPC answer reads exactly as the gateway's JSON of it would.
"""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import given, settings
from hypothesis import strategies as st

from lockserver.replication import _etcd_rpc_pb2 as pb
from lockserver.replication._etcd_messages import METHODS, answer_json, fill, json_of

TYPES = sorted(pb.DESCRIPTOR.message_types_by_name)
INT64 = (-(2**63), 2**63 - 1)
UINT64 = (0, 2**64 - 1)


def scalar(field: FieldDescriptor, draw: Any) -> Any:
    kind = field.type
    if kind == FieldDescriptor.TYPE_BYTES:
        return draw(st.binary(max_size=40))
    if kind == FieldDescriptor.TYPE_STRING:
        return draw(st.text(max_size=20))
    if kind == FieldDescriptor.TYPE_BOOL:
        return draw(st.booleans())
    if kind == FieldDescriptor.TYPE_INT64:
        return draw(st.integers(*INT64))
    if kind == FieldDescriptor.TYPE_UINT64:
        return draw(st.integers(*UINT64))
    if kind == FieldDescriptor.TYPE_ENUM:
        return draw(st.sampled_from([v.number for v in field.enum_type.values]))
    raise AssertionError(f"a field type the proto does not use: {field.full_name}")


def populate(message: Message, draw: Any, depth: int = 0) -> Message:
    """Set a drawn subset of ``message``'s fields to drawn values (one member per oneof)."""
    descriptor: Descriptor = message.DESCRIPTOR
    for field in descriptor.fields:
        if not draw(st.booleans()):
            continue
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            if depth > 3:
                continue
            if field.is_repeated:
                for _ in range(draw(st.integers(0, 3))):
                    populate(getattr(message, field.name).add(), draw, depth + 1)
            else:
                sub = getattr(message, field.name)
                sub.SetInParent()
                populate(sub, draw, depth + 1)
        elif field.is_repeated:
            getattr(message, field.name).extend(
                scalar(field, draw) for _ in range(draw(st.integers(0, 3)))
            )
        else:
            setattr(message, field.name, scalar(field, draw))
    return message


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(TYPES), data=st.data())
def test_the_bridge_is_protobufs_json_mapping(name: str, data: st.DataObject) -> None:
    """For any message of the proto: ``json_of`` is ``MessageToDict`` (proto field names),
    and ``fill`` reads that JSON back as ``ParseDict`` does, into the same message."""
    cls = getattr(pb, name)
    message = populate(cls(), data.draw)
    expected = json_format.MessageToDict(message, preserving_proto_field_name=True)
    assert json_of(message) == expected
    assert fill(cls(), expected) == json_format.ParseDict(expected, cls()) == message


def test_an_unknown_enum_number_reads_as_protobufs_mapping_does() -> None:
    """An enum number this proto does not name (a newer etcd, a hostile server) is kept as
    a number, as json_format keeps it, never an exception."""
    event = pb.Event.FromString(b"\x08\x07")  # type = 7
    assert json_of(event) == json_format.MessageToDict(event, preserving_proto_field_name=True)
    assert json_of(event) == {"type": 7}


@pytest.mark.parametrize("path", sorted(METHODS))
def test_every_answer_reads_as_the_gateways_json(path: str) -> None:
    """Each method's answer type is read by ``answer_json`` (an empty answer is {})."""
    assert answer_json(path, b"") == {}
    header = pb.ResponseHeader(revision=42, member_id=2**64 - 1).SerializeToString()
    assert answer_json(path, b"\x0a" + bytes([len(header)]) + header) == {
        "header": {"revision": "42", "member_id": str(2**64 - 1)}
    }
