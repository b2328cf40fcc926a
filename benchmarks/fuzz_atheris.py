"""Coverage-guided fuzzing of the server side of the protocol decoder with atheris (issue #8).

Why: the decoder (framing, msgpack, message and tree validation) is where received bytes
enter; its contract is that anything a peer sends either decodes to a Request or raises
``ProtocolError`` with a wire error code. Any other exception is a bug. The harness feeds the
fuzzer's bytes to a fresh ``protocol.Connection(Role.SERVER)`` after a valid hello, in two
pieces (so the framing's partial-frame path is covered), pulls messages until it needs more
data, and stops at the first closing error, as the server does.

    pip install atheris
    python -m benchmarks.fuzz_atheris -runs=200000          # libFuzzer flags pass through
    python -m benchmarks.fuzz_atheris corpus_dir -max_total_time=60
"""

from __future__ import annotations

import struct
import sys
import tempfile
from pathlib import Path

import atheris  # type: ignore[import-untyped, import-not-found, unused-ignore]

with atheris.instrument_imports():
    import msgpack

    from protocol import Connection, ProtocolError, Role

_HELLO = msgpack.packb({"type": "hello", "id": 0, "version": 1})
_HELLO_FRAME = struct.pack(">I", len(_HELLO)) + _HELLO
#: Seeds: a few valid frames (framed), so the fuzzer starts from the interesting shapes.
SEEDS = [
    {"type": "ping", "id": 1},
    {
        "type": "execute",
        "id": 2,
        "session": "s",
        "namespace": "n",
        "statements": [["Assert", ["SetVar", "t", "v", 1, None, 5]]],
        "tx_id": "t",
    },
    {"type": "cancel", "id": 3, "target": 2},
]


def one_input(data: bytes) -> None:
    conn = Connection(Role.SERVER, max_frame=64 * 1024)
    conn.receive_data(_HELLO_FRAME)
    conn.next_message()
    # The first byte picks a split point: partial frames are fed in two steps.
    split = data[0] if data else 0
    body = data[1:]
    for piece in (body[:split], body[split:]):
        try:
            conn.receive_data(piece)
        except ProtocolError:
            return  # framing errors close the connection
        while True:
            try:
                msg = conn.next_message()
            except ProtocolError as exc:
                if exc.code.closes_connection:
                    return
                continue
            if msg is None:
                break


def main() -> None:
    argv = list(sys.argv)
    if not any(not a.startswith("-") for a in argv[1:]):
        # No corpus directory given: start from the seeds in a temporary one.
        corpus = tempfile.mkdtemp(prefix="atheris-corpus-")
        for i, seed in enumerate(SEEDS):
            payload = msgpack.packb(seed)
            framed = struct.pack(">I", len(payload)) + payload
            Path(corpus, f"seed-{i}").write_bytes(bytes([len(framed) // 2]) + framed)
        argv.append(corpus)
    atheris.Setup(argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
