"""What happens when the wheel is installed beside another distribution with a top-level
package named ``client`` (issue 32; README, "Installing").

``client`` and ``protocol`` are the design's folder names and our import names, and generic
enough that another distribution may ship a package of the same name. Python has one
top-level namespace per environment and pip does not refuse, or even warn about, a second
distribution writing into the same package directory: the two are merged file by file and the
last one installed wins every file both have. These tests pin that down, in both orders, with
a stand-in distribution ``acme-client`` (a package ``client`` with ``__init__.py`` and
``http.py``), so the README's advice (one virtual environment per application; how to check
which distribution owns ``client``) rests on what really happens:

- skylock then acme-client: ``import client`` is acme's; ``from client import LockClient``
  fails naming the file that replaced ours, and so does the ``lockctl`` command;
- acme-client then skylock: ``import client`` is ours, acme's ``http.py`` lies inside it and
  acme's own names are gone;
- either way both distributions' records claim ``client/__init__.py``, which is how the
  README's one-line check finds the clash.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from install_support import Built, Venv

ACME_INIT = 'WHO = "acme"\n'
ACME_PYPROJECT = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "acme-client"
version = "1.0"

[tool.hatch.build.targets.wheel]
packages = ["client"]
"""

#: The README's check: which installed distributions have files in client/ or protocol/.
OWNERS = (
    "import importlib.metadata as m\n"
    "for d in m.distributions():\n"
    "    tops = {f.parts[0] for f in d.files or ()}\n"
    "    for name in sorted(tops & {'client', 'protocol'}):\n"
    "        print(name, d.metadata['Name'])\n"
)


@pytest.fixture(scope="module")
def acme_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stand-in distribution's wheel, built with hatchling like ours."""
    src = tmp_path_factory.mktemp("acme")
    (src / "pyproject.toml").write_text(ACME_PYPROJECT)
    (src / "client").mkdir()
    (src / "client" / "__init__.py").write_text(ACME_INIT)
    (src / "client" / "http.py").write_text("def get(url: str) -> str:\n    return url\n")
    out = src / "dist"
    code = "import sys; from hatchling.build import build_wheel; print(build_wheel(sys.argv[1]))"
    done = subprocess.run(
        [sys.executable, "-c", code, str(out)],
        cwd=src,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return out / done.stdout.strip().splitlines()[-1]


def _python(venv: Venv, code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return venv.run([venv.python, "-c", code], cwd)


def test_installed_after_skylock_the_other_client_replaces_ours(
    pure_wheel: Built, acme_wheel: Path, tmp_path: Path
) -> None:
    """pip installs acme-client over skylock without a word; ``client`` is then acme's, our
    names fail to import naming the replacing file, and ``lockctl`` cannot start."""
    venv = Venv.create(tmp_path / "venv", pure_wheel.path)
    installed = venv.pip("install", "--no-deps", "--no-index", str(acme_wheel))
    assert installed.stdout == "" and "client" not in installed.stderr
    who = _python(venv, "import client; print(client.WHO)", tmp_path)
    assert who.stdout.strip() == "acme", who.stderr
    ours = _python(venv, "from client import LockClient", tmp_path)
    assert ours.returncode == 1
    init = venv.site() / "client" / "__init__.py"
    assert f"cannot import name 'LockClient' from 'client' ({init})" in ours.stderr
    lockctl = venv.run([venv.bin("lockctl"), "--help"], tmp_path)
    assert lockctl.returncode == 1 and "ImportError" in lockctl.stderr
    owners = _python(venv, OWNERS, tmp_path).stdout.splitlines()
    assert sorted(owners) == ["client acme-client", "client skylock", "protocol skylock"]


def test_installed_before_skylock_the_other_client_is_replaced(
    pure_wheel: Built, acme_wheel: Path, tmp_path: Path
) -> None:
    """skylock installed second wins ``client/__init__.py``: our client works, acme's module
    ``client.http`` is left inside our package and acme's own names are gone."""
    venv = Venv.create(tmp_path / "venv", acme_wheel)
    venv.pip("install", "--no-deps", "--no-index", str(pure_wheel.path))
    ours = _python(venv, "from client import LockClient; print(LockClient.__module__)", tmp_path)
    assert ours.stdout.strip() == "client._sync", ours.stderr
    merged = _python(venv, "import client.http; print(client.http.get('x'))", tmp_path)
    assert merged.stdout.strip() == "x", merged.stderr
    theirs = _python(venv, "from client import WHO", tmp_path)
    assert theirs.returncode == 1 and "cannot import name 'WHO'" in theirs.stderr
    owners = _python(venv, OWNERS, tmp_path).stdout.splitlines()
    assert sorted(owners) == ["client acme-client", "client skylock", "protocol skylock"]


def test_alone_the_names_are_ours(pure_wheel: Built, tmp_path: Path) -> None:
    """In an environment of its own (the README's advice) only skylock owns ``client`` and
    ``protocol``."""
    venv = Venv.create(tmp_path / "venv", pure_wheel.path, with_dependencies=False)
    owners = _python(venv, OWNERS, tmp_path).stdout.splitlines()
    assert sorted(owners) == ["client skylock", "protocol skylock"]
