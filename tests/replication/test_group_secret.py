"""The group secret (``lockserver.replication._groupauth``, issue 29): the secret file is refused
unless it is private, owned by this user and holds proper secrets (each message names the file and
the line, never a secret); a sealed record opens only with a key that sealed it, for the purpose
and in the context it was sealed for; any change of a sealed record's bytes is refused; a
forged record cannot make a replica compute more than one HMAC per key it holds."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lockserver._auth import SecurityConfigError
from lockserver.replication._groupauth import (
    KEY_ID_SIZE,
    MIN_SECRET,
    SEALED,
    TAG_SIZE,
    GroupKeys,
    Sealer,
    is_sealed,
    key_id,
    read_group_secret,
)

OLD = b"o" * 40
NEW = b"n" * 40
OTHER = b"x" * 40


def secret_file(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "group.secret"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_a_private_file_gives_its_keys_first_signing() -> None:
    """One secret per line, blank lines and comments aside: the first signs, every one
    verifies; the keys' repr names their ids only."""
    keys = GroupKeys([NEW, OLD])
    assert keys.ids == (key_id(NEW), key_id(OLD))
    assert keys.signing_id == key_id(NEW)
    assert len(keys.signing_id) == KEY_ID_SIZE
    assert "n" * 10 not in repr(keys) and key_id(NEW).hex() in repr(keys)


def test_read_group_secret_reads_one_secret_per_line(tmp_path: Path) -> None:
    """The file's secrets in order, comments and blank lines skipped, spaces stripped."""
    path = secret_file(tmp_path, f"# rotated 2025-01\n\n  {NEW.decode()}  \n{OLD.decode()}\n")
    assert read_group_secret(str(path)).ids == (key_id(NEW), key_id(OLD))


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o644, 0o622, 0o700 | 0o007])
def test_a_file_others_may_read_or_write_is_refused(tmp_path: Path, mode: int) -> None:
    """As ssh refuses a private key others can read: any group or other permission bit."""
    path = secret_file(tmp_path, NEW.decode(), mode)
    with pytest.raises(SecurityConfigError, match=r"others may read or write it .*chmod 600"):
        read_group_secret(str(path))


def test_a_file_of_another_owner_is_refused(tmp_path: Path) -> None:
    """Owned by neither this user nor root: refused (this test runs as root: any other uid)."""
    path = secret_file(tmp_path, NEW.decode())
    if os.geteuid() != 0:
        pytest.skip("needs root to give the file to another owner")
    os.chown(path, 12345, 12345)
    with pytest.raises(SecurityConfigError, match="owned by uid 12345"):
        read_group_secret(str(path))


def test_not_a_regular_file_or_a_symlink_is_refused(tmp_path: Path) -> None:
    """A directory, a symlink (never followed), a missing file: refused, naming the file."""
    target = secret_file(tmp_path, NEW.decode())
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(SecurityConfigError, match="cannot open it"):
        read_group_secret(str(link))
    with pytest.raises(SecurityConfigError, match="cannot open it"):
        read_group_secret(str(tmp_path / "missing"))
    folder = tmp_path / "dir"
    folder.mkdir(mode=0o700)
    with pytest.raises(SecurityConfigError, match="not a regular file"):
        read_group_secret(str(folder))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "holds no secret"),
        ("# only a comment\n\n", "holds no secret"),
        ("short-secret\n", f"line 1 has 12 characters, fewer than {MIN_SECRET}"),
        (f"{NEW.decode()}\n{'y' * 31}\n", "line 2 has 31 characters"),
        (f"{NEW.decode()}\n{NEW.decode()}\n", "the same key twice"),
        ("\n".join(chr(97 + i) * 40 for i in range(9)), "holds 9 secrets, more than 8"),
    ],
)
def test_bad_contents_are_refused_without_showing_a_secret(
    tmp_path: Path, text: str, message: str
) -> None:
    """Each refusal names the file and what is wrong, never a secret."""
    path = secret_file(tmp_path, text)
    with pytest.raises(SecurityConfigError, match=message) as info:
        read_group_secret(str(path))
    assert str(path) in str(info.value)
    for line in text.splitlines():
        if line and not line.startswith("#"):
            assert line not in str(info.value)


def test_binary_and_huge_files_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "bin"
    path.write_bytes(b"\xff\xfe" * 20)
    path.chmod(0o600)
    with pytest.raises(SecurityConfigError, match="not UTF-8"):
        read_group_secret(str(path))
    path.write_bytes(b"a" * (64 * 1024 + 10))
    with pytest.raises(SecurityConfigError, match="larger than 64 KiB"):
        read_group_secret(str(path))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


# --- sealing ----------------------------------------------------------------------------------


def test_sealed_records_open_only_for_their_key_purpose_and_context() -> None:
    """A record sealed with a key opens with that key (for the same purpose and context);
    with another key, purpose or context it does not."""
    keys = GroupKeys([NEW])
    sealed = keys.sealer(b"entry", b"g1").seal(b"body")
    assert is_sealed(sealed) and sealed[0] == SEALED
    assert keys.sealer(b"entry", b"g1").open(sealed) == b"body"
    assert GroupKeys([OTHER]).sealer(b"entry", b"g1").open(sealed) is None
    assert keys.sealer(b"replica", b"g1").open(sealed) is None
    assert keys.sealer(b"entry", b"g2").open(sealed) is None
    assert keys.sealer(b"entry", b"g1").open(b"body") is None  # not sealed at all
    with pytest.raises(ValueError, match="unknown purpose"):
        keys.sealer(b"other", b"g1")


def test_a_record_sealed_with_every_key_opens_with_any_one() -> None:
    """seal_all (registrations, the genesis, snapshots): a replica holding only the old key,
    or only the new, opens it (a rotation); seal signs with the first key only."""
    both = GroupKeys([NEW, OLD])
    everyone = both.sealer(b"genesis", b"g").seal_all(b"genesis body")
    assert Sealer.key_ids(everyone) == (key_id(NEW), key_id(OLD))
    for keys in (GroupKeys([OLD]), GroupKeys([NEW]), GroupKeys([OTHER, OLD])):
        assert keys.sealer(b"genesis", b"g").open(everyone) == b"genesis body"
    signed = both.sealer(b"entry", b"g").seal(b"e")
    assert Sealer.key_ids(signed) == (key_id(NEW),)
    assert GroupKeys([OLD]).sealer(b"entry", b"g").open(signed) is None
    assert GroupKeys([OLD, NEW]).sealer(b"entry", b"g").open(signed) == b"e"


@given(st.binary(min_size=0, max_size=300), st.data())
def test_any_change_of_a_sealed_record_is_refused(body: bytes, data: st.DataObject) -> None:
    """Flipping any bit of a sealed record never makes it open to another body, and flipping
    one in its body (or its header, or the one tag it has) refuses it; cutting or extending
    it refuses it. (A record sealed with two keys still opens by its intact tag when the
    other's bytes change: its body is as authenticated as before.)"""
    sealer = GroupKeys([NEW, OLD]).sealer(b"entry", b"ctx")
    sealed = data.draw(st.sampled_from([sealer.seal(body), sealer.seal_all(body)]))
    assert sealer.open(sealed) == body
    at = data.draw(st.integers(0, len(sealed) - 1))
    bit = data.draw(st.integers(0, 7))
    flipped = bytearray(sealed)
    flipped[at] ^= 1 << bit
    opened = sealer.open(bytes(flipped))
    assert opened is None or opened == body
    tags = sealed[1]
    if at < 2 or at >= 2 + tags * (KEY_ID_SIZE + TAG_SIZE) or tags == 1:
        assert opened is None
    assert sealer.open(sealed[: data.draw(st.integers(0, len(sealed) - 1))]) is None
    assert sealer.open(sealed + b"x") is None


def test_a_forged_record_costs_one_hmac_per_key_held(monkeypatch: pytest.MonkeyPatch) -> None:
    """255 tags all naming a key this replica holds: one HMAC is computed, not 255; tags of
    keys it does not hold cost none."""
    keys = GroupKeys([NEW])
    sealer = keys.sealer(b"entry", b"ctx")
    calls = 0
    real = Sealer._tag

    def counted(self: Sealer, secret: bytes, body: bytes) -> bytes:
        nonlocal calls
        calls += 1
        return real(self, secret, body)

    monkeypatch.setattr(Sealer, "_tag", counted)
    tags = (key_id(NEW) + b"\0" * TAG_SIZE) * 255
    assert sealer.open(bytes((SEALED, 255)) + tags + b"body") is None
    assert calls == 1
    unknown = (key_id(OTHER) + b"\0" * TAG_SIZE) * 255
    assert sealer.open(bytes((SEALED, 255)) + unknown + b"body") is None
    assert calls == 1
