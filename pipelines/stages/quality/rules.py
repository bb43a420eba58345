"""What the quality steps share: a lazily split view of one text, the rule record, and the step
that applies a list of rules."""
from __future__ import annotations

import re
from functools import cached_property
from typing import Callable, Iterable, NamedTuple, Sequence

import numpy as np

from pipelines.records import Doc
from pipelines.stages.step import DocumentStep, StepResult

_BLANK_LINES = re.compile(r"\n[ \t]*\n")


class TextView:
    """One text and its words, lines and paragraphs, each split once, on first use.

    Attributes:
        text: the text.
    """

    def __init__(self, text: str):
        self.text = text

    @cached_property
    def words(self) -> list[str]:
        """The whitespace-separated words."""
        return self.text.split()

    @cached_property
    def lines(self) -> list[str]:
        """The non-blank lines, stripped."""
        return [s for s in (line.strip() for line in self.text.split("\n")) if s]

    @cached_property
    def paragraphs(self) -> list[str]:
        """The blocks between blank lines, stripped; blank ones left out."""
        return [s for s in (p.strip() for p in _BLANK_LINES.split(self.text)) if s]

    @cached_property
    def word_ids(self) -> np.ndarray:
        """``int64[len(words)]``: equal words, equal ids (numbered in order of first occurrence)."""
        vocab: dict[str, int] = {}
        return np.array([vocab.setdefault(w, len(vocab)) for w in self.words], dtype=np.int64)

    @cached_property
    def word_lens(self) -> np.ndarray:
        """``int64[len(words)]``: each word's length in characters."""
        return np.array([len(w) for w in self.words], dtype=np.int64)


def repeats(items: Iterable[str]) -> tuple[int, int]:
    """``(count, characters)`` of the items that equal an earlier item (first occurrences not counted)."""
    seen: set[str] = set()
    count = chars = 0
    for item in items:
        if item in seen:
            count += 1
            chars += len(item)
        else:
            seen.add(item)
    return count, chars


class Rule(NamedTuple):
    """One quality rule.

    Attributes:
        reason: the rejection reason without its ``quality_`` prefix (``min_words``).
        fails: whether a text fails the rule, given its :class:`TextView`.
    """

    reason: str
    fails: Callable[[TextView], bool]


def first_failure(view: TextView, rules: Sequence[Rule]) -> str | None:
    """``quality_<reason>`` of the first rule ``view`` fails, or ``None``."""
    for rule in rules:
        if rule.fails(view):
            return f"quality_{rule.reason}"
    return None


class RuleStep(DocumentStep):
    """A document step rejecting a document by the first of its rules it fails (``quality_<reason>``);
    keeps every document unchanged when inactive.

    Args:
        rules: the rules, in the order they are tried (cheap ones first).
        active: apply them (``quality.enabled`` and the section's ``enabled``).
    """

    def __init__(self, rules: Sequence[Rule], active: bool):
        self.rules = tuple(rules)
        self.active = active

    def apply(self, doc: Doc) -> StepResult:
        """Reject with the first failed rule, else keep unchanged."""
        reason = first_failure(TextView(doc.text), self.rules) if self.active else None
        return StepResult.reject(reason) if reason else StepResult.keep(doc)
