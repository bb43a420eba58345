"""Heuristic document quality filters (Gopher and C4 rules).

Sources: Rae et al. 2021, "Scaling Language Models: Methods, Analysis & Insights from
Training Gopher", appendix A.1.1 (word count, mean word length, symbol ratio, bullet and
ellipsis lines, alphabetic words, stop words, repeated lines); Raffel et al. 2020,
"Exploring the Limits of Transfer Learning" section 2.2 (lorem ipsum, curly braces,
javascript notices). Thresholds live in :class:`pipelines.config.QualityConfig`.
"""
from __future__ import annotations

from pipelines.config import QualityConfig
from pipelines.records import Doc
from pipelines.stages.step import DocumentStep, StepResult

STOP_WORDS = frozenset({"the", "be", "to", "of", "and", "that", "have", "with"})
_BULLETS = ("•", "*", "-", "‣", "◦", "⁃", "·")
_ELLIPSES = ("...", "…")


def quality_reason(text: str, cfg: QualityConfig) -> str | None:
    """First failed rule as ``quality_<rule>`` (e.g. ``quality_min_words``), or ``None`` if the text passes.

    ``text`` is cleaned text; returns ``None`` at once when ``cfg.enabled`` is false.
    """
    if not cfg.enabled:
        return None
    words = text.split()
    n = len(words)
    if n < cfg.min_words:
        return "quality_min_words"
    if n > cfg.max_words:
        return "quality_max_words"
    if n:
        mean_len = sum(len(w) for w in words) / n
        if not cfg.min_mean_word_len <= mean_len <= cfg.max_mean_word_len:
            return "quality_mean_word_len"
        symbols = text.count("#") + text.count("...") + text.count("…")
        if symbols / n > cfg.max_symbol_ratio:
            return "quality_symbol_ratio"
        if sum(any(c.isalpha() for c in w) for w in words) / n < cfg.min_alpha_words:
            return "quality_alpha_words"
    if len(STOP_WORDS.intersection(w.lower().strip(".,;:!?\"'()") for w in words)) < cfg.min_stop_words:
        return "quality_stop_words"
    lines = [line.strip() for line in text.split("\n") if line.strip()]
    if lines:
        if sum(line.startswith(_BULLETS) for line in lines) / len(lines) > cfg.max_bullet_lines:
            return "quality_bullet_lines"
        if sum(line.endswith(_ELLIPSES) for line in lines) / len(lines) > cfg.max_ellipsis_lines:
            return "quality_ellipsis_lines"
        if 1 - len(set(lines)) / len(lines) > cfg.max_dup_line_fraction:
            return "quality_dup_lines"
    if cfg.c4_badwords:
        lower = text.lower()
        if "lorem ipsum" in lower:
            return "quality_lorem_ipsum"
        if "{" in text:
            return "quality_curly_brace"
        if "javascript" in lower and ("enable" in lower or "browser" in lower):
            return "quality_javascript"
    return None


class QualityStep(DocumentStep):
    """Rejects a document by :func:`quality_reason` (``quality_<rule>``); keeps every document when
    ``cfg.enabled`` is false."""

    def __init__(self, cfg: QualityConfig):
        self.cfg = cfg

    def apply(self, doc: Doc) -> StepResult:
        """Reject with the first failed rule, else keep unchanged."""
        reason = quality_reason(doc.text, self.cfg)
        return StepResult.reject(reason) if reason else StepResult.keep(doc)
