"""The checked-in protobuf module of etcd's messages matches its ``.proto``: nobody edits one
without the other (issue 29).

``lockserver/replication/_etcd_rpc_pb2.py`` is generated from ``_etcd_rpc.proto`` by
``scripts/etcd_proto.py`` (protoc) and checked in, so running the server needs no protoc.
The test runs protoc on the ``.proto`` into a temporary directory and compares the serialized
file descriptor there with the one the checked-in module registers (the descriptor, not the
text: protoc's boilerplate differs between its versions, the messages do not). It skips,
saying so, where protoc is not installed (Debian: ``protobuf-compiler``, which .ci/run adds).
"""

from __future__ import annotations

import ast
import shutil
import subprocess
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from lockserver.replication import _etcd_rpc_pb2 as pb

HERE = Path(pb.__file__).resolve().parent
PROTOC = shutil.which("protoc")


def serialized_file(module: Path) -> bytes:
    """The bytes a protoc-generated module passes to ``AddSerializedFile`` (read from its
    source, not imported: importing would register a second file of the same name)."""
    for node in ast.walk(ast.parse(module.read_text())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "AddSerializedFile"
        ):
            value = ast.literal_eval(node.args[0])
            assert isinstance(value, bytes)
            return value
    raise AssertionError(f"{module}: no AddSerializedFile call")


@pytest.mark.skipif(PROTOC is None, reason="protoc not installed (Debian: protobuf-compiler)")
def test_the_generated_module_matches_the_proto(tmp_path: Path) -> None:
    """protoc on today's ``_etcd_rpc.proto`` gives the file descriptor the checked-in
    ``_etcd_rpc_pb2.py`` registers; on a mismatch, run ``python scripts/etcd_proto.py``."""
    assert PROTOC is not None
    subprocess.run(
        [PROTOC, f"-I{HERE}", f"--python_out={tmp_path}", "_etcd_rpc.proto"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    fresh = descriptor_pb2.FileDescriptorProto.FromString(
        serialized_file(tmp_path / "_etcd_rpc_pb2.py")
    )
    checked_in = descriptor_pb2.FileDescriptorProto.FromString(pb.DESCRIPTOR.serialized_pb)
    assert checked_in.name == fresh.name == "_etcd_rpc.proto"
    # Message by message first, for a readable failure; then the whole descriptor.
    assert [m.name for m in checked_in.message_type] == [m.name for m in fresh.message_type], (
        "messages differ: run python scripts/etcd_proto.py"
    )
    for mine, theirs in zip(checked_in.message_type, fresh.message_type, strict=True):
        assert mine == theirs, f"message {mine.name} differs: run python scripts/etcd_proto.py"
    assert checked_in == fresh, "the descriptors differ: run python scripts/etcd_proto.py"


def test_the_checked_in_module_is_what_the_client_reads() -> None:
    """The comparison above is not vacuous: the module registers etcd's field numbers (a
    sample: the ones a wrong edit is likeliest to break)."""
    fields = {
        (m.name, f.name): f.number
        for m in descriptor_pb2.FileDescriptorProto.FromString(
            pb.DESCRIPTOR.serialized_pb
        ).message_type
        for f in m.field
    }
    assert fields["RangeRequest", "keys_only"] == 8
    assert fields["Compare", "lease"] == 8
    assert fields["WatchCreateRequest", "fragment"] == 8
    assert fields["WatchResponse", "events"] == 11
    assert fields["LeaseTimeToLiveResponse", "grantedTTL"] == 4
    assert fields["StatusResponse", "dbSizeInUse"] == 9
    assert fields["AuthenticateResponse", "token"] == 2
