"""The container recipe (deploy/container/Dockerfile, issue 32).

No container engine runs on the machines this suite runs on, so the image is never built
here. What can be tested without one is: the file parses with buildkit's own parser (the
``dockerfile`` package wraps it), its shell commands parse (``sh -n``), it builds in one stage
and runs in another as an unprivileged user with its configuration in the environment (names
the server knows), the build context leaves the checkout's virtual environment and compiled
files out, and the runtime stage's commands work when laid out as the image lays them out: a
virtual environment holding the wheel, whose ``lockserver`` (the ENTRYPOINT) serves and whose
HEALTHCHECK command, run verbatim, says healthy while it serves and unhealthy once it stopped.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import dockerfile
import pytest
from install_support import Built, Venv

from lockbench._spawn import free_port
from lockserver import load_config

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "deploy" / "container" / "Dockerfile"
#: Where the image keeps the virtual environment.
PREFIX = "/opt/skylock"


@pytest.fixture(scope="module")
def commands() -> tuple[dockerfile.Command, ...]:
    return dockerfile.parse_file(str(RECIPE))


def test_the_recipe_parses_and_builds_in_two_stages(
    commands: tuple[dockerfile.Command, ...],
) -> None:
    """Two ``FROM`` of the same Python image (the build stage named ``build``), the runtime
    stage copying only the virtual environment from it."""
    froms = [c.value for c in commands if c.cmd == "FROM"]
    assert len(froms) == 2
    assert froms[0][1:] == ("AS", "build") and froms[1][0] == froms[0][0]
    assert froms[0][0].startswith("python:3.11")
    [copy] = [c for c in commands if c.cmd == "COPY" and c.flags]
    assert copy.flags == ("--from=build",) and copy.value == (PREFIX, PREFIX)


def test_each_shell_command_parses(commands: tuple[dockerfile.Command, ...]) -> None:
    """Every shell-form ``RUN`` is valid ``sh`` (what the builder runs it with)."""
    runs = [c for c in commands if c.cmd == "RUN"]
    assert runs and not any(c.json for c in runs)
    for run in runs:
        (script,) = run.value
        done = subprocess.run(
            ["sh", "-n", "-c", script], capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, (script, done.stderr)


def test_the_build_stage_installs_the_wheel_with_a_compiler(
    commands: tuple[dockerfile.Command, ...],
) -> None:
    """The build stage installs gcc and the C library headers, then ``pip install .`` into the
    virtual environment (non-editable: the compiled build) and prints its version."""
    build_stage = commands[: [c.cmd for c in commands].index("FROM", 1)]
    scripts = " ".join(c.value[0] for c in build_stage if c.cmd == "RUN")
    assert "gcc" in scripts and "libc6-dev" in scripts
    assert f"python -m venv {PREFIX}" in scripts
    assert f"{PREFIX}/bin/pip install --no-cache-dir ." in scripts
    assert f"{PREFIX}/bin/lockserver --version" in scripts


def test_it_runs_unprivileged_with_settings_the_server_knows(
    commands: tuple[dockerfile.Command, ...],
) -> None:
    """The runtime stage switches to the user it creates before the entry point; every ENV
    variable is a setting the server reads (it listens on every interface of the container,
    on the published port)."""
    runtime = commands[[c.cmd for c in commands].index("FROM", 1) :]
    [user] = [c.value[0] for c in runtime if c.cmd == "USER"]
    assert user == "lockserver"
    assert any(c.cmd == "RUN" and "useradd" in c.value[0] and user in c.value[0] for c in runtime)
    [env] = [c.value for c in runtime if c.cmd == "ENV"]
    environ = dict(zip(env[::2], env[1::2], strict=True))
    config = load_config([], environ)
    assert (config.host, config.port) == ("0.0.0.0", 7400)
    assert [c.value for c in runtime if c.cmd == "EXPOSE"] == [("7400",)]


def test_the_build_context_leaves_local_files_out() -> None:
    """.dockerignore keeps the checkout's virtual environment, its compiled files and caches
    out of the image (a compiled ``.so`` of this machine must not shadow the image's)."""
    ignored = (ROOT / ".dockerignore").read_text().split()
    for pattern in (".venv", ".git", "*.so", "lockserver_compiled.sources.json"):
        assert pattern in ignored, pattern


def test_the_entrypoint_serves_and_the_healthcheck_tells(
    commands: tuple[dockerfile.Command, ...], pure_wheel: Built, tmp_path: Path
) -> None:
    """Laid out as in the image (a virtual environment holding the wheel, at a temporary
    prefix, on loopback): the ENTRYPOINT serves, and the HEALTHCHECK command, verbatim but
    for the prefix, exits 0 while it serves and non-zero once it has stopped."""
    venv = Venv.create(tmp_path / "skylock", pure_wheel.path)
    [entry] = [c for c in commands if c.cmd == "ENTRYPOINT"]
    [health] = [c for c in commands if c.cmd == "HEALTHCHECK"]
    assert entry.json and health.json and health.value[0] == "CMD"
    assert "--interval=10s" in health.flags and "--timeout=3s" in health.flags

    def local(argv: tuple[str, ...]) -> list[str]:
        assert argv[0].startswith(f"{PREFIX}/bin/"), argv
        return [argv[0].replace(PREFIX, str(venv.root)), *argv[1:]]

    port = free_port()
    env = {**os.environ, "LOCKSERVER_HOST": "127.0.0.1", "LOCKSERVER_PORT": str(port)}
    env = {k: v for k, v in env.items() if not k.startswith("PYTHON")}

    def check() -> int:
        done = subprocess.run(
            local(health.value[1:]),
            env=env,
            cwd=tmp_path,
            capture_output=True,
            timeout=30,
            check=False,
        )
        return done.returncode

    with subprocess.Popen(
        local(entry.value), env=env, cwd=tmp_path, stdout=subprocess.PIPE, text=True
    ) as server:
        try:
            assert server.stdout is not None
            line = server.stdout.readline()
            assert line.strip() == f"lockserver listening on 127.0.0.1:{port}", line
            assert check() == 0
        finally:
            server.terminate()
            server.wait(10)
    assert server.returncode == 0
    assert check() != 0
