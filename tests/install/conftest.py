"""The install tests' wheels (tests/install/install_support.py), built once per test process:
``pure_wheel`` with ``SKYLOCK_PURE_PYTHON=1``, ``fallback_wheel`` with ``CC`` naming a compiler
that does not exist, ``compiled_wheel`` as a machine with a compiler builds it (skipped, saying
why, without one).

The tests of this folder build and install their own wheels from the sources, so their
outcome cannot depend on which build the checkout holds: they are marked
``build_independent`` and run in the compiled half of ``scripts/test.py`` only (which hands
them its wheel). They share the wheels, so they run on one xdist worker (``xdist_group``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from install_support import Built, build_wheel, missing_toolchain


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test of this folder builds its own wheels: build-independent, one worker."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.build_independent("builds and installs its own wheels"))
            item.add_marker(pytest.mark.xdist_group("wheels"))


@pytest.fixture(scope="session")
def pure_wheel(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """The wheel built with ``SKYLOCK_PURE_PYTHON=1``."""
    return build_wheel(tmp_path_factory.mktemp("pure-wheel"), {"SKYLOCK_PURE_PYTHON": "1"})


@pytest.fixture(scope="session")
def fallback_wheel(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """The wheel built where the C compiler is missing: ``CC`` names a program that does not
    exist (what the build reads to find its compiler, as distutils does)."""
    out = tmp_path_factory.mktemp("fallback-wheel")
    return build_wheel(out, {"CC": str(out / "no-such-cc"), "SKYLOCK_PURE_PYTHON": ""})


@pytest.fixture(scope="session")
def compiled_wheel(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """The wheel built as on a machine with a C compiler and the Python headers. scripts/test.py
    builds it once for its run, with the same hook, and names it in
    ``LOCKSERVER_TEST_COMPILED_WHEEL`` (its compiled half runs from that wheel's files); a
    run of its own builds it here."""
    given = os.environ.get("LOCKSERVER_TEST_COMPILED_WHEEL")
    if given:
        return Built(Path(given), stderr="")
    missing = missing_toolchain()
    if missing is not None:
        pytest.skip(missing)
    env = {"SKYLOCK_PURE_PYTHON": ""}
    return build_wheel(tmp_path_factory.mktemp("compiled-wheel"), env)
