"""Build the optional compiled modules in place, or remove them (issue 19).

``python scripts/mypyc_build.py`` compiles ``lockserver._build.COMPILED_MODULES`` with mypyc
(opt level 3) into this checkout: a ``.so`` beside each ``.py`` (the import system prefers
it) and one shared runtime library at the top. An editable install (``pip install -e .``)
then runs compiled; ``lockserver --version`` says which build runs.
``python scripts/mypyc_build.py --clean`` removes every compiled file again: the checkout is
pure Python, as it is by default. ``--check`` exits 0 when a C compiler and the Python
headers are there, 1 (saying what is missing) when not. ``--into DIR`` compiles into DIR,
laid out as the packages are, and leaves the checkout alone: that is how the wheel's build
hook (``hatch_build.py``) gets the same files, so a non-editable ``pip install .`` is compiled.

Needs mypy and setuptools (the test extra), a C compiler and the Python headers (Debian:
``gcc python3-dev``). The intermediate C files go to a temporary directory; nothing but the
extension files and the manifest of their sources' digests
(``lockserver._build.SOURCES_MANIFEST``) is left in the checkout. A compiled module does not
follow its ``.py``: after editing one, build again or clean (the ``lockserver`` command
refuses to start with compiled modules whose sources changed, and says so).
"""

from __future__ import annotations

import argparse
import functools
import importlib.machinery
import importlib.util
import json
import os
import shutil
import sys
import sysconfig
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: Where compiled files may be: the packages, and the top for the shared runtime library.
PACKAGES = ("protocol", "lockserver", "client", "lockbench", "lockctl")
GROUP = "lockserver_compiled"


@functools.cache
def _build_module() -> Any:
    """``lockserver/_build.py``, loaded by path without importing the project (whose compiled
    modules may be stale)."""
    spec = importlib.util.spec_from_file_location("_build", ROOT / "lockserver" / "_build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compiled_modules_list() -> tuple[str, ...]:
    """``COMPILED_MODULES``, as ``lockserver/_build.py`` lists them."""
    return tuple(_build_module().COMPILED_MODULES)


def manifest_path() -> Path:
    """Where the build records its sources' digests."""
    return ROOT / str(_build_module().SOURCES_MANIFEST)


def write_manifest(top: Path = ROOT) -> None:
    """Record the SHA-256 of each compiled module's source, as it was compiled, in the
    manifest at ``top`` (the checkout, or the top of a wheel's build)."""
    module = _build_module()
    sources = {
        name: module.source_digest(ROOT / (name.replace(".", "/") + ".py"))
        for name in module.COMPILED_MODULES
    }
    (top / str(module.SOURCES_MANIFEST)).write_text(
        json.dumps({"sources": sources}, indent=1) + "\n"
    )


def compiled_files(top: Path = ROOT) -> list[Path]:
    """Every extension file of a compiled build under ``top`` (by default this checkout)."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    found = [p for p in top.glob(f"{GROUP}__mypyc*") if p.name.endswith(suffixes)]
    for package in PACKAGES:
        found += [p for p in (top / package).rglob("*") if p.name.endswith(suffixes)]
    return sorted(found)


def clean() -> int:
    """Remove the compiled files and the manifest; returns how many compiled files there
    were."""
    files = compiled_files()
    for path in files:
        path.unlink()
    manifest_path().unlink(missing_ok=True)
    return len(files)


def missing_toolchain() -> str | None:
    """What a build lacks on this machine (a C compiler, the Python headers), or None."""
    compiler = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        return f"no C compiler ({compiler!r} not found; Debian: apt-get install gcc)"
    include = Path(sysconfig.get_paths()["include"])
    if not (include / "Python.h").exists():
        return f"no Python headers ({include}/Python.h; Debian: apt-get install python3-dev)"
    for module in ("mypyc", "setuptools"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (pip install -e '.[test]')"
    return None


def build(into: Path | None = None) -> None:
    """Compile the modules in place (after removing any earlier build), or, with ``into``,
    into that directory (the packages' layout, the manifest at its top), leaving the
    checkout as it is."""
    from mypyc.build import mypycify
    from setuptools import setup

    if into is None:
        clean()
    # The digests of the sources as they are now, before compiling them: an edit made during
    # the build then shows as stale rather than hiding behind a later digest.
    write_manifest(ROOT if into is None else into)
    # setuptools reads the project's pyproject.toml (cwd) and warns about its metadata, which
    # this build does not use.
    warnings.filterwarnings("ignore", message=".*project.license.*")
    paths = [name.replace(".", "/") + ".py" for name in compiled_modules_list()]
    with tempfile.TemporaryDirectory(prefix="lockserver-mypyc-") as tmp:
        place = ["--inplace"] if into is None else []
        cwd = os.getcwd()
        os.chdir(ROOT)  # mypy reads the project's configuration; paths are relative to it
        try:
            extensions = mypycify(
                paths, opt_level="3", target_dir=tmp, group_name=GROUP, verbose=False
            )
            setup(
                name="lockserver-compiled",
                packages=[],
                py_modules=[],
                ext_modules=extensions,
                script_args=[
                    "-q",
                    "build_ext",
                    *place,
                    "--build-temp",
                    tmp,
                    "--build-lib",
                    tmp if into is None else str(into),
                ],
            )
        finally:
            os.chdir(cwd)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--clean", action="store_true", help="remove the compiled files")
    action.add_argument("--check", action="store_true", help="can this machine build?")
    action.add_argument(
        "--into", type=Path, metavar="DIR", help="compile into DIR, not into the checkout"
    )
    args = parser.parse_args(argv)
    if args.clean:
        print(f"removed {clean()} compiled files")
        return 0
    missing = missing_toolchain()
    if args.check or missing is not None:
        print(f"cannot build the compiled modules: {missing}" if missing else "ready to build")
        return 1 if missing else 0
    started = time.monotonic()
    build(args.into)
    built = compiled_files(ROOT if args.into is None else args.into)
    print(f"compiled {len(built)} files in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
