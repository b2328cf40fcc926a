"""The group secret: which keys a replica holds, and the authenticator on everything a replica
of a group reads from etcd and acts on (log entries, registrations, the genesis, snapshots).

Why (issue 29, docs/security.md "Replication"): a replicated group's state is whatever its log
in etcd says, and anyone who can write to etcd can write to the log. With a group secret,
every record a replica writes is sealed with an authenticator (HMAC-SHA256) keyed by it, and
every record a replica reads is checked *before* anything in it is decoded: a record sealed
by anyone else is rejected whole.

Rules kept:

- **The secret comes from a file** (``group_secret_file``), never from the command line: the
  file must be a regular file owned by this user (or root) that nobody else may read or write
  (mode ``0600``, as ssh asks of a private key), else the replica refuses to start. It holds
  one secret per line (blank lines and ``#`` comments aside), each at least
  :data:`MIN_SECRET` characters: the **first signs, every one verifies** -- the rotation
  procedure in docs/replication.md rests on that.
- **A key is named by its id**, the first 8 bytes of a SHA-256 of the secret under a label of
  its own: the id says which key sealed a record (and is safe to log and show), never
  anything of the secret.
- **Domain separation**: the authenticated bytes are a purpose label (an entry, a
  registration, the genesis, a snapshot), the context (the group's name and instance), then
  the record, so a record sealed for one purpose or one group is no record of another.
- **Bounded work**: opening a record computes at most one HMAC per key this replica holds,
  whatever the record claims (a forged record cannot make a replica spend more).
- Secrets never reach a repr, a log line or an error message.

The sealed form: ``0xc1 | n | n x (key id (8) | tag (32)) | body``. ``0xc1`` is the one byte
msgpack never uses, so a sealed record is never mistaken for a plain (unsealed) one, which
always starts with a msgpack value. An entry is sealed with the signing key alone (``n`` = 1);
a registration, the genesis and a snapshot's description with every key the replica holds,
so a replica that holds only some of them can still read them during a rotation.

Prior art: the HMAC-signed envelopes of Kafka's delegation tokens and of etcd's own
auth-token JWTs; ssh's refusal of a private key file others can read.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
from collections.abc import Sequence
from typing import Final

from lockserver._auth import SecurityConfigError

__all__ = [
    "KEY_ID_SIZE",
    "MAX_SECRETS",
    "MIN_SECRET",
    "PURPOSES",
    "SEALED",
    "TAG_SIZE",
    "GroupKeys",
    "Sealer",
    "is_sealed",
    "key_id",
    "read_group_secret",
]

#: The first byte of a sealed record (msgpack's one unused byte).
SEALED: Final = 0xC1
KEY_ID_SIZE: Final = 8
TAG_SIZE: Final = 32
#: Fewest characters of one secret (``openssl rand -hex 32`` gives 64).
MIN_SECRET: Final = 32
#: Most secrets one file may hold (a rotation needs two).
MAX_SECRETS: Final = 8
#: The purposes a record is sealed for: the label heads the authenticated bytes.
PURPOSES: Final = frozenset({b"entry", b"replica", b"genesis", b"snapshot"})
_KEY_ID_LABEL: Final = b"lockserver group key id\0"


def key_id(secret: bytes) -> bytes:
    """The id of the key ``secret``: safe to log, says nothing of the secret."""
    return hashlib.sha256(_KEY_ID_LABEL + secret).digest()[:KEY_ID_SIZE]


def is_sealed(data: bytes) -> bool:
    """Whether ``data`` is in the sealed form (it may still fail to open)."""
    return len(data) > 0 and data[0] == SEALED


class GroupKeys:
    """The secrets of one replica, in the file's order: the first signs, every one verifies.
    Its repr names the key ids only."""

    __slots__ = ("_secrets", "ids")

    def __init__(self, secrets: Sequence[bytes]) -> None:
        if not secrets:
            raise ValueError("a group secret needs at least one key")
        ids = tuple(key_id(s) for s in secrets)
        if len(set(ids)) != len(ids):
            raise ValueError("the group secrets hold the same key twice")
        self._secrets: dict[bytes, bytes] = dict(zip(ids, secrets, strict=True))
        #: The key ids, the signing key's first.
        self.ids = ids

    def __repr__(self) -> str:
        return f"GroupKeys({', '.join(i.hex() for i in self.ids)})"

    @property
    def signing_id(self) -> bytes:
        return self.ids[0]

    def sealer(self, purpose: bytes, context: bytes) -> Sealer:
        """Seals and opens records of ``purpose`` in ``context`` (the group's name and
        instance, say) with these keys."""
        return Sealer(self, purpose, context)

    def _secret(self, kid: bytes) -> bytes | None:
        return self._secrets.get(kid)


class Sealer:
    """Seal and open records of one purpose in one context. ``seal`` signs with the signing
    key alone, ``seal_all`` with every key; ``open`` returns the body, or None when no tag of
    a key this replica holds authenticates it (or it is not in the sealed form)."""

    __slots__ = ("_head", "_keys", "_one")

    def __init__(self, keys: GroupKeys, purpose: bytes, context: bytes) -> None:
        if purpose not in PURPOSES:
            raise ValueError(f"unknown purpose {purpose!r}")
        if len(context) > 0xFFFF:
            raise ValueError("a context is at most 65,535 bytes")
        self._keys = keys
        # The authenticated bytes are head + body: the purpose (padded: fixed length) and the
        # context (length-prefixed), so no two (purpose, context, body) share their bytes.
        self._head = purpose.ljust(16, b"\0") + len(context).to_bytes(2, "big") + context
        signing = keys.signing_id
        secret = keys._secret(signing)
        assert secret is not None
        self._one = (signing, secret)

    @property
    def signing_id(self) -> bytes:
        """The id of the key :meth:`seal` signs with."""
        return self._one[0]

    def holds(self, kid: bytes) -> bool:
        """Whether this replica holds the key ``kid``."""
        return self._keys._secret(kid) is not None

    def _tag(self, secret: bytes, body: bytes) -> bytes:
        return hmac.digest(secret, self._head + body, "sha256")

    def seal(self, body: bytes) -> bytes:
        """``body`` sealed with the signing key."""
        kid, secret = self._one
        return bytes((SEALED, 1)) + kid + self._tag(secret, body) + body

    def seal_all(self, body: bytes) -> bytes:
        """``body`` sealed with every key (a replica holding any one of them opens it)."""
        keys = self._keys
        parts = [bytes((SEALED, len(keys.ids)))]
        for kid in keys.ids:
            secret = keys._secret(kid)
            assert secret is not None
            parts += (kid, self._tag(secret, body))
        return b"".join(parts) + body

    def open(self, data: bytes) -> bytes | None:
        """The body of ``data`` when a tag of a key this replica holds authenticates it;
        None otherwise (not sealed, truncated, no known key, a wrong tag). At most one HMAC
        per key held, whatever ``data`` claims."""
        if len(data) < 2 or data[0] != SEALED:
            return None
        n = data[1]
        start = 2 + n * (KEY_ID_SIZE + TAG_SIZE)
        if n == 0 or len(data) < start:
            return None
        body = data[start:]
        tried: set[bytes] = set()
        keys = self._keys
        for i in range(n):
            at = 2 + i * (KEY_ID_SIZE + TAG_SIZE)
            kid = data[at : at + KEY_ID_SIZE]
            secret = keys._secret(kid)
            if secret is None or kid in tried:
                continue
            tried.add(kid)
            tag = data[at + KEY_ID_SIZE : at + KEY_ID_SIZE + TAG_SIZE]
            if hmac.compare_digest(tag, self._tag(secret, body)):
                return body
        return None

    @staticmethod
    def key_ids(data: bytes) -> tuple[bytes, ...]:
        """The key ids a sealed record names (unauthenticated: for messages only)."""
        if len(data) < 2 or data[0] != SEALED:
            return ()
        n = data[1]
        ids = []
        for i in range(n):
            at = 2 + i * (KEY_ID_SIZE + TAG_SIZE)
            if len(data) < at + KEY_ID_SIZE + TAG_SIZE:
                break
            ids.append(data[at : at + KEY_ID_SIZE])
        return tuple(ids)


def read_group_secret(path: str) -> GroupKeys:
    """The keys in the file ``path`` (``group_secret_file``). SecurityConfigError, one line
    naming the file and never a secret, when it cannot be read, is not a regular file, is
    not owned by this user (or root), may be read or written by anyone else, or holds no
    secret, one shorter than :data:`MIN_SECRET` characters, one twice, or more than
    :data:`MAX_SECRETS`."""
    where = f"group_secret_file {path}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise SecurityConfigError(f"{where}: cannot open it: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SecurityConfigError(f"{where}: not a regular file")
        if info.st_uid not in (os.geteuid(), 0):
            raise SecurityConfigError(
                f"{where}: owned by uid {info.st_uid}, not by this user ({os.geteuid()}) or root"
            )
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o077:
            raise SecurityConfigError(
                f"{where}: others may read or write it (mode {mode:04o}); "
                f"make it private: chmod 600 {path}"
            )
        with os.fdopen(fd, "rb", closefd=False) as f:
            raw = f.read(64 * 1024 + 1)
    except OSError as exc:
        raise SecurityConfigError(f"{where}: cannot read it: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(raw) > 64 * 1024:
        raise SecurityConfigError(f"{where}: larger than 64 KiB: not a secret file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SecurityConfigError(f"{where}: not UTF-8 text") from None
    secrets: list[bytes] = []
    for number, line in enumerate(text.splitlines(), 1):
        secret = line.strip()
        if not secret or secret.startswith("#"):
            continue
        if len(secret) < MIN_SECRET:
            raise SecurityConfigError(
                f"{where}: the secret on line {number} has {len(secret)} characters, fewer "
                f"than {MIN_SECRET} (make one with: openssl rand -hex 32)"
            )
        secrets.append(secret.encode())
    if not secrets:
        raise SecurityConfigError(f"{where}: holds no secret (one per line)")
    if len(secrets) > MAX_SECRETS:
        raise SecurityConfigError(
            f"{where}: holds {len(secrets)} secrets, more than {MAX_SECRETS} (a rotation "
            "needs two: the new one and the old one)"
        )
    try:
        return GroupKeys(secrets)
    except ValueError as exc:
        raise SecurityConfigError(f"{where}: {exc}") from None
