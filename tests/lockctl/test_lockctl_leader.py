"""``lockctl leader NAMESPACE NAME`` end to end (subprocess, real server): nobody leads (exit
3), the leader's session, description, term and value (human and ``--json``), the change after
a proclaim and a new leader, and the election's grant in ``lockctl holders``."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from support import ThreadedServer
from test_lockctl import address, lockctl, one_line_error

from client import Election, LockClient
from lockserver import RunningServer


@pytest.fixture
def server() -> Iterator[ThreadedServer[RunningServer]]:
    s = ThreadedServer().start()
    try:
        yield s
    finally:
        s.stop()


def test_leader_names_the_leader_and_its_term(server: ThreadedServer[RunningServer]) -> None:
    """No leader: one line, exit 3 (``--json`` still prints ``leader: null``). A leader:
    its session, description, term (the grant's fence) and value; after a proclaim the new
    value under the same term; after a resignation the next leader with a larger term."""
    where = address(server)
    one_line_error(lockctl("leader", "ops", "db", server=where), 3, "nobody leads ops/db")
    nobody = lockctl("--json", "leader", "ops", "db", server=where)
    assert nobody.returncode == 3 and json.loads(nobody.stdout)["leader"] is None
    with (
        LockClient(port=server.port) as c,
        c.session(description="node-a") as a,
        c.session(description="node-b") as b,
    ):
        ea = Election(a, "ops", "db")
        term = ea.campaign({"addr": "10.0.0.1:5432"})
        Election(b, "ops", "db-2").campaign("other election, similar name")
        proc = lockctl("--json", "leader", "ops", "db", server=where)
        assert proc.returncode == 0, proc.stderr
        record = json.loads(proc.stdout)["leader"]
        assert (record["session"], record["description"], record["term"]) == (a.id, "node-a", term)
        assert record["value"] == {"addr": "10.0.0.1:5432"} and record["since"].endswith("Z")
        human = lockctl("leader", "ops", "db", server=where)
        assert human.returncode == 0
        assert f"led by session {a.id} ('node-a'), term {term}" in human.stdout
        ea.proclaim("moved")
        record = json.loads(lockctl("--json", "leader", "ops", "db", server=where).stdout)
        assert (record["leader"]["value"], record["leader"]["term"]) == ("moved", term)
        holders = json.loads(
            lockctl("--json", "holders", "ops", "recipes.election", "db", server=where).stdout
        )
        mine = [h for h in holders if h["var"] == "db" and h["table"] == "recipes.election"]
        assert [(h["session"], h["fence"]) for h in mine] == [(a.id, term)]
        ea.resign()
        eb = Election(b, "ops", "db")
        term_b = eb.campaign("b")
        assert term is not None and term_b is not None and term_b > term
        record = json.loads(lockctl("--json", "leader", "ops", "db", server=where).stdout)
        assert (record["leader"]["session"], record["leader"]["term"]) == (b.id, term_b)
