"""A replicated group on one machine: a one-member etcd and three lockserver replicas on loopback
ports; a client holds a lock while the replica it talks to is killed, and keeps it.

Run from the repository root after ``pip install -e .`` (etcd: ``apt-get install
etcd-server``)::

    .venv/bin/python examples/replicated_group.py            # then serves until Ctrl-C
    .venv/bin/python examples/replicated_group.py --once     # exits after the demo (tests)
    .venv/bin/python examples/replicated_group.py --secure   # etcd deployed as it should be

``--secure`` deploys etcd as docs/replication.md does: TLS on its client port with
certificates made for the demo (trustme: ``pip install trustme``), a client certificate
demanded of every client, etcd's auth on, and the replicas logging in as a ``lockserver``
user whose role may touch only this group's keys. Without it, etcd speaks plain HTTP, and
every replica says in its log that this is only for a demo.

On three machines, see docs/replication.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from client import LockClient, Mutex
from lockbench.etcd import ETCD, SKIP_REASON, EtcdCluster
from lockbench.replicas import ReplicaGroup


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--once", action="store_true", help="exit after the demo")
    p.add_argument(
        "--secure", action="store_true", help="etcd with TLS, client certificates and auth"
    )
    args = p.parse_args()
    if ETCD is None:
        print(f"replicated_group: {SKIP_REASON}", file=sys.stderr)
        return 69
    work = Path(tempfile.mkdtemp(prefix="lockserver-group-"))
    secure = bool(args.secure)
    with EtcdCluster(
        work / "etcd",
        tls=secure,
        client_cert_auth=secure,
        auth=secure,
        auth_prefix=b"/lockserver/demo/",
    ) as etcd:
        etcd.start(1)
        print(f"etcd: {etcd.urls[0]} (data in {work / 'etcd'})")
        if args.secure:
            print(
                "etcd: TLS with client certificates, auth on; the replicas log in as "
                "'lockserver', allowed /lockserver/demo/ only"
            )
        flags = tuple(etcd.replica_flags())
        with ReplicaGroup(etcd.urls, work / "replicas", n=3, group="demo", extra=flags) as group:
            group.start()
            print(f"replicas of group 'demo': {', '.join(group.addresses)}")
            with LockClient(servers=[group.addresses]) as c, c.session(max_age=20.0) as s:
                lock = Mutex(s, "demo", "report")
                assert lock.acquire(timeout=5.0)
                fence = lock.fence
                print(f"holding 'report' (fence {fence}) through {c.host}:{c.port}")
                with LockClient(servers=[group.addresses[1:]]) as other:
                    o = other.session()
                    print("another client, through another replica:", end=" ")
                    print("refused" if not Mutex(o, "demo", "report").acquire(False) else "?!")
                    print(f"kill -9 of the replica at {c.host}:{c.port}")
                    group.kill(group.addresses.index(f"{c.host}:{c.port}"))
                    time.sleep(0.5)
                    print("still held: the other client is", end=" ")
                    print("refused" if not Mutex(o, "demo", "report").acquire(False) else "?!")
                    lock.release()
                    print(f"released through {c.host}:{c.port} (failed over; no lock lost)")
                    taken = Mutex(o, "demo", "report")
                    assert taken.acquire(timeout=5.0)
                    print(f"the other client takes it: fence {taken.fence} > {fence}")
                    taken.release()
            if not args.once:
                print("serving until Ctrl-C")
                try:
                    while True:
                        time.sleep(3600)
                except KeyboardInterrupt:
                    pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
