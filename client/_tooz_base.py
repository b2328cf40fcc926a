"""The tooz driver's parts below the driver class (client/tooz_driver.py is the driver):
the URL's options, the translation of our errors into tooz's, and a tooz lock over our
readers-writer lock recipe. Imported only by the driver, so tooz stays optional."""

from __future__ import annotations

import hashlib
import os
import ssl
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from typing import Any, NoReturn, Protocol, TypeVar
from urllib.parse import SplitResult

import tooz
from tooz import coordination, locking, utils

from protocol import check_value

from ._errors import (
    ClientTimeout,
    ConnectionLost,
    LockClientError,
    ServerUnavailable,
    TransportError,
)
from ._sync import LockClient
from ._sync_session import Session
from .recipes import (
    READ_TABLE,
    WRITE_TABLE,
    LockLostError,
    ReadLock,
    WriteLock,
)

T = TypeVar("T")

#: The namespace of a coordinator's tables unless the URL's ``namespace`` option says.
DEFAULT_NAMESPACE = "tooz"
#: A coordinator's session max age (seconds) unless ``session_max_age`` (or tooz's
#: ``timeout``) says: tooz's etcd3gw and Redis drivers default to 30 s too.
DEFAULT_SESSION_MAX_AGE = 30.0
#: The table of the groups' existence entries (variable ``groups``, value = a group's name).
GROUPS_TABLE = "tooz.groups"
_GROUPS_VAR = "groups"
#: A group's own session's max age when the server's Welcome does not say its largest.
_DEFAULT_GROUP_AGE = 3600.0

#: Query options of the URL, and what each is.
_OPTIONS = {
    "namespace": "the namespace of the coordinator's tables (or the URL's path; default 'tooz')",
    "session_max_age": "seconds the session lives after its last call (default 30)",
    "timeout": "tooz's name for session_max_age (as in its etcd3gw, Redis, ZooKeeper drivers)",
    "token_file": "a file holding the server's token (its first line)",
    "token_env": "an environment variable holding the server's token",
    "tls": "1 to speak TLS, verifying the server with the system's CAs",
    "ca_file": "speak TLS, verifying the server with this CA bundle (PEM)",
    "call_timeout": "seconds a call may take (default 10)",
    "connect_timeout": "seconds connecting may take (default 5)",
}


def group_session_id(namespace: str, group: str) -> str:
    """The id of the session that holds a group's existence entry (the same for everyone)."""
    digest = hashlib.sha256(f"{namespace}\0{group}".encode()).hexdigest()[:32]
    return f"tooz.group:{digest}"


def _text(what: str, value: bytes | str) -> str:
    """A tooz id (bytes, or str at run time) as our names are: text. ValueError otherwise."""
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{what} must be UTF-8 text, got {value!r}") from None
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{what} must be a non-blank str or bytes, got {value!r}")
    return value


def _seconds(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(
            f"lockserver URL: {name} must be a number of seconds, got {text!r}"
        ) from None
    if not value > 0 or value == float("inf"):
        raise ValueError(f"lockserver URL: {name} must be a finite number > 0, got {text!r}")
    return value


def parse_options(parsed_url: SplitResult, options: dict[str, Any]) -> dict[str, Any]:
    """The client's arguments from a ``lockserver://`` URL and its options (tooz passes the
    query as ``{name: [values]}``, keyword options first): ``servers``, ``namespace``,
    ``max_age``, ``token``, ``ssl_context``, ``timeout``, ``connect_timeout``. ValueError
    naming what is wrong: a missing or bad address, a token in the URL, an unknown or
    repeated option, a bad value."""
    if parsed_url.scheme != "lockserver":
        raise ValueError(f"not a lockserver URL: {parsed_url.geturl()!r}")
    netloc = parsed_url.netloc
    if "@" in netloc:
        raise ValueError(
            "lockserver URL: no credentials in the URL (it ends up in logs and process "
            "lists): give the token with token_file= or token_env="
        )
    path = parsed_url.path.strip("/")
    if "/" in path:
        raise ValueError(f"lockserver URL: the path is the namespace, one name: {path!r}")
    hosts = [h.strip() for h in netloc.split(",")]
    if not netloc or any(not h for h in hosts):
        raise ValueError(
            f"lockserver URL: expected lockserver://host:port[,host:port...], got "
            f"{parsed_url.geturl()!r}"
        )
    for host in hosts:
        _, sep, port = host.rpartition(":")
        if not sep or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"lockserver URL: {host!r} is not host:port (a port 1..65535)")
    values: dict[str, str] = {}
    for name, given in options.items():
        if name == "token":
            raise ValueError(
                "lockserver URL: never put the token in the URL: use token_file= (a file) or "
                "token_env= (an environment variable)"
            )
        if name not in _OPTIONS:
            known = ", ".join(sorted(_OPTIONS))
            raise ValueError(f"lockserver URL: unknown option {name!r} (known: {known})")
        items = given if isinstance(given, list | tuple) else [given]
        if len(items) != 1:
            raise ValueError(f"lockserver URL: option {name!r} given {len(items)} times")
        values[name] = str(items[0])
    if path and values.get("namespace", path) != path:
        raise ValueError("lockserver URL: the path and the namespace option disagree")
    out: dict[str, Any] = {
        "servers": hosts[0] if len(hosts) == 1 else [hosts],
        "namespace": values.get("namespace", path or DEFAULT_NAMESPACE),
        "max_age": DEFAULT_SESSION_MAX_AGE,
        "token": None,
        "ssl_context": None,
    }
    if not out["namespace"].strip():
        raise ValueError("lockserver URL: namespace must not be blank")
    ages = {values[n] for n in ("session_max_age", "timeout") if n in values}
    if len(ages) > 1:
        raise ValueError("lockserver URL: session_max_age and timeout (its alias) disagree")
    if ages:
        out["max_age"] = _seconds("session_max_age", ages.pop())
    for name, arg in (("call_timeout", "timeout"), ("connect_timeout", "connect_timeout")):
        if name in values:
            out[arg] = _seconds(name, values[name])
    if "token_file" in values and "token_env" in values:
        raise ValueError("lockserver URL: give token_file or token_env, not both")
    if "token_file" in values:
        path = values["token_file"]
        try:
            with open(path, encoding="utf-8") as f:
                token = f.readline().strip()
        except OSError as exc:
            raise ValueError(f"lockserver URL: token_file {path!r}: {exc.strerror}") from None
        if not token:
            raise ValueError(f"lockserver URL: token_file {path!r} is empty")
        out["token"] = token
    if "token_env" in values:
        variable = values["token_env"]
        token = os.environ.get(variable, "").strip()
        if not token:
            raise ValueError(f"lockserver URL: token_env {variable!r} is not set (or empty)")
        out["token"] = token
    tls = values.get("tls", "0")
    if tls not in ("0", "1", "true", "false"):
        raise ValueError(f"lockserver URL: tls must be 1 or 0, got {tls!r}")
    if "ca_file" in values:
        try:
            out["ssl_context"] = ssl.create_default_context(cafile=values["ca_file"])
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"lockserver URL: ca_file {values['ca_file']!r}: {exc}") from None
    elif tls in ("1", "true"):
        out["ssl_context"] = ssl.create_default_context()
    return out


@contextmanager
def _translated() -> Iterator[None]:
    """The client's errors as tooz's (the client's as the cause)."""
    try:
        yield
    except (ServerUnavailable, TransportError) as exc:
        _raise(coordination.ToozConnectionError, str(exc), exc)
    except ClientTimeout as exc:
        _raise(coordination.OperationTimedOut, str(exc), exc)
    except LockClientError as exc:
        _raise(tooz.ToozError, str(exc), exc)


def _raise(kind: type[tooz.ToozError], message: str, cause: BaseException) -> NoReturn:
    """Raise tooz's ``kind`` with ``cause`` chained (and as its ``cause``, tooz's habit)."""
    raise kind(message, cause=cause) from cause


def _result(call: Callable[[], T]) -> coordination.CoordinatorResult[T]:
    """Run ``call`` now; a finished result whose ``get()`` returns its value or raises its
    error (translated to tooz's)."""
    future: futures.Future[T] = futures.Future()
    try:
        with _translated():
            value = call()
    except Exception as exc:
        future.set_exception(exc)
    else:
        future.set_result(value)
    return coordination.CoordinatorResult(future)


class LockOwner(Protocol):
    """What a lock needs of its coordinator (``tooz_driver.LockServerDriver``)."""

    description: str

    def _session_and_namespace(self) -> tuple[Session, str]: ...

    def _client_and_namespace(self) -> tuple[LockClient, str]: ...


class LockServerLock(locking.Lock):
    """A tooz lock: one read/write lock of the server (``recipes.rw.*`` tables, variable =
    the lock's name), exclusive by default, shared with ``acquire(shared=True)``.

    One object is one holder: a second acquire while it holds the lock waits (or returns
    False), whichever thread makes it, except that a shared holder may acquire shared again
    (counted: as many releases). Two objects of one coordinator are one session: a second
    exclusive or shared holder in the same session waits for the first (SEMANTICS: one entry
    per session and variable). Waiting happens on the server, first come first served
    (writers before new readers)."""

    def __init__(self, driver: LockOwner, name: bytes) -> None:
        super().__init__(name)
        self._driver = driver
        self._var = _text("lock name", name)
        self._mu = threading.Lock()
        self._grant: ReadLock | WriteLock | None = None
        self._shared_extra = 0  # shared re-acquires on top of the grant (no call each)

    def acquire(
        self,
        blocking: bool | float = True,
        shared: bool = False,
        timeout: float | None = None,
    ) -> bool:
        """Acquire; True when granted. ``blocking`` False: try once; True: wait (at most
        ``timeout`` seconds when given); a number: wait at most that long."""
        wait, limit = utils.convert_blocking(blocking, timeout)
        if limit is not None and limit < 0:
            limit = None
        with self._mu:
            grant = self._grant
            if shared and isinstance(grant, ReadLock):
                self._shared_extra += 1
                return True
        session, namespace = self._driver._session_and_namespace()
        kind = ReadLock if shared else WriteLock
        lock = kind(session, namespace, self._var, description=self._driver.description)
        with _translated():
            granted = lock.acquire(wait, limit if wait else None)
        if granted:
            with self._mu:
                # The server let this grant in, so any earlier grant of this object (same
                # session, same variable) is gone: this one is now the object's.
                self._grant = lock
                self._shared_extra = 0
        return granted

    def release(self) -> bool:
        """Release once; True when a grant of this object was released, False when it held
        none or its grant had been lost (broken, its session ended or expired)."""
        with self._mu:
            grant = self._grant
            if grant is None:
                return False
            if self._shared_extra:
                self._shared_extra -= 1
                return True
            self._grant = None
        with _translated():
            try:
                return grant.release()
            except LockLostError:
                return False

    def is_still_owner(self) -> bool:
        """True when this object holds a grant the server still has (one read)."""
        with self._mu:
            grant = self._grant
        if grant is None:
            return False
        with _translated():
            try:
                grant.refresh()
            except LockLostError:
                return False
        return True

    def break_(self) -> bool:
        """Force-release the lock, whoever holds it (an operator's call: with tokens it
        needs an admin token); True when something was held. The holders hear it (their
        release returns False, ``is_still_owner`` too) and the waiters move up."""
        client, namespace = self._driver._client_and_namespace()
        with _translated():
            went = 0
            for table in (WRITE_TABLE, READ_TABLE):
                went += client.release(namespace, table, self._var).entries
        return went > 0


def _touch(session: Session, namespace: str) -> None:
    """Touch ``session`` (an empty transaction). Sent once more when the connection was lost
    with it in flight: it changes nothing, so a repeat is harmless, and the repeat goes
    through the next connection (a replicated group's next replica)."""
    try:
        session.execute(namespace, [])
    except ConnectionLost:
        session.execute(namespace, [])


def _checked_capabilities(capabilities: Any) -> None:
    """Capabilities travel as our values do (msgpack: None, bool, int, float, str, bytes,
    lists and maps of them); SerializationError otherwise."""
    try:
        check_value(capabilities, "capabilities")
    except (TypeError, ValueError) as exc:
        _raise(coordination.SerializationError, str(exc), exc)
