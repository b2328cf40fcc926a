"""Quick start: start a lockserver, show a client taking the seed's MDS locks, keep serving.

Run from the repository root after ``pip install .`` (or ``pip install -e .``)::

    .venv/bin/python examples/quickstart.py          # serves until Ctrl-C
    .venv/bin/python examples/quickstart.py --once   # exits after the demo (used by tests)
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from client import (
    AnywayContinueAfter,
    Assert,
    DeleteVar,
    Exists,
    LockClient,
    Not,
    SetVar,
)

NS = "Clinical"


def mds_entry(facility: str, patient: str) -> list[Assert]:
    """MDS entry: many users may enter data for a patient at once, unless a review or the
    facility's month-end is going on."""
    return [
        Assert(Not(Exists("Month-End", facility))),
        Assert(Not(Exists("MDS-Review", facility, patient))),
        Assert(SetVar("MDS-Entry", facility, patient, allow_duplicates=True)),
    ]


def mds_review(facility: str, patient: str) -> list[Assert]:
    """MDS review: one reviewer per patient, and not while anyone is entering data."""
    return [
        Assert(Not(Exists("Month-End", facility))),
        Assert(Not(Exists("MDS-Entry", facility, patient))),
        Assert(SetVar("MDS-Review", facility, patient)),
    ]


def demo(host: str, port: int) -> None:
    """The seed's story: two users enter, a third cannot review; after both leave, it can."""
    with LockClient(host, port) as c:
        with (
            c.session(description="user1") as u1,
            c.session(description="user2") as u2,
            c.session(description="user3") as u3,
        ):
            for name, s in (("user1", u1), ("user2", u2)):
                r = s.execute(NS, mds_entry("CGROVE-35", "R-45899"))
                print(f"{name} MDS entry   -> ok={r.ok} fence={r.fence}")
            r = u3.execute(NS, mds_review("CGROVE-35", "R-45899"))
            print(f"user3 MDS review  -> ok={r.ok} failed at {r.failed_statement!r}")
            for s in (u1, u2):
                s.execute(NS, [AnywayContinueAfter(DeleteVar("MDS-Entry", "CGROVE-35"))])
            r = u3.execute(NS, mds_review("CGROVE-35", "R-45899"))
            print(f"user3 MDS review (entries done) -> ok={r.ok} fence={r.fence}")
        stats = c.statistics()
        print(
            f"server: {stats['engine']['transactions']} transactions, trust "
            f"{stats['trust']['trust']:.2f}, uptime {stats['server']['uptime']:.1f} s"
        )


#: The server's log level in the demo: its warnings only.
QUIET = ("--log-level", "WARNING")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=7400)
    parser.add_argument("--once", action="store_true", help="exit after the demo")
    args = parser.parse_args()
    server = subprocess.Popen(
        # -P: the installed lockserver (compiled by pip install .), not the checkout's sources
        # that -m would find first in the working directory.
        [sys.executable, "-P", "-m", "lockserver", "--port", str(args.port), *QUIET],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline().strip()  # "lockserver listening on HOST:PORT"
        if not line.startswith("lockserver listening on "):
            print("the server did not start", file=sys.stderr)
            return 1
        print(line)
        host, _, port = line.rpartition(" ")[2].rpartition(":")
        demo(host.strip("[]"), int(port))
        if args.once:
            return 0
        print("The server keeps running; press Ctrl-C to stop it.")
        server.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.terminate()
        server.wait(timeout=5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
