"""Wording of user-facing text: counts in progress lines, summaries and error messages ("1 file",
"2 files"), and module docstrings shown as ``--help`` text. The lowest package, so every other
(pipelines, cache, loaders, trainer, benchmarks) can use it."""
from __future__ import annotations

import re

# a reST cross-reference (Sphinx roles), e.g. :func:`pipelines.job.run` or :class:`~shards.Manifest`
_ROLE = re.compile(r":(?:func|mod|class|meth|data|attr|exc|obj):`~?([^`]+)`")


def plural(n: int, noun: str, many: str | None = None) -> str:
    """``noun`` for ``n`` == 1, else its plural (``many``, by default ``noun + "s"``), e.g.
    ``plural(2, "option")`` → ``"options"``; ``plural(2, "match", "matches")`` → ``"matches"``."""
    return noun if n == 1 else many or noun + "s"


def count(n: int, noun: str, many: str | None = None) -> str:
    """``n`` with thousands separators and ``noun`` in the number :func:`plural` gives:
    ``count(1, "file")`` → ``"1 file"``; ``count(1200, "file")`` → ``"1,200 files"``."""
    return f"{n:,} {plural(n, noun, many)}"


def help_text(doc: str) -> str:
    """A reST docstring as plain ``--help`` text: ````python -m shards```` → ``python -m shards``,
    ``:func:`pipelines.job.run``` → ``pipelines.job.run``, a literal block's ``Usage::`` → ``Usage:``.
    Line breaks are kept (for ``argparse.RawDescriptionHelpFormatter``)."""
    return re.sub(r"::$", ":", _ROLE.sub(r"\1", doc).replace("``", ""), flags=re.MULTILINE)
