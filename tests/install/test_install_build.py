"""Fast by default (issue 32): a wheel built where a C compiler and the Python headers are
installs the compiled build; one built without says why in one line and installs pure Python,
and says so again in ``lockserver --version``; ``SKYLOCK_PURE_PYTHON=1`` forces pure.

The missing compiler is simulated as a machine without one looks to the build: ``CC`` (the
variable the build reads for its compiler, as distutils does) names a program that does not
exist. Each wheel is installed into a fresh virtual environment and run from there.
"""

from __future__ import annotations

import re
from pathlib import Path

from install_support import Built, Venv

NOTICE = re.compile(r"^skylock: building a pure-Python wheel: (.+)$", re.MULTILINE)


def _version(venv: Venv, cwd: Path) -> str:
    done = venv.run([venv.bin("lockserver"), "--version"], cwd)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _serves(venv: Venv, cwd: Path) -> str:
    """What the installed server prints on its first line, started on a free port and
    stopped at once (``--port 0``; examples/quickstart.py's ``--once`` is not installed)."""
    code = (
        "import sys, trio\n"
        "from lockserver import ServerConfig, serve\n"
        "from lockserver._build import build\n"
        "async def main():\n"
        "    async with trio.open_nursery() as n:\n"
        "        running = await n.start(serve, ServerConfig(port=0))\n"
        "        print(build(), running.port > 0)\n"
        "        n.cancel_scope.cancel()\n"
        "trio.run(main)\n"
    )
    done = venv.run([venv.python, "-c", code], cwd)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_wheel_built_with_a_compiler_installs_the_compiled_build(
    compiled_wheel: Built, tmp_path: Path
) -> None:
    """No notice from the build; installed, ``lockserver --version`` says compiled and a
    server started from the wheel runs the compiled modules."""
    assert NOTICE.search(compiled_wheel.stderr) is None, compiled_wheel.stderr
    venv = Venv.create(tmp_path / "venv", compiled_wheel.path)
    assert re.fullmatch(r"lockserver \S+ \(compiled build\)", _version(venv, tmp_path))
    assert _serves(venv, tmp_path) == "compiled True"


def test_without_a_compiler_the_wheel_is_pure_and_says_why(
    fallback_wheel: Built, tmp_path: Path
) -> None:
    """The build says in exactly one line that the wheel is pure and why (the compiler it
    looked for); the wheel is ``py3-none-any``; installed, the server runs pure and
    ``--version`` repeats the reason."""
    notices = NOTICE.findall(fallback_wheel.stderr)
    assert len(notices) == 1, fallback_wheel.stderr
    [why] = notices
    assert why.startswith("no C compiler (") and "no-such-cc" in why, why
    assert fallback_wheel.path.name.endswith("-py3-none-any.whl")
    venv = Venv.create(tmp_path / "venv", fallback_wheel.path)
    version = _version(venv, tmp_path)
    assert version.endswith(f"(pure build: wheel built without compiling: {why})"), version
    assert _serves(venv, tmp_path) == "pure True"


def test_the_environment_variable_forces_pure(pure_wheel: Built, tmp_path: Path) -> None:
    """``SKYLOCK_PURE_PYTHON=1``: a pure wheel even with a compiler at hand, the variable
    named as the reason."""
    assert NOTICE.findall(pure_wheel.stderr) == ["SKYLOCK_PURE_PYTHON is set"]
    venv = Venv.create(tmp_path / "venv", pure_wheel.path)
    version = _version(venv, tmp_path)
    assert version.endswith(
        "(pure build: wheel built without compiling: SKYLOCK_PURE_PYTHON is set)"
    )
    assert _serves(venv, tmp_path) == "pure True"


def test_the_installed_wheel_is_what_runs(pure_wheel: Built, tmp_path: Path) -> None:
    """The packages come from the virtual environment, not from this checkout (which the
    test environment's editable install would put on the path)."""
    venv = Venv.create(tmp_path / "venv", pure_wheel.path)
    code = "import client, lockserver, protocol; print(client.__file__, protocol.__file__)"
    done = venv.run([venv.python, "-c", code], tmp_path)
    assert done.returncode == 0, done.stderr
    for path in done.stdout.split():
        assert Path(path).is_relative_to(venv.site()), path
