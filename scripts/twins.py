"""How much of the client is written twice: the non-trivial lines its sync and async face
files share once ``async`` / ``await`` and the ``Async`` / ``a`` prefixes are stripped.

Why: the client keeps one sans-I/O core and two thin faces (docs/architecture.md, STYLE.md
habit 15); hand-copied twins creep back one convenient copy at a time. This script counts the
copies so a test (tests/client/test_client_twins.py) can hold the count under its bound, and
so a change can say what it did to it (``python scripts/twins.py``; ``--root DIR`` measures
another checkout, e.g. one made with ``git worktree add``).

What counts: each face file is read line by line; a line is normalised (leading and trailing
blanks dropped, ``async `` and ``await `` removed, ``Async`` prefixes of names and the ``a``
of ``__aenter__`` / ``__aexit__`` / ``aclose`` dropped, the face modules' names made equal)
and kept when it is *non-trivial*: not blank, not a comment, and with at least
:data:`MIN_WORD_CHARS` letters, digits or underscores (so ``)``, ``try:``, ``else:``,
``return`` and ``\"\"\"`` are not counted, ``return existed`` is). The lines written twice in
a pair are the multiset intersection of its two files' kept lines: a line that the sync file
has three times and the async file twice counts twice.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

__all__ = ["MIN_WORD_CHARS", "PAIRS", "measure", "normalise", "shared_lines"]

#: The face pairs of the client (sync file, async file), relative to the repository root.
PAIRS: tuple[tuple[str, str], ...] = (
    ("client/_sync.py", "client/_async.py"),
    ("client/_sync_conn.py", "client/_async_conn.py"),
    ("client/_sync_session.py", "client/_async_session.py"),
    ("client/recipes/_sync.py", "client/recipes/_async.py"),
    ("client/recipes/_sync_coord.py", "client/recipes/_async_coord.py"),
)

#: A line needs this many word characters (after normalising) to count.
MIN_WORD_CHARS = 12

_SUBSTITUTIONS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\basync\s+(?=def|with|for)\b"), ""),
    (re.compile(r"\bawait\s+"), ""),
    (re.compile(r"\bAsync(?=[A-Z_])"), ""),
    (re.compile(r"\b__a(enter|exit|iter|next)__\b"), r"__\1__"),
    (re.compile(r"\ba(close|iter|next)\b"), r"\1"),
    (re.compile(r"\b_async(?=_|\b)"), "_sync"),
    (re.compile(r"\basync_"), ""),
)
_WORD = re.compile(r"\w")


def normalise(line: str) -> str | None:
    """The line as the two faces would share it, or None when it is trivial."""
    text = line.strip()
    if not text or text.startswith("#"):
        return None
    for pattern, replacement in _SUBSTITUTIONS:
        text = pattern.sub(replacement, text)
    if len(_WORD.findall(text)) < MIN_WORD_CHARS:
        return None
    return text


def _kept(path: Path) -> Counter[str]:
    lines = (normalise(line) for line in path.read_text(encoding="utf-8").splitlines())
    return Counter(line for line in lines if line is not None)


def shared_lines(sync_file: Path, async_file: Path) -> Counter[str]:
    """The non-trivial lines written in both files, with how many times each is shared."""
    return _kept(sync_file) & _kept(async_file)


def measure(root: Path) -> dict[str, int]:
    """Lines written twice per pair (keyed ``"sync_file vs async_file"``); a pair whose files
    do not both exist counts 0."""
    out: dict[str, int] = {}
    for sync_name, async_name in PAIRS:
        sync_file, async_file = root / sync_name, root / async_name
        key = f"{sync_name} vs {async_name}"
        if not (sync_file.is_file() and async_file.is_file()):
            out[key] = 0
            continue
        out[key] = sum(shared_lines(sync_file, async_file).values())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--show", action="store_true", help="print the shared lines too")
    args = parser.parse_args(argv)
    counts = measure(args.root)
    for key, count in counts.items():
        print(f"{count:5d}  {key}")
        if args.show:
            sync_name, async_name = key.split(" vs ")
            shared = shared_lines(args.root / sync_name, args.root / async_name)
            for line, times in sorted(shared.items()):
                print(f"         {times}x {line}")
    print(f"{sum(counts.values()):5d}  total")
    return 0


if __name__ == "__main__":
    sys.exit(main())
