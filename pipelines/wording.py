"""Wording of counts in progress lines, summaries and error messages: "1 file", "2 files"."""
from __future__ import annotations


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` with thousands separators and ``noun``, in the plural unless ``n`` is 1.

    ``count(1, "file")`` → ``"1 file"``; ``count(1200, "file")`` → ``"1,200 files"``;
    ``plural`` overrides the default (``noun + "s"``), e.g. ``count(2, "match", "matches")``.
    """
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"
