"""What the distribution installs: the wheel built from this tree (issue 15, item 7).

Pinned down: the wheel's top-level packages are exactly ``protocol``, ``lockserver``,
``client``, ``lockbench`` (the harness and the test oracles) and ``lockctl`` (the operator's
command); ``benchmarks/`` (scripts and results) and ``tests/`` stay in the repository. It
declares the ``lockserver``, ``lockbench`` and ``lockctl`` commands, and no module it ships
imports a package that stays behind. The oracles
(``lockbench.safety``, ``lockbench.fuzz``) import with lockserver's own dependencies alone;
without the ``bench`` extra the ``lockbench`` command says which extra it needs.

The wheel is built with hatchling's PEP 517 hook in a subprocess (no network, no build
isolation); hatchling comes with the ``test`` extra.
"""

from __future__ import annotations

import ast
import configparser
import importlib
import importlib.util
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = {"protocol", "lockserver", "client", "lockbench", "lockctl"}
STAY_BEHIND = {"benchmarks", "tests"}
BENCH_EXTRA = ("rich", "hdrh", "psutil", "redis", "matplotlib")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[zipfile.ZipFile]:
    """The wheel of the working tree, built once for this module."""
    if importlib.util.find_spec("hatchling") is None:
        pytest.skip(
            "hatchling (the build backend) is not installed; it comes with the test extra: "
            "pip install -e '.[test]'"
        )
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from hatchling.build import build_wheel; print(build_wheel(sys.argv[1]))",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    name = done.stdout.strip().splitlines()[-1]
    with zipfile.ZipFile(out / name) as archive:
        yield archive


def _dist_info(wheel: zipfile.ZipFile) -> str:
    [info] = {n.split("/")[0] for n in wheel.namelist() if n.split("/")[0].endswith(".dist-info")}
    return info


def test_the_wheel_ships_exactly_its_packages(wheel: zipfile.ZipFile) -> None:
    """Top level: protocol, lockserver, client, lockbench, lockctl and the metadata; no
    ``benchmarks``, no ``tests``, no loose modules."""
    tops = {PurePosixPath(n).parts[0] for n in wheel.namelist()}
    assert tops - {_dist_info(wheel)} == SHIPPED
    for package in SHIPPED:
        assert f"{package}/__init__.py" in wheel.namelist(), package


def test_the_wheel_is_pure_python(wheel: zipfile.ZipFile) -> None:
    """No compiled file: the wheel installs anywhere (the optional compiled build stays in the
    checkout it was built in, even when the wheel is built from that checkout)."""
    assert [n for n in wheel.namelist() if n.endswith((".so", ".pyd", ".c"))] == []
    assert wheel.filename is None or "none-any" in wheel.filename


def test_the_oracles_are_in_the_wheel(wheel: zipfile.ZipFile) -> None:
    """The safety checker and the fuzz generator ship as lockbench's public modules, with the
    harness and its ``python -m lockbench`` entry."""
    names = set(wheel.namelist())
    for module in ("safety.py", "fuzz.py", "__main__.py", "_cli.py"):
        assert f"lockbench/{module}" in names, module


def test_the_status_page_is_in_the_wheel(wheel: zipfile.ZipFile) -> None:
    """The HTTP status page is a data file of ``lockserver`` and ships with it, byte for
    byte (the server reads it with importlib.resources)."""
    shipped = wheel.read("lockserver/_static/status.html")
    assert shipped == (ROOT / "lockserver" / "_static" / "status.html").read_bytes()


def test_the_commands_are_declared(wheel: zipfile.ZipFile) -> None:
    """entry_points.txt declares ``lockbench = lockbench:main``, ``lockctl = lockctl:main``
    and the server's command, and every target resolves to a callable."""
    parser = configparser.ConfigParser()
    parser.read_string(wheel.read(f"{_dist_info(wheel)}/entry_points.txt").decode())
    scripts = dict(parser["console_scripts"])
    assert scripts == {
        "lockbench": "lockbench:main",
        "lockctl": "lockctl:main",
        "lockserver": "lockserver.__main__:main",
    }
    for target in scripts.values():
        module, _, attr = target.partition(":")
        assert callable(getattr(importlib.import_module(module), attr)), target


def test_no_shipped_module_imports_what_stays_behind(wheel: zipfile.ZipFile) -> None:
    """Every module in the wheel imports neither ``benchmarks`` nor ``tests`` (also lazily,
    inside functions): an installed lockbench must not need the repository."""
    bad = []
    for name in wheel.namelist():
        if not name.endswith(".py"):
            continue
        for node in ast.walk(ast.parse(wheel.read(name), name)):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                modules = [node.module]
            else:
                continue
            bad += [f"{name}:{node.lineno}: {m}" for m in modules if m.split(".")[0] in STAY_BEHIND]
    assert bad == []


def _without_bench_extra(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter in which the bench extra's modules cannot import."""
    block = f"import sys\nfor m in {BENCH_EXTRA!r}:\n    sys.modules[m] = None\n"
    return subprocess.run(
        [sys.executable, "-c", block + code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_oracles_need_no_bench_extra() -> None:
    """``lockbench``, ``lockbench.safety`` and ``lockbench.fuzz`` import with only
    lockserver's own dependencies: importing the package does not load the harness."""
    done = _without_bench_extra(
        "import lockbench, lockbench.safety, lockbench.fuzz\n"
        "assert 'lockbench._cli' not in sys.modules\n"
        "print(lockbench.safety.check([]).ok)\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"


def test_the_command_names_the_missing_extra() -> None:
    """Without the bench extra, ``lockbench`` exits 2 with one error line naming the extra."""
    done = _without_bench_extra("import lockbench\nsys.exit(lockbench.main(['--help']))\n")
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith("lockbench: error: rich is not installed")
    assert "pip install 'lockserver[bench]'" in done.stderr
