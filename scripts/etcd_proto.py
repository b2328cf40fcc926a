"""Regenerate ``lockserver/replication/_etcd_rpc_pb2.py`` and its ``.pyi`` from
``_etcd_rpc.proto`` with ``protoc`` (Debian's ``protobuf-compiler``); the generated files are
checked in, so neither running nor installing the server needs protoc;
tests/replication/test_etcd_proto.py fails when they no longer match the ``.proto``.

    python scripts/etcd_proto.py
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent / "lockserver" / "replication"


def main() -> int:
    protoc = shutil.which("protoc")
    if protoc is None:
        print("protoc not found: apt-get install protobuf-compiler", file=sys.stderr)
        return 1
    subprocess.run(
        [protoc, f"-I{HERE}", f"--python_out={HERE}", f"--pyi_out={HERE}", "_etcd_rpc.proto"],
        check=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
