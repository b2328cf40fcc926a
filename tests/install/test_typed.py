"""The installed packages are typed for their users (PEP 561, issue 32).

A user's script, outside this repository, written against the installed wheel: ``mypy
--strict`` accepts it, and rejects the same script with one wrong annotation, naming the
client's real type (so mypy did read the client's annotations rather than taking its names
as ``Any``). Without the ``py.typed`` marker mypy refuses the import: the marker is what
makes the annotations count.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from install_support import Built, Venv

USER_SCRIPT = '''\
"""A user's program: the sync face, the async face and a recipe, fully annotated."""

from __future__ import annotations

import trio

from client import (
    Assert,
    AsyncLockClient,
    LockClient,
    Mutex,
    Not,
    Exists,
    Result,
    SetVar,
    open_lock_client,
)


def take(host: str, port: int) -> int | None:
    with LockClient(host, port) as c, c.session(max_age=30.0) as s:
        r: Result = s.execute("jobs", [Assert(Not(Exists("cron", "nightly")))])
        if not r.ok:
            return None
        with Mutex(s, "billing", "invoice-42") as lock:
            held: int | None = lock.fence
        return held


async def take_async(port: int) -> bool:
    async with open_lock_client(port=port) as c:
        client: AsyncLockClient = c
        async with client.session() as s:
            r = await s.execute("jobs", [Assert(SetVar("cron", "nightly"))])
            ok: bool = r.ok
            fence: int = r.fence
            return ok and fence > 0


if __name__ == "__main__":
    print(take("127.0.0.1", 7400), trio.run(take_async, 7400))
'''

#: The same script with one annotation wrong: a Result is not a str.
WRONG = USER_SCRIPT.replace("r: Result = s.execute", "r: str = s.execute")


def _mypy(venv: Venv, script: Path) -> subprocess.CompletedProcess[str]:
    """``mypy --strict`` on the user's script, with the virtual environment's packages (found
    through its interpreter, as a user's mypy finds them), run from the script's folder."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-incremental",
            "--python-executable",
            str(venv.python),
            script.name,
        ],
        cwd=script.parent,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture
def venv(pure_wheel: Built, tmp_path: Path) -> Venv:
    return Venv.create(tmp_path / "venv", pure_wheel.path)


def test_a_users_strict_script_type_checks(venv: Venv, tmp_path: Path) -> None:
    """The annotated user script passes ``mypy --strict`` against the installed wheel."""
    script = tmp_path / "user" / "app.py"
    script.parent.mkdir()
    script.write_text(USER_SCRIPT)
    done = _mypy(venv, script)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Success: no issues found in 1 source file" in done.stdout


def test_a_wrong_annotation_is_caught_with_the_clients_type(venv: Venv, tmp_path: Path) -> None:
    """Assigning a ``Result`` to a ``str`` is an error naming ``Result``: mypy read the
    client's annotations."""
    script = tmp_path / "user" / "app.py"
    script.parent.mkdir()
    script.write_text(WRONG)
    done = _mypy(venv, script)
    assert done.returncode == 1, done.stdout + done.stderr
    assert 'expression has type "Result", variable has type "str"' in done.stdout, done.stdout


def test_without_the_marker_the_import_is_refused(venv: Venv, tmp_path: Path) -> None:
    """With ``client/py.typed`` removed from the installed package, mypy reports the module
    as installed without a marker: the marker is what the passing test relies on."""
    (venv.site() / "client" / "py.typed").unlink()
    script = tmp_path / "user" / "app.py"
    script.parent.mkdir()
    script.write_text(USER_SCRIPT)
    done = _mypy(venv, script)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "module is installed, but missing library stubs or py.typed marker" in done.stdout
