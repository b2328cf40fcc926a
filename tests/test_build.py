"""Which build runs (lockserver/_build.py): the suite runs once pure and once compiled
(scripts/test.py), and says which it expects in ``LOCKSERVER_TEST_BUILD``; these tests make
sure the run tests what it says (CI cannot test pure twice) and that the server reports it."""

from __future__ import annotations

import importlib
import importlib.machinery
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lockserver import RunningServer
from lockserver._build import (
    COMPILED_MODULES,
    SOURCES_MANIFEST,
    build,
    build_problem,
    compiled_modules,
    source_digest,
    stale_modules,
)

EXPECTED = os.environ.get("LOCKSERVER_TEST_BUILD")


def test_the_run_tests_the_build_it_says() -> None:
    """With LOCKSERVER_TEST_BUILD=compiled every hot module was loaded from a compiled
    extension file (protocol._codec's ``__file__`` is a .so), with =pure every one from its
    .py file; without it the build is whole (pure or compiled), never a mix."""
    files = [importlib.import_module(name).__file__ or "" for name in COMPILED_MODULES]
    extension = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    if EXPECTED == "compiled":
        assert all(f.endswith(extension) for f in files), files
        assert build() == "compiled"
    elif EXPECTED == "pure":
        assert all(f.endswith(".py") for f in files), files
        assert build() == "pure" and compiled_modules() == ()
    else:
        assert EXPECTED is None, f"LOCKSERVER_TEST_BUILD={EXPECTED!r}: pure or compiled"
        assert build() in ("pure", "compiled")


def test_the_command_says_which_build_runs() -> None:
    """``lockserver --version`` names the version and the build."""
    out = subprocess.run(
        [sys.executable, "-m", "lockserver", "--version"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.startswith("lockserver ") and out.rstrip().endswith(f"({build()} build)"), out


async def test_the_server_says_which_build_runs(server: RunningServer) -> None:
    """The statistics' ``server.build`` is the build this process loaded (the status page and
    /metrics repeat it: tests/httpd)."""
    assert server.statistics()["server"]["build"] == build()


def _sources(tmp_path: Path, **texts: str) -> list[tuple[str, Path]]:
    """Source files named after modules, with the given texts."""
    loaded = []
    for name, text in texts.items():
        path = tmp_path / f"{name}.py"
        path.write_text(text)
        loaded.append((name, path))
    return loaded


def _manifest(tmp_path: Path, loaded: list[tuple[str, Path]]) -> Path:
    """A manifest recording the sources as they are now, as the build script writes it."""
    path = tmp_path / SOURCES_MANIFEST
    path.write_text(json.dumps({"sources": {n: source_digest(p) for n, p in loaded}}))
    return path


def test_modules_built_from_their_sources_are_not_stale(tmp_path: Path) -> None:
    loaded = _sources(tmp_path, a="x = 1\n", b="y = 2\n")
    assert stale_modules(loaded, _manifest(tmp_path, loaded)) == ()


def test_an_edited_source_makes_its_module_stale(tmp_path: Path) -> None:
    """Only the module whose source changed after the build is named."""
    loaded = _sources(tmp_path, a="x = 1\n", b="y = 2\n")
    manifest = _manifest(tmp_path, loaded)
    (tmp_path / "b.py").write_text("y = 3\n")
    assert stale_modules(loaded, manifest) == ("b",)


def test_without_a_readable_manifest_every_module_is_stale(tmp_path: Path) -> None:
    """No manifest (a build from before manifests), one that is not JSON, one of another
    shape, one that does not name a module, or a source that is gone: nothing vouches for the
    module, so it is stale."""
    loaded = _sources(tmp_path, a="x = 1\n", b="y = 2\n")
    manifest = tmp_path / SOURCES_MANIFEST
    assert stale_modules(loaded, manifest) == ("a", "b")
    for text in ("{not json", "[]", '{"sources": []}', '{"other": {}}'):
        manifest.write_text(text)
        assert stale_modules(loaded, manifest) == ("a", "b"), text
    _manifest(tmp_path, loaded[:1])
    assert stale_modules(loaded, manifest) == ("b",)
    (tmp_path / "a.py").unlink()
    assert stale_modules(loaded, manifest) == ("a", "b")


def test_the_checkout_runs_what_its_sources_say() -> None:
    """In either run of the suite the loaded build is whole and, compiled, built from the
    sources of this checkout (scripts/test.py builds right before the compiled run)."""
    assert build_problem() is None


def test_the_command_refuses_compiled_modules_of_other_sources(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``lockserver`` exits 2 with one line naming the problem, before it listens."""
    import lockserver.__main__ as command

    why = "the compiled module protocol._codec was not built from the source beside it"
    monkeypatch.setattr(command, "build_problem", lambda: why)

    def serve(*args: object) -> None:
        raise AssertionError("the command went on to serve")

    monkeypatch.setattr(command.trio, "run", serve)
    assert command.main(["--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err == f"lockserver: error: {why}\n"
