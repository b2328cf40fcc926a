"""Helpers of the install tests: wheels of this tree and fresh virtual environments.

``build_wheel`` builds the working tree's wheel with hatchling's PEP 517 hook in a subprocess,
as pip would build it but without build isolation (no network: the ``test`` extra brings
hatchling, mypy and setuptools). ``Venv.create`` makes a fresh virtual environment and installs
wheels into it with pip, ``--no-deps``; the runtime dependencies come from this test
environment through a path file, so nothing is downloaded, while the project itself is
imported only from the wheel (the editable install's own path file is not processed there).
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs

ROOT = Path(__file__).resolve().parents[2]
#: The directory of this test environment's installed packages (the runtime dependencies).
SITE = sysconfig.get_paths()["purelib"]


@attrs.frozen
class Built:
    """A wheel built from this tree, and what its build said on stderr."""

    path: Path
    stderr: str

    def names(self) -> list[str]:
        """The wheel's file names."""
        with zipfile.ZipFile(self.path) as archive:
            return archive.namelist()


def build_wheel(out: Path, env: Mapping[str, str]) -> Built:
    """Build the wheel of the working tree into ``out`` with ``env`` added to the
    environment, through hatchling's PEP 517 ``build_wheel`` (what pip calls)."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from hatchling.build import build_wheel; print(build_wheel(sys.argv[1]))",
            str(out),
        ],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return Built(out / done.stdout.strip().splitlines()[-1], done.stderr)


def missing_toolchain() -> str | None:
    """What a compiled build lacks on this machine (scripts/mypyc_build.py), or None."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "mypyc_build.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    return None if done.returncode == 0 else done.stdout.strip()


@attrs.frozen
class Venv:
    """A fresh virtual environment holding one installed wheel."""

    root: Path

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    def bin(self, command: str) -> Path:
        """The path of an installed command."""
        return self.root / "bin" / command

    def site(self) -> Path:
        """Its site-packages directory."""
        [site] = self.root.glob("lib/python*/site-packages")
        return site

    @classmethod
    def create(cls, where: Path, *wheels: Path, with_dependencies: bool = True) -> Venv:
        """A virtual environment at ``where`` with ``wheels`` installed by pip, in order."""
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", where], check=True)
        venv = cls(where)
        if with_dependencies:
            (venv.site() / "_test_dependencies.pth").write_text(SITE + "\n")
        for wheel in wheels:
            venv.pip("install", "--no-deps", "--no-index", "--no-compile", str(wheel))
        return venv

    def pip(self, *args: str) -> subprocess.CompletedProcess[str]:
        """This test environment's pip, acting on the virtual environment."""
        done = subprocess.run(
            [sys.executable, "-m", "pip", "--python", str(self.python), "-q", *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done

    def run(
        self, argv: Sequence[str | Path], cwd: Path, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run a command of (or a Python in) the environment, from ``cwd`` (never the
        checkout, whose packages would shadow the installed ones)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "LOCKSERVER"))}
        return subprocess.run(
            [str(a) for a in argv],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
