"""Wording of counts in progress lines, summaries and error messages: "1 file", "2 files"."""
from __future__ import annotations


def plural(n: int, noun: str, many: str | None = None) -> str:
    """``noun`` for ``n`` == 1, else its plural (``many``, by default ``noun + "s"``), e.g.
    ``plural(2, "option")`` → ``"options"``; ``plural(2, "match", "matches")`` → ``"matches"``."""
    return noun if n == 1 else many or noun + "s"


def count(n: int, noun: str, many: str | None = None) -> str:
    """``n`` with thousands separators and ``noun`` in the number :func:`plural` gives:
    ``count(1, "file")`` → ``"1 file"``; ``count(1200, "file")`` → ``"1,200 files"``."""
    return f"{n:,} {plural(n, noun, many)}"
