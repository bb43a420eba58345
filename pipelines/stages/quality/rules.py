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


class NgramCounts(NamedTuple):
    """The n-grams (runs of n words) of a text, compared exactly.

    Attributes:
        ids: ``int64[W - n + 1]``, each n-gram's id; equal n-grams, equal ids (in ``[0, k)``).
        first: ``int64[k]``, for each id the word index where that n-gram first starts.
        counts: ``int64[k]``, how often each occurs (overlapping occurrences count).
    """

    ids: np.ndarray
    first: np.ndarray
    counts: np.ndarray

    def repeat_starts(self) -> np.ndarray:
        """``int64[m]``: the word indexes where a second or later occurrence starts, ascending."""
        starts = np.arange(len(self.ids))
        return starts[self.first[self.ids] != starts]


class TextView:
    """One text and its words, lines, paragraphs and n-grams, each computed once, on first use.

    Attributes:
        text: the text.
    """

    def __init__(self, text: str):
        self.text = text
        self._ngrams: dict[int, NgramCounts] = {}

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

    def ngrams(self, n: int) -> NgramCounts:
        """The n-grams of the words, exactly: an n-gram's id numbers the pair (its first n - 1 words'
        id, its last word's id), so each size costs one sort of integers and builds on the one below.

        Raises:
            ValueError: ``n < 1``.
        """
        if n < 1:
            raise ValueError(f"n-gram size {n} < 1")
        if n not in self._ngrams:
            words = self.word_ids
            if n == 1:
                pairs = words
            else:
                below = self.ngrams(n - 1).ids[:-1]  # ids < len(words), so the pairs cannot collide
                pairs = below * max(len(words), 1) + words[n - 1:]
            _, first, ids, counts = np.unique(pairs, return_index=True, return_inverse=True, return_counts=True)
            self._ngrams[n] = NgramCounts(ids.ravel().astype(np.int64), first.astype(np.int64),
                                          counts.astype(np.int64))
        return self._ngrams[n]


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
