"""The wheel's build hook: a non-editable install is compiled when it can be (issue 32).

msgpack's model: ``pip install .`` (or ``pip wheel .``, or ``python -m build``) compiles the hot
modules (``lockserver._build.COMPILED_MODULES``) with mypyc when this machine has a C compiler
and the Python headers, and the wheel then carries the extension files, the mypyc runtime
library and the manifest of the sources they were built from (``lockserver._build``), tagged
for this interpreter and platform. When it cannot compile, or the compile fails, the wheel is
pure Python (``py3-none-any``) and the build says why in one line on stderr (pip shows a
backend's output with ``-v``; the wheel also records the reason, and ``lockserver --version``
repeats it). ``SKYLOCK_PURE_PYTHON=1`` forces the pure wheel (msgpack's
``MSGPACK_PUREPYTHON``). An editable install (``pip install -e .``) is never compiled here:
``scripts/mypyc_build.py`` compiles a checkout in place.

How it compiles is ``scripts/mypyc_build.py``'s (``--into``), loaded by path, so the wheel and
the in-place build are the same files. The compile needs mypy and setuptools and, because mypy
type-checks the modules before compiling them, the project's runtime dependencies; the hook
asks the build front end for them (``dependencies``), except when the pure wheel is forced.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

#: Set to 1 (or any non-empty value but 0) to build the pure-Python wheel without trying.
PURE_VARIABLE = "SKYLOCK_PURE_PYTHON"
#: Where in the wheel a pure wheel records why it is pure (``lockserver._build.PURE_NOTE``).
PURE_NOTE = "lockserver/_pure_wheel.txt"


def pure_forced() -> bool:
    """Whether the environment asks for the pure wheel."""
    return os.environ.get(PURE_VARIABLE, "").strip() not in ("", "0")


def _asked_for_editable() -> bool:
    """Whether this call comes from the PEP 660 hook ``get_requires_for_build_editable``.
    hatchling asks a build hook for its dependencies without saying which build they are for,
    so the caller's frame is the only place that says it."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "get_requires_for_build_editable":
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


class CompiledWheelHook(BuildHookInterface):  # type: ignore[type-arg]
    """Compiles the hot modules into a standard wheel, or says in one line why not."""

    PLUGIN_NAME = "custom"

    def dependencies(self) -> list[str]:
        """mypy (mypyc), setuptools (its extension build) and the runtime dependencies (which
        mypy reads while it type-checks), unless the pure wheel is forced or the front end asks
        for an editable install's requirements (never compiled: installing mypy and the rest
        into pip's build environment would cost an editable install ~8 s for nothing)."""
        if pure_forced() or _asked_for_editable():
            return []
        return ["mypy>=1.10", "setuptools>=70", *self.metadata.core.dependencies]

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel" or version != "standard":
            return  # the sdist, and editable installs: nothing to compile
        self._tmp = tempfile.TemporaryDirectory(prefix="skylock-wheel-")
        out = Path(self._tmp.name)
        why = self._why_pure() or self._compile(out / "lib")
        if why is None:
            build_data["pure_python"] = False
            build_data["infer_tag"] = True
            lib = out / "lib"
            for path in sorted(lib.rglob("*")):
                if path.is_file():
                    build_data["force_include"][str(path)] = path.relative_to(lib).as_posix()
            return
        print(f"skylock: building a pure-Python wheel: {why}", file=sys.stderr, flush=True)
        note = out / "pure_wheel.txt"
        note.write_text(why + "\n")
        build_data["force_include"][str(note)] = PURE_NOTE

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        tmp = getattr(self, "_tmp", None)
        if tmp is not None:
            tmp.cleanup()

    def _script(self) -> Any:
        """``scripts/mypyc_build.py`` of the tree being built, loaded by path."""
        spec = importlib.util.spec_from_file_location(
            "_skylock_mypyc_build", Path(self.root) / "scripts" / "mypyc_build.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    def _why_pure(self) -> str | None:
        """Why this wheel cannot be compiled here, or None."""
        if pure_forced():
            return f"{PURE_VARIABLE} is set"
        missing: str | None = self._script().missing_toolchain()
        return missing

    def _compile(self, lib: Path) -> str | None:
        """Compile into ``lib``; None when done, else why it failed (first line)."""
        lib.mkdir(parents=True)
        try:
            self._script().build(into=lib)
        except (Exception, SystemExit) as exc:  # setuptools reports a compiler error by exiting
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            return f"the compile failed ({first})"
        return None
