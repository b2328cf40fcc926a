"""The status page in a real browser (issue 16 section 3): headless Chromium loads ``/``,
its script fetches ``/v1/status`` and fills in the live figures.

Pinned down: the rendered DOM (``--dump-dom`` after a virtual-time budget, so the page's own
fetch and refresh ran) shows the sessions, entries and tables a protocol client made, the
ready state, both charts drawn as SVG polylines, the busiest tables and the longest
waits as table rows; the page loads nothing from anywhere
else (it is rendered with the network to other hosts unreachable). Skips, saying why, where
Debian's ``chromium`` is not installed (``.ci/run`` installs it).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
import trio
from server._wire import WireClient

from protocol import Assert, SetVar

from .conftest import start_server

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"

pytestmark = pytest.mark.skipif(
    not os.access(CHROMIUM, os.X_OK),
    reason="headless Chromium is not installed (Debian: apt-get install chromium; .ci/run does)",
)


def chromium_command(user_data: Path, *args: str) -> list[str]:
    """Headless Chromium that talks to nothing but the page's own server."""
    return [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={user_data}",
        # Any other host is unreachable: an external asset would fail to load.
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
        *args,
    ]


async def test_the_page_shows_live_figures(nursery: trio.Nursery, tmp_path: Path) -> None:
    """7 sessions holding 9 entries in 2 tables and an 8th waiting: the page rendered by
    Chromium says so, says ready, has drawn its charts, and lists the busiest tables and the
    waiter."""
    server = await start_server(nursery)
    with trio.fail_after(90):
        client = await WireClient.connect(server)
        for i in range(7):
            await client.execute(f"s{i}", Assert(SetVar("t", f"v{i}")))
        await client.execute("s0", Assert(SetVar("u", "a")))
        await client.execute("s1", Assert(SetVar("u", "b")))
        await client.send(client.execute_message("patient", [Assert(SetVar("t", "v0"))], wait=60.0))
        await trio.sleep(1.2)  # one trust tick: the charts get a sample
        done = await trio.run_process(
            chromium_command(
                tmp_path / "profile",
                "--virtual-time-budget=5000",
                "--dump-dom",
                f"http://127.0.0.1:{server.port}/",
            ),
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
        await client.aclose()
    dom = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()[-2000:]

    def text(element_id: str) -> str:
        found = re.search(rf'id="{element_id}"[^>]*>([^<]*)<', dom)
        assert found, (element_id, dom[-3000:])
        return found.group(1)

    assert text("sessions") == "8"  # the waiter's too
    assert text("waiters") == "1"
    assert text("entries") == "9"
    assert text("tables") == "2"
    # The protocol client, and any socket Chromium opened ahead and has not used yet (a
    # connection counts as HTTP from its first bytes on).
    assert int(text("connections")) >= 1
    assert text("state") == "ready"
    assert text("version") == server.statistics()["server"]["version"]
    assert text("error") == ""
    assert dom.count("<polyline") >= 4  # trust; NORM, load, transactions/s

    def cells(body_id: str) -> list[list[str]]:
        found = re.search(rf'id="{body_id}">(.*?)</tbody>', dom, re.S)
        assert found, (body_id, dom[-3000:])
        rows = re.findall(r"<tr>(.*?)</tr>", found.group(1), re.S)
        return [re.findall(r"<td[^>]*>([^<]*)</td>", row) for row in rows]

    # The busiest tables, most variables held first; the one waiter, on t/v0.
    assert cells("busiest") == [["ns", "t", "7"], ["ns", "u", "2"]]
    [wait] = cells("waits")
    assert wait[:3] == ["patient", "ns", "t/v0"] and wait[3].endswith("s")
