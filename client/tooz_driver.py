"""The tooz driver: ``tooz.coordination.get_coordinator("lockserver://host:port", member_id)``.

Why: OpenStack services (and others) coordinate through tooz; this backend gives them our
locks, groups, membership watches and leader election, so a service moves by changing its
URL. It is an application of the public sync client and the recipes, nothing more: a
coordinator is one :class:`~client.LockClient` and one :class:`~client.Session`; a tooz lock
is a :class:`~client.recipes.WriteLock` (exclusive) or :class:`~client.recipes.ReadLock`
(``shared=True``) of one read/write lock; a membership is a :class:`~client.Group` member; a
group's leader is the leader of the :class:`~client.Election` of the same name. Installed
by the ``tooz`` extra (``pip install 'skylock[tooz]'``), registered under tooz's
``tooz.backends`` entry point as ``lockserver``. docs/tooz.md is the user's guide.

Rules kept:
- **One session per coordinator**: everything it holds (locks, memberships, leadership)
  goes at once when it stops, its process dies or stops beating (the session expires
  ``session_max_age`` after its last call) or an operator ends it (``lockctl kill``). The
  session has no keepalive thread of its own: :meth:`heartbeat` (tooz's heart,
  ``start(start_heart=True)``, or the application's own calls) keeps it alive, as tooz's
  contract for drivers whose members time out asks (its conformance test ``test_timeout``).
- **Groups outlive their creator** as tooz requires, though every entry of the server belongs
  to a session: a group's existence is an entry (table ``tooz.groups``, variable
  ``groups``, value = the group's name) held by a session of **the group itself**, whose id
  derives from the namespace and the name (the countdown latch's device). Every call on the
  group, and every heartbeat of a member, touches it; a group nobody touches for the
  server's largest session max age (1 h by default) is forgotten, as in-memory state is
  across a restart of a standalone server.
- **Calls run when they are made** (one or two round trips, each bounded by the client's
  ``timeout`` option) and return a finished :class:`tooz.coordination.CoordAsyncResult`:
  ``get()`` returns the value or raises the tooz error. Nothing runs in the background
  but the session's keepalive.
- Errors are tooz's: a server that cannot be reached is ``ToozConnectionError``, a call
  that timed out ``OperationTimedOut``, anything else the client raises ``ToozError`` (with
  the client's error as its cause); a bad URL or option is ``ValueError`` naming it.
- Watchers are tooz's own cached ``run_watchers`` (each run reads the members of every
  watched group, one transaction each, and calls the hooks for the difference); the
  election runs in ``run_watchers`` too (a campaign that does not wait), as tooz's
  ZooKeeper and Redis drivers do it.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

import tooz
from tooz import coordination

from protocol import Assert, DeleteVar, Exists, Not, SelectVarValue, SetVar

from ._errors import (
    LockClientError,
    ServerUnavailable,
    TransportError,
)
from ._sync import LockClient
from ._sync_session import Session
from ._tooz_base import (
    _DEFAULT_GROUP_AGE,
    _GROUPS_VAR,
    DEFAULT_NAMESPACE,
    DEFAULT_SESSION_MAX_AGE,
    GROUPS_TABLE,
    LockServerLock,
    _checked_capabilities,
    _raise,
    _result,
    _text,
    _touch,
    _translated,
    group_session_id,
    parse_options,
)
from .recipes import (
    GROUP_META_TABLE,
    GROUP_TABLE,
    Election,
    Group,
    LockLostError,
    Member,
)

__all__ = [
    "DEFAULT_NAMESPACE",
    "DEFAULT_SESSION_MAX_AGE",
    "GROUPS_TABLE",
    "LockServerDriver",
    "LockServerLock",
    "group_session_id",
    "parse_options",
]


class LockServerDriver(coordination.CoordinationDriverCachedRunWatchers):
    """A tooz coordinator over the lock server: ``lockserver://host:port[,host:port...]``
    (several hosts: the replicas of one replicated group, tried in turn) with the query
    options of docs/tooz.md. See the module docstring for what it keeps."""

    CHARACTERISTICS = (
        # A client per process, over TCP; the client is thread-safe.
        coordination.Characteristics.DISTRIBUTED_ACROSS_THREADS,
        coordination.Characteristics.DISTRIBUTED_ACROSS_PROCESSES,
        coordination.Characteristics.DISTRIBUTED_ACROSS_HOSTS,
        # Every transaction, reads included, is applied in one synchronous step in one total
        # order (a standalone server's event loop; a replicated group's log, each answer
        # given only once its entry is applied): linearizable, hence serializable,
        # sequential and causal.
        coordination.Characteristics.LINEARIZABLE,
        coordination.Characteristics.SERIALIZABLE,
        coordination.Characteristics.SEQUENTIAL,
        coordination.Characteristics.CAUSAL,
        # A replica cut off from the group's log can neither commit nor answer; reads go
        # through the log: no client sees another view.
        coordination.Characteristics.SAME_VIEW_UNDER_PARTITIONS,
        coordination.Characteristics.SAME_VIEW_ACROSS_CLIENTS,
        # Not NON_TIMEOUT_BASED: a dead holder's locks go when its session's max age has
        # passed without a call, a timeout.
    )

    def __init__(self, member_id: bytes, parsed_url: Any, options: dict[str, Any]) -> None:
        super().__init__(member_id, parsed_url, options)
        self._member = _text("member_id", member_id)
        self._settings = parse_options(parsed_url, options)
        self.namespace: str = self._settings["namespace"]
        self.session_max_age: float = self._settings["max_age"]
        self.description = f"tooz member {self._member}"
        self._client: LockClient | None = None
        self._session: Session | None = None
        self._state = threading.Lock()  # the maps below (tooz calls may come from threads)
        self._memberships: dict[str, Group] = {}
        self._elections: dict[str, Election] = {}
        self._group_sessions: dict[str, Session] = {}

    # --- lifecycle ------------------------------------------------------------------------

    def _start(self) -> None:
        s = self._settings
        kwargs = {k: s[k] for k in ("timeout", "connect_timeout") if k in s}
        try:
            client = LockClient(
                servers=s["servers"],
                token=s["token"],
                ssl_context=s["ssl_context"],
                client_name="tooz",
                **kwargs,
            )
        except (ServerUnavailable, TransportError) as exc:
            where = ",".join(self._hosts())
            _raise(coordination.ToozConnectionError, f"cannot reach {where}: {exc}", exc)
        except LockClientError as exc:
            _raise(tooz.ToozError, str(exc), exc)
        self._client = client
        # No keepalive thread: tooz's contract for a driver whose members time out is that
        # liveness comes from heartbeat() (tooz's own conformance test ``test_timeout``: a
        # member that stops beating leaves its groups).
        self._session = client.session(
            max_age=self.session_max_age, description=self.description, keepalive=False
        )
        with self._state:
            self._memberships.clear()
            self._elections.clear()
            self._group_sessions.clear()

    def _stop(self) -> None:
        client, session = self._client, self._session
        self._client = self._session = None
        if client is None or session is None:
            return
        try:
            session.end()  # every lock, membership and leadership goes at once
        except LockClientError:
            pass  # the server expires it after its max age
        finally:
            client.close()

    @property
    def session_id(self) -> str | None:
        """The id of this coordinator's session while it is started (what ``lockctl
        sessions --match 'tooz member'`` lists and ``lockctl kill`` ends), else None."""
        session = self._session
        return None if session is None else session.id

    def _hosts(self) -> list[str]:
        servers = self._settings["servers"]
        return [servers] if isinstance(servers, str) else list(servers[0])

    def _started_client(self) -> tuple[LockClient, Session]:
        client, session = self._client, self._session
        if client is None or session is None:
            raise tooz.ToozError("the lockserver coordinator has not been started")
        return client, session

    def _session_and_namespace(self) -> tuple[Session, str]:
        return self._started_client()[1], self.namespace

    def _client_and_namespace(self) -> tuple[LockClient, str]:
        return self._started_client()[0], self.namespace

    def heartbeat(self) -> float:
        """Touch the session (and the groups this member is in); the seconds until the next
        heartbeat is due (a third of the session's max age)."""
        _, session = self._started_client()
        with self._state:
            joined = list(self._memberships)
        with _translated():
            _touch(session, self.namespace)
            for group in joined:
                _touch(self._group_session(group), self.namespace)
        return self.session_max_age / 3

    # --- locks ----------------------------------------------------------------------------

    def get_lock(self, name: bytes) -> LockServerLock:
        """A lock named ``name`` (bytes or text, UTF-8)."""
        return LockServerLock(self, name)

    # --- groups -----------------------------------------------------------------------------

    def _group_session(self, group: str) -> Session:
        """The group's own session (its existence entry's holder), made at first use."""
        with self._state:
            own = self._group_sessions.get(group)
        if own is not None:
            return own
        client, _ = self._started_client()
        limits = client.welcome.limits
        age = limits.get("max_session_age") if hasattr(limits, "get") else None
        if not isinstance(age, int | float) or isinstance(age, bool) or age <= 0:
            age = _DEFAULT_GROUP_AGE
        own = client.session(
            max_age=float(age),
            description=f"tooz group {group}",
            session_id=group_session_id(self.namespace, group),
            keepalive=False,
        )
        with self._state:
            return self._group_sessions.setdefault(group, own)

    def _exists(self, group: str) -> bool:
        """Whether the group exists (one read in its own session, which touches it)."""
        result = self._group_session(group).execute(
            self.namespace,
            [Assert(Exists(GROUPS_TABLE, _GROUPS_VAR, group, ignore_this_session=False))],
        )
        return result.ok

    def _require(self, group: str, group_id: bytes) -> None:
        if not self._exists(group):
            raise coordination.GroupNotCreated(group_id)

    def _reader(self, group: str) -> Group:
        """A group object to read with: this member's when it joined, else a fresh one."""
        with self._state:
            member = self._memberships.get(group)
        if member is not None:
            return member
        _, session = self._started_client()
        return Group(session, self.namespace, group, member_id=self._member)

    def _members(self, group: str, group_id: bytes) -> tuple[Member, ...]:
        self._require(group, group_id)
        return self._reader(group).members()

    def create_group(self, group_id: bytes) -> coordination.CoordAsyncResult[None]:
        def create() -> None:
            group = _text("group_id", group_id)
            result = self._group_session(group).execute(
                self.namespace,
                [
                    Assert(
                        Not(Exists(GROUPS_TABLE, _GROUPS_VAR, group, ignore_this_session=False))
                    ),
                    Assert(SetVar(GROUPS_TABLE, _GROUPS_VAR, group, allow_duplicates=True)),
                ],
            )
            if not result.ok:
                raise coordination.GroupAlreadyExist(group_id)

        return _result(create)

    def get_groups(self) -> coordination.CoordAsyncResult[list[bytes]]:
        def groups() -> list[bytes]:
            _, session = self._started_client()
            result = session.execute(
                self.namespace,
                [
                    SelectVarValue(
                        "groups",
                        GROUPS_TABLE,
                        _GROUPS_VAR,
                        ignore_this_session=False,
                        select_many=True,
                    )
                ],
            )
            records = result.get("groups") or ()
            names = [r.get("value") for r in records if isinstance(r, dict)]
            return [n.encode("utf-8") for n in names if isinstance(n, str)]

        return _result(groups)

    def delete_group(self, group_id: bytes) -> coordination.CoordAsyncResult[None]:
        def delete() -> None:
            group = _text("group_id", group_id)
            result = self._group_session(group).execute(
                self.namespace,
                [
                    Assert(Exists(GROUPS_TABLE, _GROUPS_VAR, group, ignore_this_session=False)),
                    Assert(Not(Exists(GROUP_TABLE, group, ignore_this_session=False))),
                    Assert(DeleteVar(GROUPS_TABLE, _GROUPS_VAR)),
                ],
            )
            if result.ok:
                return
            if (result.failed_statement or "").startswith("0:"):
                raise coordination.GroupNotCreated(group_id)
            raise coordination.GroupNotEmpty(group_id)

        return _result(delete)

    def join_group(
        self, group_id: bytes, capabilities: coordination.Capabilities | None = None
    ) -> coordination.CoordAsyncResult[None]:
        def join() -> None:
            group = _text("group_id", group_id)
            _checked_capabilities(capabilities)
            with self._state:
                if group in self._memberships:
                    raise coordination.MemberAlreadyExist(group_id, self._member_id)
            self._require(group, group_id)
            _, session = self._started_client()
            member = Group(
                session,
                self.namespace,
                group,
                member_id=self._member,
                description=self.description,
            )
            if not member.join(capabilities):
                raise coordination.MemberAlreadyExist(group_id, self._member_id)
            with self._state:
                self._memberships[group] = member
            self._joined_groups.add(group_id)

        return _result(join)

    def leave_group(self, group_id: bytes) -> coordination.CoordAsyncResult[None]:
        def leave() -> None:
            group = _text("group_id", group_id)
            with self._state:
                member = self._memberships.pop(group, None)
            self._joined_groups.discard(group_id)
            if member is not None:
                try:
                    if member.leave():
                        return
                except LockLostError:
                    pass  # booted out meanwhile: fall through to what the server has
            members = self._members(group, group_id)
            theirs = [m for m in members if m.member_id == self._member]
            if not theirs:
                raise coordination.MemberNotJoined(group_id, self._member_id)
            # Another coordinator with this member id joined: tooz leaves by member id, so
            # its membership goes (an operator's call: with tokens it needs an admin token).
            client, _ = self._started_client()
            for m in theirs:
                for table in (GROUP_TABLE, GROUP_META_TABLE):
                    client.release(self.namespace, table, group, session=m.session)

        return _result(leave)

    def get_members(self, group_id: bytes) -> coordination.CoordAsyncResult[set[bytes]]:
        def members() -> set[bytes]:
            group = _text("group_id", group_id)
            return {m.member_id.encode("utf-8") for m in self._members(group, group_id)}

        return _result(members)

    def _member_of(self, group_id: bytes, member_id: bytes) -> Member:
        group = _text("group_id", group_id)
        wanted = _text("member_id", member_id)
        for m in self._members(group, group_id):
            if m.member_id == wanted:
                return m
        raise coordination.MemberNotJoined(group_id, member_id)

    def get_member_capabilities(
        self, group_id: bytes, member_id: bytes
    ) -> coordination.CoordAsyncResult[coordination.Capabilities | None]:
        def capabilities() -> coordination.Capabilities | None:
            metadata: coordination.Capabilities | None = self._member_of(
                group_id, member_id
            ).metadata
            return metadata

        return _result(capabilities)

    def get_members_with_capabilities(
        self, group_id: bytes
    ) -> coordination.CoordAsyncResult[dict[bytes, coordination.Capabilities | None]]:
        def members() -> dict[bytes, coordination.Capabilities | None]:
            group = _text("group_id", group_id)
            return {m.member_id.encode("utf-8"): m.metadata for m in self._members(group, group_id)}

        return _result(members)

    def get_member_info(
        self, group_id: bytes, member_id: bytes
    ) -> coordination.CoordAsyncResult[dict[str, Any]]:
        def info() -> dict[str, Any]:
            m = self._member_of(group_id, member_id)
            joined = None if m.since is None else datetime.fromtimestamp(m.since, UTC)
            return {
                "capabilities": m.metadata,
                "created_at": joined,
                "session": m.session,
                "fence": m.fence,
            }

        return _result(info)

    def update_capabilities(
        self, group_id: bytes, capabilities: coordination.Capabilities
    ) -> coordination.CoordAsyncResult[None]:
        def update() -> None:
            group = _text("group_id", group_id)
            _checked_capabilities(capabilities)
            with self._state:
                member = self._memberships.get(group)
            if member is None:
                self._require(group, group_id)
                raise coordination.MemberNotJoined(group_id, self._member_id)
            try:
                member.update(capabilities)
            except LockLostError:
                with self._state:
                    self._memberships.pop(group, None)
                self._joined_groups.discard(group_id)
                raise coordination.MemberNotJoined(group_id, self._member_id) from None

        return _result(update)

    # --- leader election --------------------------------------------------------------------

    def _election(self, group: str) -> Election:
        with self._state:
            election = self._elections.get(group)
            if election is None or (election.held and election.lost):
                _, session = self._started_client()
                election = Election(session, self.namespace, group, description=self.description)
                self._elections[group] = election
            return election

    def get_leader(self, group_id: bytes) -> coordination.CoordAsyncResult[bytes]:
        def leader() -> bytes:
            group = _text("group_id", group_id)
            info = self._election(group).leader()
            value = None if info is None else info.value
            # tooz's contract returns None when nobody leads (its type says bytes).
            return value.encode("utf-8") if isinstance(value, str) else None  # type: ignore[return-value]

        return _result(leader)

    def run_elect_coordinator(self) -> None:
        """Campaign (without waiting) in the election of every group with an
        elected-as-leader hook that this member does not lead; run the hooks where it won."""
        for group_id, hooks in list(self._hooks_elected_leader.items()):
            group = _text("group_id", group_id)
            election = self._election(group)
            if election.leading:
                continue
            with _translated():
                term = election.campaign(self._member, timeout=0)
            if term is not None:
                hooks.run(coordination.LeaderElected(group_id, self._member_id))

    def run_watchers(self, timeout: float | None = None) -> list[Any]:
        """The join and leave hooks of the watched groups (tooz's cached watchers), then the
        election of the groups with an elected-as-leader hook."""
        result = super().run_watchers(timeout)
        self.run_elect_coordinator()
        return result

    def stand_down_group_leader(self, group_id: bytes) -> bool:
        """Resign the group's leadership; True when this member led until now."""
        group = _text("group_id", group_id)
        with self._state:
            election = self._elections.get(group)
        if election is None or not election.leading:
            return False
        with _translated():
            try:
                return election.resign()
            except LockLostError:
                return False
