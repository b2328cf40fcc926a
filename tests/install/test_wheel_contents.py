"""What the distribution installs: the wheels built from this tree (issues 15 and 32).

Pinned down: the distribution is ``skylock`` (``lockserver`` on the package index is an
unrelated project); the wheel's top-level packages are exactly ``protocol``, ``lockserver``,
``client``, ``lockbench`` (the harness and the test oracles) and ``lockctl`` (the operator's
command), each with its ``py.typed`` marker; ``benchmarks/`` (scripts and results) and
``tests/`` stay in the repository. It declares the ``lockserver``, ``lockbench`` and ``lockctl``
commands, and no module it ships imports a package that stays behind. The oracles
(``lockbench.safety``, ``lockbench.fuzz``) import with the project's own dependencies alone;
without the ``bench`` extra the ``lockbench`` command says which extra it needs. A pure wheel
holds no compiled file; a compiled one holds exactly the extension files of the compiled
modules, mypyc's runtime library and the manifest of their sources, and is tagged for this
interpreter and platform (tests/install/conftest.py builds both).
"""

from __future__ import annotations

import ast
import configparser
import importlib
import importlib.machinery
import json
import subprocess
import sys
import zipfile
from pathlib import Path, PurePosixPath

from install_support import Built

from lockserver._build import COMPILED_MODULES, DISTRIBUTION, SOURCES_MANIFEST, source_digest

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = {"protocol", "lockserver", "client", "lockbench", "lockctl"}
STAY_BEHIND = {"benchmarks", "tests"}
BENCH_EXTRA = ("rich", "hdrh", "psutil", "redis", "matplotlib")
EXTENSION = tuple(importlib.machinery.EXTENSION_SUFFIXES)


def _dist_info(names: list[str]) -> str:
    [info] = {n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")}
    return info


def test_the_distribution_is_named_skylock(pure_wheel: Built) -> None:
    """The wheel, its metadata and the name the server reads its version under are
    ``skylock``."""
    assert pure_wheel.path.name.startswith("skylock-")
    assert _dist_info(pure_wheel.names()).startswith("skylock-")
    with zipfile.ZipFile(pure_wheel.path) as wheel:
        metadata = wheel.read(f"{_dist_info(pure_wheel.names())}/METADATA").decode()
    assert "\nName: skylock\n" in metadata
    assert DISTRIBUTION == "skylock"


def test_the_wheel_ships_exactly_its_packages(pure_wheel: Built) -> None:
    """Top level: protocol, lockserver, client, lockbench, lockctl and the metadata; no
    ``benchmarks``, no ``tests``, no loose modules; each package says it is typed
    (``py.typed``, PEP 561)."""
    names = pure_wheel.names()
    tops = {PurePosixPath(n).parts[0] for n in names}
    assert tops - {_dist_info(names)} == SHIPPED
    for package in SHIPPED:
        assert f"{package}/__init__.py" in names, package
        assert f"{package}/py.typed" in names, package


def test_the_pure_wheel_is_pure_python(pure_wheel: Built) -> None:
    """No compiled file: the wheel installs anywhere (a compiled build made in place stays in
    the checkout it was built in, even when the wheel is built from that checkout)."""
    assert [n for n in pure_wheel.names() if n.endswith((".so", ".pyd", ".c"))] == []
    assert pure_wheel.path.name.endswith("-py3-none-any.whl")


def test_the_compiled_wheel_ships_the_compiled_modules(compiled_wheel: Built) -> None:
    """One extension file per compiled module, mypyc's runtime library and the manifest of
    the sources, which are the tree's; the packages and their sources as in the pure wheel;
    tagged for this interpreter (``cp311-cp311-linux_x86_64`` here)."""
    names = compiled_wheel.names()
    extensions = sorted(n for n in names if n.endswith(EXTENSION))
    modules = sorted(n.split(".")[0].replace("/", ".") for n in extensions if "/" in n)
    assert modules == sorted(COMPILED_MODULES)
    runtime = [n for n in extensions if "/" not in n]
    assert len(runtime) == 1 and runtime[0].startswith("lockserver_compiled__mypyc."), runtime
    tops = {PurePosixPath(n).parts[0] for n in names}
    assert tops - {_dist_info(names)} == SHIPPED | {runtime[0], SOURCES_MANIFEST}
    with zipfile.ZipFile(compiled_wheel.path) as wheel:
        manifest = json.loads(wheel.read(SOURCES_MANIFEST))["sources"]
    assert manifest == {
        m: source_digest(ROOT / (m.replace(".", "/") + ".py")) for m in COMPILED_MODULES
    }
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert f"-{tag}-{tag}-" in compiled_wheel.path.name
    assert not compiled_wheel.path.name.endswith("-none-any.whl")


def test_the_oracles_are_in_the_wheel(pure_wheel: Built) -> None:
    """The safety checker and the fuzz generator ship as lockbench's public modules, with the
    harness and its ``python -m lockbench`` entry."""
    names = set(pure_wheel.names())
    for module in ("safety.py", "fuzz.py", "__main__.py", "_cli.py"):
        assert f"lockbench/{module}" in names, module


def test_the_status_page_is_in_the_wheel(pure_wheel: Built) -> None:
    """The HTTP status page is a data file of ``lockserver`` and ships with it, byte for
    byte (the server reads it with importlib.resources)."""
    with zipfile.ZipFile(pure_wheel.path) as wheel:
        shipped = wheel.read("lockserver/http/_static/status.html")
    assert shipped == (ROOT / "lockserver" / "http" / "_static" / "status.html").read_bytes()


def test_the_commands_are_declared(pure_wheel: Built) -> None:
    """entry_points.txt declares ``lockbench = lockbench:main``, ``lockctl = lockctl:main``
    and the server's command, and every target resolves to a callable."""
    parser = configparser.ConfigParser()
    with zipfile.ZipFile(pure_wheel.path) as wheel:
        info = _dist_info(wheel.namelist())
        parser.read_string(wheel.read(f"{info}/entry_points.txt").decode())
    scripts = dict(parser["console_scripts"])
    assert scripts == {
        "lockbench": "lockbench:main",
        "lockctl": "lockctl:main",
        "lockserver": "lockserver.__main__:main",
    }
    for target in scripts.values():
        module, _, attr = target.partition(":")
        assert callable(getattr(importlib.import_module(module), attr)), target


def test_no_shipped_module_imports_what_stays_behind(pure_wheel: Built) -> None:
    """Every module in the wheel imports neither ``benchmarks`` nor ``tests`` (also lazily,
    inside functions): an installed lockbench must not need the repository."""
    bad = []
    with zipfile.ZipFile(pure_wheel.path) as wheel:
        sources = {n: wheel.read(n) for n in wheel.namelist() if n.endswith(".py")}
    for name, source in sources.items():
        for node in ast.walk(ast.parse(source, name)):
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
    assert "pip install 'skylock[bench]'" in done.stderr
