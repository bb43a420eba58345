"""Gopher's repetition rules (Rae et al. 2021, appendix A.1.1 and table A1): repeated lines and
paragraphs (by count and by characters), the most frequent 2- to 4-gram, and the repeats of
5- to 10-grams. Thresholds: ``RepetitionConfig``.

N-grams are runs of n whitespace-separated words, compared exactly; an n-gram's characters are
its words' characters (not the spaces between them), counted per character of the whole text.
"""
from __future__ import annotations

from functools import partial

import numpy as np

from pipelines.config import RepetitionConfig
from pipelines.stages.quality.rules import Rule, RuleStep, TextView, repeats


def top_ngram_fraction(view: TextView, n: int) -> float:
    """Characters of the most frequent n-gram times its count, per character of the text; 0 when no
    n-gram occurs twice. Among n-grams equally frequent, the one with the most characters."""
    total = len(view.text)
    grams = view.ngrams(n)
    if not total or not len(grams.counts) or grams.counts.max() < 2:
        return 0.0
    top = grams.first[grams.counts == grams.counts.max()]
    char_ends = np.concatenate(([0], np.cumsum(view.word_lens)))
    chars = int((char_ends[top + n] - char_ends[top]).max())
    return chars * int(grams.counts.max()) / total


def dup_ngram_fraction(view: TextView, n: int) -> float:
    """Characters of the words covered by a second or later occurrence of any n-gram (each word once),
    per character of the text; 0 for a text without words."""
    total = len(view.text)
    starts = view.ngrams(n).repeat_starts()
    if not total or not len(starts):
        return 0.0
    edges = np.zeros(len(view.word_ids) + 1, dtype=np.int64)
    np.add.at(edges, starts, 1)
    np.add.at(edges, starts + n, -1)
    covered = np.cumsum(edges[:-1]) > 0
    return int(view.word_lens[covered].sum()) / total


def too_many_dup_lines(view: TextView, cfg: RepetitionConfig) -> bool:
    """More than ``max_dup_lines`` of the lines repeat an earlier line."""
    return bool(view.lines) and repeats(view.lines)[0] / len(view.lines) > cfg.max_dup_lines


def too_many_dup_paragraphs(view: TextView, cfg: RepetitionConfig) -> bool:
    """More than ``max_dup_paragraphs`` of the paragraphs repeat an earlier paragraph."""
    paragraphs = view.paragraphs
    return bool(paragraphs) and repeats(paragraphs)[0] / len(paragraphs) > cfg.max_dup_paragraphs


def too_many_dup_line_chars(view: TextView, cfg: RepetitionConfig) -> bool:
    """Repeated lines hold more than ``max_dup_line_chars`` of the text's characters."""
    return bool(view.text) and repeats(view.lines)[1] / len(view.text) > cfg.max_dup_line_chars


def too_many_dup_paragraph_chars(view: TextView, cfg: RepetitionConfig) -> bool:
    """Repeated paragraphs hold more than ``max_dup_paragraph_chars`` of the text's characters."""
    return bool(view.text) and repeats(view.paragraphs)[1] / len(view.text) > cfg.max_dup_paragraph_chars


def top_ngram_too_frequent(view: TextView, n: int, limit: float) -> bool:
    """:func:`top_ngram_fraction` above ``limit``."""
    return top_ngram_fraction(view, n) > limit


def too_many_dup_ngrams(view: TextView, n: int, limit: float) -> bool:
    """:func:`dup_ngram_fraction` above ``limit``."""
    return dup_ngram_fraction(view, n) > limit


class RepetitionStep(RuleStep):
    """Rejects a repetitive document as ``quality_<rule>``: ``dup_paragraphs``, ``dup_paragraph_chars``,
    ``dup_lines``, ``dup_line_chars``, ``top_<n>gram`` (``max_top_ngram``'s sizes, ascending), then
    ``dup_<n>gram`` (``max_dup_ngram``'s sizes, ascending), tried in this order.

    Args:
        cfg: the thresholds.
        enabled: ``quality.enabled``; the step is active when this and ``cfg.enabled`` are true.
    """

    def __init__(self, cfg: RepetitionConfig, enabled: bool = True):
        rules = [Rule("dup_paragraphs", partial(too_many_dup_paragraphs, cfg=cfg)),
                 Rule("dup_paragraph_chars", partial(too_many_dup_paragraph_chars, cfg=cfg)),
                 Rule("dup_lines", partial(too_many_dup_lines, cfg=cfg)),
                 Rule("dup_line_chars", partial(too_many_dup_line_chars, cfg=cfg))]
        rules += [Rule(f"top_{n}gram", partial(top_ngram_too_frequent, n=n, limit=limit))
                  for n, limit in sorted(cfg.max_top_ngram.items())]
        rules += [Rule(f"dup_{n}gram", partial(too_many_dup_ngrams, n=n, limit=limit))
                  for n, limit in sorted(cfg.max_dup_ngram.items())]
        super().__init__(rules, enabled and cfg.enabled)
        self.cfg = cfg
