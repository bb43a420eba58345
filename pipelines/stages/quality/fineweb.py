"""FineWeb's rules (Penedo et al. 2024, "The FineWeb Datasets: Decanting the Web for the Finest
Text Data at Scale", section 3.5; the newline rule from FineWeb's code, datatrove's
``FineWebQualityFilter``): lines ending in punctuation, short lines, characters in repeated lines,
newlines per word. Thresholds: ``FineWebConfig``."""
from __future__ import annotations

from functools import partial

from pipelines.config import FineWebConfig
from pipelines.stages.quality.rules import Rule, RuleStep, TextView, repeats

# sentence-final marks of the scripts colaflow's language filter sees most (Latin, CJK, Arabic, Devanagari)
# and closing quotes
LINE_END_PUNCT = (".", "!", "?", "…", '"', "'", "”", "’", "»", "。", "！", "？", "؟", "।")


def too_few_punct_lines(view: TextView, cfg: FineWebConfig) -> bool:
    """Fewer than ``min_line_punct`` of the lines end in punctuation (:data:`LINE_END_PUNCT`)."""
    lines = view.lines
    return bool(lines) and sum(line.endswith(LINE_END_PUNCT) for line in lines) / len(lines) < cfg.min_line_punct


def too_many_short_lines(view: TextView, cfg: FineWebConfig) -> bool:
    """More than ``max_short_lines`` of the lines are at most ``short_line_chars`` characters long."""
    lines = view.lines
    return bool(lines) and sum(len(line) <= cfg.short_line_chars for line in lines) / len(lines) > cfg.max_short_lines


def too_many_dup_line_chars(view: TextView, cfg: FineWebConfig) -> bool:
    """Repeated lines hold more than ``max_dup_line_chars`` of the characters (newlines not counted)."""
    chars = len(view.text) - view.text.count("\n")
    return chars > 0 and repeats(view.lines)[1] / chars > cfg.max_dup_line_chars


def too_many_newlines(view: TextView, cfg: FineWebConfig) -> bool:
    """More than ``max_newline_ratio`` newlines per word (a list rather than prose)."""
    return bool(view.words) and view.text.count("\n") / len(view.words) > cfg.max_newline_ratio


_RULES = (("fineweb_line_punct", too_few_punct_lines), ("fineweb_short_lines", too_many_short_lines),
          ("fineweb_dup_line_chars", too_many_dup_line_chars), ("fineweb_newlines", too_many_newlines))


class FineWebStep(RuleStep):
    """Rejects a document failing a FineWeb rule as ``quality_<rule>``: ``fineweb_line_punct``,
    ``fineweb_short_lines``, ``fineweb_dup_line_chars``, ``fineweb_newlines`` (tried in this order).

    Args:
        cfg: the thresholds.
        enabled: ``quality.enabled``; the step is active when this and ``cfg.enabled`` are true.
    """

    def __init__(self, cfg: FineWebConfig, enabled: bool = True):
        super().__init__([Rule(name, partial(fn, cfg=cfg)) for name, fn in _RULES], enabled and cfg.enabled)
        self.cfg = cfg
