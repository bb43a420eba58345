"""Gopher's quality rules (Rae et al. 2021, "Scaling Language Models: Methods, Analysis & Insights
from Training Gopher", appendix A.1.1): word count, mean word length, ``#`` and ellipsis ratios,
bullet and ellipsis lines, alphabetic words, stop words. Thresholds: ``GopherQualityConfig``."""
from __future__ import annotations

from functools import partial

from pipelines.config import GopherQualityConfig
from pipelines.stages.quality.rules import Rule, RuleStep, TextView

STOP_WORDS = frozenset({"the", "be", "to", "of", "and", "that", "have", "with"})
BULLETS = ("•", "*", "-", "‣", "◦", "⁃", "·")
ELLIPSES = ("...", "…")
_WORD_EDGES = ".,;:!?\"'()"


def too_few_words(view: TextView, cfg: GopherQualityConfig) -> bool:
    """Fewer than ``min_words`` words."""
    return len(view.words) < cfg.min_words


def too_many_words(view: TextView, cfg: GopherQualityConfig) -> bool:
    """More than ``max_words`` words."""
    return len(view.words) > cfg.max_words


def mean_word_len_out_of_range(view: TextView, cfg: GopherQualityConfig) -> bool:
    """Mean word length (characters) outside ``[min_mean_word_len, max_mean_word_len]``; no words pass."""
    words = view.words
    return bool(words) and not cfg.min_mean_word_len <= sum(map(len, words)) / len(words) <= cfg.max_mean_word_len


def too_many_hashes(view: TextView, cfg: GopherQualityConfig) -> bool:
    """More than ``max_hash_ratio`` ``#`` characters per word."""
    return bool(view.words) and view.text.count("#") / len(view.words) > cfg.max_hash_ratio


def too_many_ellipses(view: TextView, cfg: GopherQualityConfig) -> bool:
    """More than ``max_ellipsis_ratio`` ellipses (``...`` or ``…``) per word."""
    n = view.text.count("...") + view.text.count("…")
    return bool(view.words) and n / len(view.words) > cfg.max_ellipsis_ratio


def too_many_bullet_lines(view: TextView, cfg: GopherQualityConfig) -> bool:
    """More than ``max_bullet_lines`` of the lines start with a bullet."""
    lines = view.lines
    return bool(lines) and sum(line.startswith(BULLETS) for line in lines) / len(lines) > cfg.max_bullet_lines


def too_many_ellipsis_lines(view: TextView, cfg: GopherQualityConfig) -> bool:
    """More than ``max_ellipsis_lines`` of the lines end with an ellipsis."""
    lines = view.lines
    return bool(lines) and sum(line.endswith(ELLIPSES) for line in lines) / len(lines) > cfg.max_ellipsis_lines


def too_few_alpha_words(view: TextView, cfg: GopherQualityConfig) -> bool:
    """Fewer than ``min_alpha_words`` of the words hold a letter."""
    words = view.words
    return bool(words) and sum(any(c.isalpha() for c in w) for w in words) / len(words) < cfg.min_alpha_words


def too_few_stop_words(view: TextView, cfg: GopherQualityConfig) -> bool:
    """Fewer than ``min_stop_words`` distinct stop words (case and surrounding punctuation ignored)."""
    found = STOP_WORDS.intersection(w.lower().strip(_WORD_EDGES) for w in view.words)
    return len(found) < cfg.min_stop_words


_RULES = (("min_words", too_few_words), ("max_words", too_many_words), ("mean_word_len", mean_word_len_out_of_range),
          ("hash_ratio", too_many_hashes), ("ellipsis_ratio", too_many_ellipses), ("alpha_words", too_few_alpha_words),
          ("stop_words", too_few_stop_words), ("bullet_lines", too_many_bullet_lines),
          ("ellipsis_lines", too_many_ellipsis_lines))


class GopherQualityStep(RuleStep):
    """Rejects a document failing a Gopher quality rule as ``quality_<rule>``: ``min_words``,
    ``max_words``, ``mean_word_len``, ``hash_ratio``, ``ellipsis_ratio``, ``alpha_words``,
    ``stop_words``, ``bullet_lines``, ``ellipsis_lines`` (tried in this order).

    Args:
        cfg: the thresholds.
        enabled: ``quality.enabled``; the step is active when this and ``cfg.enabled`` are true.
    """

    def __init__(self, cfg: GopherQualityConfig, enabled: bool = True):
        super().__init__([Rule(name, partial(fn, cfg=cfg)) for name, fn in _RULES], enabled and cfg.enabled)
        self.cfg = cfg
