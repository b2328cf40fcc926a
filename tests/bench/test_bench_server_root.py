"""``LOCKBENCH_SERVER_ROOT``: a spawned server runs another checkout's code (the "before"
side of a before/after sitting), the result's machine stamp names that code, and a
directory without a ``lockserver`` package is refused with the variable's name."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from lockbench._results import machine_info
from lockbench._spawn import PACKAGES_ROOT, SpawnError, server_root, spawned
from lockbench._targets import Backend
from lockbench.replicas import ReplicaGroup
from lockserver._build import SOURCES_MANIFEST

MARK = "# written by test_bench_server_root\n"


def _copy_of_the_server(into: Path, marker: Path) -> Path:
    """A checkout-like copy of lockserver and protocol whose __main__ first writes its own
    path into ``marker``, so the test can tell which code the spawned process ran."""
    root = into / "other-checkout"
    for package in ("lockserver", "protocol"):
        shutil.copytree(
            PACKAGES_ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    manifest = PACKAGES_ROOT / SOURCES_MANIFEST  # a compiled checkout's: it vouches for its .so
    if manifest.exists():
        shutil.copy(manifest, root / SOURCES_MANIFEST)
    main = root / "lockserver" / "__main__.py"
    source = main.read_text()
    head, sep, rest = source.partition("from __future__ import annotations\n")
    assert sep, "lockserver/__main__.py starts with its future import"
    main.write_text(
        f"{head}{sep}{MARK}from pathlib import Path as _P\n"
        f"_P({str(marker)!r}).write_text(__file__)\n{rest}"
    )
    return root


def test_unset_means_this_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOCKBENCH_SERVER_ROOT", raising=False)
    assert server_root() == PACKAGES_ROOT
    assert machine_info()["server_root"] == str(PACKAGES_ROOT)


def test_a_directory_without_the_package_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCKBENCH_SERVER_ROOT", str(tmp_path))
    with pytest.raises(SpawnError, match=r"LOCKBENCH_SERVER_ROOT=.*no lockserver package"):
        server_root()
    with pytest.raises(SpawnError, match="LOCKBENCH_SERVER_ROOT"), spawned(Backend.LOCKSERVER):
        pass


def test_the_spawned_server_runs_the_named_checkout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "ran"
    root = _copy_of_the_server(tmp_path, marker)
    monkeypatch.setenv("LOCKBENCH_SERVER_ROOT", str(root))
    with spawned(Backend.LOCKSERVER) as server:
        assert server.port > 0
    assert Path(marker.read_text()).resolve() == (root / "lockserver" / "__main__.py").resolve()
    assert machine_info()["server_root"] == str(root.resolve())


def test_replicas_run_the_named_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replica ``lockbench.replicas.ReplicaGroup`` starts runs the named checkout's code
    too (the replication benchmark's before/after sitting); no etcd needed: the marker is
    written before the replica looks for one."""
    marker = tmp_path / "ran"
    root = _copy_of_the_server(tmp_path, marker)
    monkeypatch.setenv("LOCKBENCH_SERVER_ROOT", str(root))
    with ReplicaGroup(["127.0.0.1:1"], tmp_path / "replicas", n=1) as group:
        group._spawn(group.replicas[0])
        deadline = time.monotonic() + 20
        # Until the marker has its text: it exists, empty, a moment before it is written.
        while not (marker.exists() and marker.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
    assert Path(marker.read_text()).resolve() == (root / "lockserver" / "__main__.py").resolve()
