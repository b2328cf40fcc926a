"""What compiling the hot modules with mypyc would buy (issue 19): an evaluation, not a build.

``python -m benchmarks.mypyc_eval [--out DIR] [--rounds N] [--duration S] [--no-run]`` copies
the checkout's HEAD (``git archive``) into DIR/pure and, for each module group below, into
DIR/<group> where it compiles the group in place with mypyc (``mypycify``, opt level 3,
``build_ext --inplace``: a ``.so`` beside each ``.py``, which the import system prefers), then
runs ``benchmarks.cpu_ab`` over all the copies: server CPU per transaction, pinned, both
shapes of the target, interleaved. Needs mypy (the test extra), setuptools, a C compiler and
the Python headers. The copies are scratch: nothing of the checkout changes.

What mypyc refused at the time (7aada72) is fixed in the source since (lockserver/_build.py,
scripts/mypyc_build.py: the integrated build of the protocol + engine group), so the copies
are HEAD as it is. The shell group still compiles only with its attrs classes marked
``mypyc_attr(native_class=False)`` and is left out of the integrated build.
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROTOCOL = ["protocol/_codec.py", "protocol/_trees.py", "protocol/_framing.py"]
PROTOCOL += ["protocol/_connection.py"]
ENGINE = [f"lockserver/engine/{m}.py" for m in ("_eval", "_engine", "_store", "_waiting")]
ENGINE += [f"lockserver/engine/{m}.py" for m in ("_core", "_sharded", "_deadlines")]
SHELL = [f"lockserver/shell/{m}.py" for m in ("_requests", "_reading", "_busypoll")]
SHELL += ["lockserver/_peer.py"]
GROUPS: dict[str, list[str]] = {
    "mypyc-protocol": PROTOCOL,
    "mypyc-protocol+engine": PROTOCOL + ENGINE,
    "mypyc-protocol+engine+shell": PROTOCOL + ENGINE + SHELL,
}

_SETUP = """\
import sys
from setuptools import setup
from mypyc.build import mypycify
modules = sys.argv[3:]
del sys.argv[3:]  # setuptools reads the rest of the command line as commands
setup(name="scratch", packages=[], py_modules=[], ext_modules=mypycify(modules, opt_level="3"))
"""
_MYPY_INI = "[mypy]\npython_version = 3.11\n[mypy-msgpack.*]\nignore_missing_imports = True\n"


def copy_tree(dest: Path) -> None:
    """HEAD of the checkout into ``dest``, with a setup script for mypyc."""
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(dest, filter="data")
    (dest / "pyproject.toml").unlink()  # setuptools would read the project's metadata
    (dest / "mypy.ini").write_text(_MYPY_INI)
    (dest / "setup_mypyc.py").write_text(_SETUP)
    for path in SHELL:  # the shell's attrs classes (see the module header)
        module = dest / path
        text = module.read_text()
        if "\n@attrs." in text:
            future = "from __future__ import annotations\n"
            text = text.replace("\n@attrs.", "\n@mypyc_attr(native_class=False)\n@attrs.")
            text = text.replace(future, future + "from mypy_extensions import mypyc_attr\n", 1)
            module.write_text(text)


def compile_group(tree: Path, modules: list[str]) -> None:
    """Compile ``modules`` of ``tree`` in place (the log goes to ``tree/build.log``)."""
    with open(tree / "build.log", "wb") as log:
        cmd = [sys.executable, "setup_mypyc.py", "build_ext", "--inplace", *modules]
        subprocess.run(cmd, cwd=tree, stdout=log, stderr=subprocess.STDOUT, check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/lockserver-mypyc-eval"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--no-run", action="store_true", help="build the copies only")
    args = parser.parse_args(argv)
    out: Path = args.out.resolve()
    if out.exists():
        parser.error(f"{out} exists: give a new --out")
    trees = {"pure": out / "pure"}
    copy_tree(trees["pure"])
    for name, modules in GROUPS.items():
        trees[name] = out / name
        copy_tree(trees[name])
        compile_group(trees[name], modules)
        print(f"built {name}: {len(modules)} modules", flush=True)
    if args.no_run:
        return 0
    cmd = [sys.executable, "-m", "benchmarks.cpu_ab", "--rounds", str(args.rounds)]
    cmd += ["--duration", str(args.duration), *(f"{n}={t}" for n, t in trees.items())]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(cmd, cwd=ROOT, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
