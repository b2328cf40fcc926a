"""The coordination workloads (issue 33): election failover and barrier rounds, and etcd's
election API measured the same way from Python, for ``benchmarks/coordination.py``.

**Failover** is the time from the leader's end to the next leader's first act, on one
monotonic clock (this process's: the standby runs here):

- ``kill``: the leader is another process (it campaigned, then keeps its session alive);
  it is sent SIGKILL at a random moment of its keepalive period. Its session expires (the
  server learns nothing else: a dead process sends no goodbye), and the standby, whose
  campaign was parked on the server, is granted; its first act is a ``proclaim``.
  Expected: between ``max_age * 2/3`` and ``max_age`` (the last keepalive was up to a third
  of the max age before the kill), plus a round trip.
- ``resign``: the leader (here, on its own connection) resigns; from just before the
  resignation is sent to the standby's first act.

etcd: the same two with etcd's v3 election API through its JSON gateway (``POST
/v3/election/campaign``, ``/proclaim``, ``/resign``, ``/v3/lease/grant``, ``/keepalive``),
the leader's key tied to a lease of ``ttl`` seconds that its process keeps alive every
``ttl / 3``: a killed leader's lease expires, etcd deletes its key, the standby's campaign
returns.

**Barrier rounds**: ``parties`` processes (each its own client and session) run ``rounds``
rounds of ``Barrier.wait()``; a round's time is the whole run's over the rounds.

Bounded: every wait has a deadline; every process started is killed on the way out.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import multiprocessing
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from ._spawn import spawn_env

__all__ = [
    "barrier_rounds",
    "etcd_failover",
    "failover",
]

#: Seconds any one trial may take before it is given up as failed.
TRIAL_BOUND = 60.0

# The leader process: campaign, say so, keep the session alive until killed.
_LOCKSERVER_LEADER = """
import sys, time
from client import Election, LockClient
port, max_age, name = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
c = LockClient(port=port)
s = c.session(max_age=max_age, description="leader")
term = Election(s, "bench", name).campaign("leader")
print(f"LEADING {term}", flush=True)
while True:
    time.sleep(3600)
"""

_ETCD_LEADER = """
import base64, http.client, json, sys, threading, time
host, port, ttl, name = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
def post(path, body):
    conn = http.client.HTTPConnection(host, port, timeout=60)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = conn.getresponse(); data = json.loads(r.read() or b"{}"); conn.close(); return data
lease = post("/v3/lease/grant", {"TTL": ttl})["ID"]
def keepalive():
    while True:
        time.sleep(ttl / 3)
        post("/v3/lease/keepalive", {"ID": lease})
threading.Thread(target=keepalive, daemon=True).start()
b64 = lambda s: base64.b64encode(s.encode()).decode()
post("/v3/election/campaign", {"name": b64(name), "lease": lease, "value": b64("leader")})
print("LEADING", flush=True)
while True:
    time.sleep(3600)
"""


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


class _Etcd:
    """etcd's JSON gateway, one HTTP connection per call (calls may block: a campaign)."""

    def __init__(self, endpoint: str) -> None:
        host, _, port = endpoint.removeprefix("http://").rpartition(":")
        self.host, self.port = host, int(port)

    def post(self, path: str, body: dict[str, Any], timeout: float = TRIAL_BOUND) -> Any:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            response = conn.getresponse()
            data = response.read()
            if response.status != 200:
                raise RuntimeError(f"etcd {path}: HTTP {response.status} {data[:200]!r}")
            return json.loads(data or b"{}")
        finally:
            conn.close()

    def lease(self, ttl: int) -> str:
        lease: str = self.post("/v3/lease/grant", {"TTL": ttl})["ID"]
        return lease

    def campaign(self, name: str, lease: str, value: str) -> Any:
        body = {"name": _b64(name), "lease": lease, "value": _b64(value)}
        return self.post("/v3/election/campaign", body)["leader"]

    def proclaim(self, leader: Any, value: str) -> None:
        self.post("/v3/election/proclaim", {"leader": leader, "value": _b64(value)})

    def resign(self, leader: Any) -> None:
        self.post("/v3/election/resign", {"leader": leader})

    def revoke(self, lease: str) -> None:
        with contextlib.suppress(RuntimeError, OSError):
            self.post("/v3/lease/revoke", {"ID": lease})


@contextlib.contextmanager
def _leader_process(code: str, *args: str) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=spawn_env(),
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("LEADING"):
            raise RuntimeError(f"the leader process did not lead: {line!r}")
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


def _parked(port: int, at_least: int, deadline: float) -> None:
    """Wait (bounded) until the server has ``at_least`` parked transactions."""
    from client import LockClient

    with LockClient(port=port) as c:
        while c.statistics()["waiting"]["waiters"] < at_least:
            if time.monotonic() > deadline:
                raise RuntimeError("the standby's campaign was not parked in time")
            time.sleep(0.005)


def failover(port: int, mode: str, *, max_age: float = 2.0, name: str = "") -> float:
    """One lockserver failover (``mode`` ``kill`` or ``resign``), in seconds: from the
    leader's end to the standby's first act (a proclaim)."""
    from client import Election, LockClient

    name = name or f"failover-{random.getrandbits(48):x}"
    deadline = time.monotonic() + TRIAL_BOUND
    result: dict[str, float] = {}
    with LockClient(port=port) as c, c.session(max_age=10.0) as s:
        standby = Election(s, "bench", name)  # (only the leader's max age bounds a failover)

        def run_standby() -> None:
            if standby.campaign("standby", timeout=TRIAL_BOUND) is not None:
                standby.proclaim("first act")
                result["act"] = time.monotonic()

        if mode == "kill":
            with _leader_process(_LOCKSERVER_LEADER, str(port), str(max_age), name) as leader:
                thread = threading.Thread(target=run_standby, daemon=True)
                thread.start()
                _parked(port, 1, deadline)
                time.sleep(random.uniform(0, max_age / 3))  # a random keepalive phase
                result["end"] = time.monotonic()
                leader.send_signal(signal.SIGKILL)
                thread.join(TRIAL_BOUND)
        elif mode == "resign":
            with LockClient(port=port) as lc, lc.session(max_age=max_age) as ls:
                leader_e = Election(ls, "bench", name)
                assert leader_e.campaign("leader") is not None
                thread = threading.Thread(target=run_standby, daemon=True)
                thread.start()
                _parked(port, 1, deadline)
                result["end"] = time.monotonic()
                leader_e.resign()
                thread.join(TRIAL_BOUND)
        else:
            raise ValueError(f"mode must be 'kill' or 'resign', got {mode!r}")
        standby.resign()
    if "act" not in result:
        raise RuntimeError("the standby did not take over in time")
    return result["act"] - result["end"]


def etcd_failover(endpoint: str, mode: str, *, ttl: int = 2, name: str = "") -> float:
    """One etcd election failover (``mode`` ``kill`` or ``resign``), in seconds, measured
    as :func:`failover` does."""
    etcd = _Etcd(endpoint)
    name = name or f"failover-{random.getrandbits(48):x}"
    result: dict[str, float] = {}
    lease = etcd.lease(ttl)
    stop = threading.Event()

    def keepalive() -> None:
        while not stop.wait(ttl / 3):
            with contextlib.suppress(RuntimeError, OSError):
                etcd.post("/v3/lease/keepalive", {"ID": lease})

    keeper = threading.Thread(target=keepalive, daemon=True)
    keeper.start()

    def run_standby() -> None:
        leader = etcd.campaign(name, lease, "standby")
        etcd.proclaim(leader, "first act")
        result["act"] = time.monotonic()
        etcd.resign(leader)

    try:
        if mode == "kill":
            host, port = etcd.host, str(etcd.port)
            with _leader_process(_ETCD_LEADER, host, port, str(ttl), name) as leader_proc:
                thread = threading.Thread(target=run_standby, daemon=True)
                thread.start()
                time.sleep(0.2 + random.uniform(0, ttl / 3))  # parked; a random phase
                result["end"] = time.monotonic()
                leader_proc.send_signal(signal.SIGKILL)
                thread.join(TRIAL_BOUND)
        elif mode == "resign":
            leader_lease = etcd.lease(60)
            leader = etcd.campaign(name, leader_lease, "leader")
            thread = threading.Thread(target=run_standby, daemon=True)
            thread.start()
            time.sleep(0.2)  # the standby's campaign is waiting in etcd
            result["end"] = time.monotonic()
            etcd.resign(leader)
            thread.join(TRIAL_BOUND)
            etcd.revoke(leader_lease)
        else:
            raise ValueError(f"mode must be 'kill' or 'resign', got {mode!r}")
    finally:
        stop.set()
        etcd.revoke(lease)
    if "act" not in result:
        raise RuntimeError("the etcd standby did not take over in time")
    return result["act"] - result["end"]


def _party(port: int, name: str, parties: int, rounds: int, out: Any) -> None:
    from client import Barrier, LockClient

    with LockClient(port=port) as c, c.session() as s:
        barrier = Barrier(s, "bench", name, parties=parties)
        assert barrier.wait(timeout=TRIAL_BOUND)  # everyone is there: start together
        t0 = time.monotonic()
        for _ in range(rounds):
            if not barrier.wait(timeout=TRIAL_BOUND):
                raise RuntimeError("a barrier round timed out")
        out.put(time.monotonic() - t0)


def barrier_rounds(port: int, parties: int, rounds: int) -> float:
    """Seconds per round of a cyclic barrier of ``parties`` processes (the slowest party's
    run over ``rounds`` rounds)."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    name = f"barrier-{random.getrandbits(48):x}"
    procs = [
        ctx.Process(target=_party, args=(port, name, parties, rounds, out), daemon=True)
        for _ in range(parties)
    ]
    for proc in procs:
        proc.start()
    try:
        times: list[float] = [float(out.get(timeout=TRIAL_BOUND * 2)) for _ in procs]
    finally:
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
    return max(times) / rounds
