"""The public surface of ``lockserver`` (what an embedding program and the command use) and
of ``lockserver.engine`` (LockCore, the door the shell calls, and the engine and wait queue
behind it): names with their kinds, the signatures callers rely on, the config's fields.
Only public names are imported here.

The exact name list of ``lockserver.engine`` is pinned by tests/engine/test_api.py; this file
pins the kind of each name, the signatures of the calls the shell makes through the door and
the door makes on the engine and the wait queue, and that ``__all__`` is the whole public
surface (nothing leaks, nothing is missing)."""

from __future__ import annotations

import ast
import inspect
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

import lockserver
from lockserver import ConfigError, RunningServer, ServerConfig, TrustSettings, engine

CLASS, FUNCTION, ASYNC_FUNCTION, TYPE_ALIAS = "class", "function", "async function", "type alias"


def kind_of(obj: object) -> str:
    if isinstance(obj, type):
        return CLASS
    if inspect.iscoroutinefunction(obj):
        return ASYNC_FUNCTION
    # A compiled build's functions are builtin functions (lockserver/_build.py).
    if isinstance(obj, (types.FunctionType, types.BuiltinFunctionType)):
        return FUNCTION
    if isinstance(obj, (types.GenericAlias, types.UnionType)):
        return TYPE_ALIAS
    return type(obj).__name__


def plain_signature(obj: Callable[..., Any]) -> str:
    """The signature as callers use it: names, kinds and defaults, without annotations."""
    sig = inspect.signature(obj)
    params = [p.replace(annotation=inspect.Parameter.empty) for p in sig.parameters.values()]
    return str(sig.replace(parameters=params, return_annotation=inspect.Signature.empty))


def source_signature(obj: Any) -> str:
    """``plain_signature`` read from the source of a function or method (``module.name`` or
    ``module.Class.name``): the same in the pure and the compiled build, whose methods
    introspect differently (a positional-only ``self``, keyword-only parameters not shown)."""
    # A compiled method is a method descriptor: no __module__, but its class has one.
    module = sys.modules[getattr(obj, "__module__", None) or obj.__objclass__.__module__]
    path = Path(module.__file__ or "").with_name(module.__name__.rpartition(".")[2] + ".py")
    scope: list[ast.stmt] = ast.parse(path.read_text()).body
    *outer, name = obj.__qualname__.split(".")
    if isinstance(obj, type):  # a class: its __init__ as callers see it, without self
        *outer, name = *outer, name, "__init__"
    for part in outer:
        scope = next(n for n in scope if isinstance(n, ast.ClassDef) and n.name == part).body
    fn = next(n for n in scope if isinstance(n, ast.FunctionDef) and n.name == name)
    args = fn.args
    for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg):
        if arg is not None:
            arg.annotation = None
    if isinstance(obj, type):
        args.args = args.args[1:]
    return f"({ast.unparse(args)})"


def public_attributes(module: types.ModuleType) -> set[str]:
    return {
        n
        for n in dir(module)
        if not n.startswith("_") and not isinstance(getattr(module, n), types.ModuleType)
    }


# --- lockserver ----------------------------------------------------------------------------------

LOCKSERVER = {
    "serve": ASYNC_FUNCTION,
    "RunningServer": CLASS,
    "ServerConfig": CLASS,
    "TrustSettings": CLASS,
    "load_config": FUNCTION,
    "ConfigError": CLASS,
}


def test_lockserver_all_is_exactly_the_public_surface() -> None:
    """lockserver.__all__ lists exactly serve, RunningServer, ServerConfig, TrustSettings,
    load_config and ConfigError, each of its kind; no other public attribute; star-import
    gives exactly __all__; each is defined in one of lockserver's private modules."""
    assert len(lockserver.__all__) == len(set(lockserver.__all__))
    assert {n: kind_of(getattr(lockserver, n)) for n in lockserver.__all__} == LOCKSERVER
    assert public_attributes(lockserver) == set(lockserver.__all__)
    namespace: dict[str, object] = {}
    exec("from lockserver import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(lockserver.__all__)
    for name in lockserver.__all__:
        module = getattr(lockserver, name).__module__
        assert module.startswith("lockserver.") and module.rpartition(".")[2][0] == "_", name


def test_serve_and_load_config_signatures() -> None:
    """``await nursery.start(serve, config)`` (task_status for nursery.start), and
    ``load_config(argv, environ)`` (both optional: the command line and the environment);
    a ConfigError is a ValueError. ``group`` is the internal keyword-only hook that makes the
    welcome a replica's (``lockserver.shell._server.GroupIdentity``), None for a standalone
    server."""
    assert plain_signature(lockserver.serve) == (
        "(config, *, task_status=TASK_STATUS_IGNORED, group=None)"
    )
    default = inspect.signature(lockserver.serve).parameters["task_status"].default
    assert default is trio.TASK_STATUS_IGNORED
    assert plain_signature(lockserver.load_config) == "(argv=None, environ=None)"
    assert issubclass(ConfigError, ValueError)


#: Every ServerConfig field: the config file's keys and the command's options.
SERVER_CONFIG_FIELDS = [
    "host",
    "port",
    "processes",
    "max_frame",
    "max_ops",
    "max_depth",
    "max_name",
    "max_text",
    "max_value",
    "max_ttl",
    "max_connections",
    "max_sessions",
    "max_entries",
    "max_entries_per_session",
    "max_store_bytes",
    "max_session_age",
    "sweep_interval",
    "max_send_buffer",
    "send_timeout",
    "handshake_timeout",
    "idle_timeout",
    "frame_timeout",
    "max_receive_total",
    "max_send_total",
    "max_wait",
    "max_waiters",
    "max_waiters_per_session",
    "max_waiters_per_connection",
    "max_waiting_ops_per_variable",
    "max_waiting_ops_per_session",
    "max_waiting_ops_per_principal",
    "max_subscriptions",
    "max_subscriptions_per_principal",
    "busy_poll",
    "http_max_connections",
    "http_max_header",
    "http_request_timeout",
    "http_idle_timeout",
    "ready_min_trust",
    "ready_min_uptime",
    "log_level",
    "log_json",
    "tokens",
    "tls_cert",
    "tls_key",
    "tls_client_ca",
    "replicate",
    "etcd_ca_file",
    "etcd_cert_file",
    "etcd_key_file",
    "etcd_user",
    "etcd_password_file",
    "group",
    "replica_lease_ttl",
    "replica_snapshot_every",
    "replica_snapshot_chunk",
    "replica_snapshot_rate",
    "replica_commit_poll",
    "group_secret_file",
    "skip_revision",
    "trust",
]

TRUST_SETTINGS_FIELDS = [
    "tick",
    "load_alpha",
    "spike_window",
    "norm_alpha",
    "norm_half_life",
    "norm_floor",
    "source_cap",
]


@pytest.mark.parametrize(
    ("cls", "fields"),
    [(ServerConfig, SERVER_CONFIG_FIELDS), (TrustSettings, TRUST_SETTINGS_FIELDS)],
    ids=["ServerConfig", "TrustSettings"],
)
def test_config_records(cls: type, fields: list[str]) -> None:
    """ServerConfig and TrustSettings are frozen attrs records with exactly these fields, all
    with defaults (``cls()`` works) and settable by keyword; ``attrs.evolve`` makes a
    changed copy."""
    assert [f.name for f in attrs.fields(cls)] == fields
    record = cls()
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        setattr(record, fields[0], getattr(record, fields[0]))
    assert attrs.evolve(record) == record


def test_server_config_defaults_named_in_the_readme() -> None:
    """The command listens on 127.0.0.1:7400 unless told otherwise, and checks its trust with
    the default TrustSettings."""
    config = ServerConfig()
    assert (config.host, config.port) == ("127.0.0.1", 7400)
    assert config.trust == TrustSettings()


async def test_running_server_interface(server: RunningServer) -> None:
    """What ``nursery.start(serve, ...)`` hands out: the bound address (host, port, address,
    addresses), the config, started_at, the live engine and trust monitor, statistics() as a
    nested dict, shutdown() (does not wait) and aclose() (waits)."""
    for name in ("host", "port", "address", "addresses", "config", "engine", "trust"):
        assert hasattr(server, name), name
    assert isinstance(server.started_at, float)
    assert (server.host, server.address) == ("127.0.0.1", f"127.0.0.1:{server.port}")
    assert server.addresses[0] == (server.host, server.port)
    assert isinstance(server.config, ServerConfig)
    assert isinstance(server.engine, engine.Engine)
    stats = server.statistics()
    assert isinstance(stats, dict) and {"server", "engine", "waiting", "trust"} <= set(stats)
    for name, is_async in [("statistics", False), ("shutdown", False), ("aclose", True)]:
        method = inspect.getattr_static(RunningServer, name)
        assert plain_signature(method) == "(self)", name
        assert inspect.iscoroutinefunction(method) is is_async, name


# --- lockserver.engine ---------------------------------------------------------------------------

#: The engine package's names the shell builds on, and what each is.
ENGINE = {
    "LockCore": CLASS,
    "Door": CLASS,
    "CoreStatistics": CLASS,
    "Output": TYPE_ALIAS,
    "Listed": TYPE_ALIAS,
    "Engine": CLASS,
    "EngineError": CLASS,
    "EngineLimits": CLASS,
    "EngineStatistics": CLASS,
    "ShardedDict": CLASS,
    "WaitLimits": CLASS,
    "WaitQueue": CLASS,
    "WaitStatistics": CLASS,
    "dependencies": FUNCTION,
    "same_value": FUNCTION,
}


def test_engine_all_is_the_whole_public_surface() -> None:
    """lockserver.engine.__all__ names each of these with its kind, once; it is the package's
    whole public surface (star-import included); every exported class and function is
    defined in one of the engine's private modules."""
    assert len(engine.__all__) == len(set(engine.__all__))
    assert {n: kind_of(getattr(engine, n)) for n in ENGINE} == ENGINE
    assert set(ENGINE) <= set(engine.__all__)
    assert public_attributes(engine) == set(engine.__all__)
    namespace: dict[str, object] = {}
    exec("from lockserver.engine import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(engine.__all__)
    for name in engine.__all__:
        obj = getattr(engine, name)
        if isinstance(obj, type | types.FunctionType):
            assert obj.__module__.startswith("lockserver.engine._"), name
    assert issubclass(engine.EngineError, Exception)


#: The calls the shell makes through the door (LockCore), those the door makes on the engine
#: and the wait queue, and Engine.execute / drain_lost (the wait queue's and the client
#: tests' fake server's way in).
ENGINE_CALLS = {
    "LockCore": (
        "(*, started_at, host='', fence_epoch=0, limits=None, wait_limits=None, "
        "authenticated=False, max_subscriptions=DEFAULT_MAX_SUBSCRIPTIONS, "
        "max_subscriptions_per_principal=DEFAULT_MAX_SUBSCRIPTIONS_PER_PRINCIPAL)"
    ),
    "LockCore.execute": (
        "(self, owner, request_id, session, tx, wait, now, trust, principal, site=None)"
    ),
    "LockCore.end_session": (
        "(self, owner, request_id, session_id, *, now, trust, principal, admin=False)"
    ),
    "LockCore.release": (
        "(self, owner, request_id, namespace, table, var, session_id, *, now, trust)"
    ),
    "LockCore.listing": "(self, owner, request_id, kind, query, *, now, trust, visible=None)",
    "LockCore.subscribe": "(self, owner, request_id, namespace, table, principal='')",
    "LockCore.visible_counts": "(self, visible)",
    "LockCore.unsubscribe": "(self, owner, request_id, target)",
    "LockCore.cancel": "(self, owner, request_id, target, *, now, trust)",
    "LockCore.owner_gone": "(self, owner, *, now, trust)",
    "LockCore.advance": "(self, now, *, trust, fence_floor=0)",
    "LockCore.page_at": "(self, kind, query, *, now, trust, visible=None)",
    "LockCore.read_listing": "(self, kind, query, *, visible=None)",
    "LockCore.peek_statistics": "(self, now)",
    "LockCore.session_principal": "(self, session_id)",
    "LockCore.next_deadline": "(self)",
    "LockCore.uptime": "(self, now)",
    "LockCore.statistics": "(self, now, *, trust)",
    "Engine": "(*, started_at, host='', fence_epoch=0, limits=None, track_changes=False)",
    "Engine.execute": "(self, session, tx, *, now, trust=1.0)",
    "Engine.end_session": "(self, session_id, *, now, notify=False)",
    "Engine.force_release": "(self, ns, table, var, session_id, *, now)",
    "Engine.sweep": "(self, now)",
    "Engine.next_deadline": "(self)",
    "Engine.statistics": "(self, now, expire=True)",
    "Engine.uptime": "(self, now)",
    "Engine.tag_session": "(self, session_id, tag)",
    "Engine.session_tag": "(self, session_id, now=None)",
    "Engine.drain_lost": "(self)",
    "Engine.drain_lost_tagged": "(self)",
    "WaitQueue": "(engine, limits=None)",
    "WaitQueue.submit": ("(self, owner, token, session, tx, *, now, trust, wait, principal='')"),
    "WaitQueue.process": "(self, *, now, trust)",
    "WaitQueue.cancel": "(self, token)",
    "WaitQueue.next_deadline": "(self)",
    "WaitQueue.statistics": "(self)",
    "dependencies": "(tx)",
    "same_value": "(a, b)",
}


@pytest.mark.parametrize(("path", "expected"), list(ENGINE_CALLS.items()), ids=list(ENGINE_CALLS))
def test_engine_call_signatures(path: str, expected: str) -> None:
    """The door's and the engine's calls take ``now`` (time is data) and are plain
    synchronous functions: none is a coroutine."""
    owner, _, member = path.partition(".")
    obj = getattr(engine, owner)
    if member:
        obj = inspect.getattr_static(obj, member)
    assert not inspect.iscoroutinefunction(obj)
    assert source_signature(obj) == expected


@pytest.mark.parametrize(
    "cls",
    [
        engine.CoreStatistics,
        engine.EngineLimits,
        engine.EngineStatistics,
        engine.WaitLimits,
        engine.WaitStatistics,
    ],
    ids=lambda c: c.__name__,
)
def test_engine_records_are_frozen(cls: type) -> None:
    """Limits and statistics are frozen attrs records (statistics() returns a snapshot)."""
    assert attrs.has(cls)
    record = object.__new__(cls)  # no values needed: a frozen record refuses any assignment
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        setattr(record, attrs.fields(cls)[0].name, 0)
