"""C4's rules (Raffel et al. 2020, "Exploring the Limits of Transfer Learning with a Unified
Text-to-Text Transformer", section 2.2, and the rules of its TensorFlow Datasets code): lines
without terminal punctuation, short lines, lines with an overlong word, "javascript" lines and
policy lines are removed and the rest of the document kept; a document with "lorem ipsum" or a
curly brace in a line it keeps, with too few sentences left, or with a word of the bad-words list
the user gives or names (``c4.bad_words``: no maintained package ships C4's list, nothing is
downloaded at run time; named lists: :mod:`pipelines.stages.quality.word_lists`) is dropped.
Thresholds: ``C4Config``.
"""
from __future__ import annotations

import re
from typing import Mapping, NamedTuple

import fsspec

from colaflow.config import ConfigError
from pipelines.config import C4Config
from pipelines.records import Doc
from pipelines.stages.quality.word_lists import word_list_path
from pipelines.stages.step import DocumentStep, StepResult

# the paper's "period, exclamation mark, question mark, or end quotation mark" (typographic quotes too)
TERMINAL_PUNCT = (".", "!", "?", '"', "'", "”", "’")
POLICY_PHRASES = ("terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies", "use cookies")
_SENTENCE_END = re.compile(r"[.!?…]+[\"'”’)\]]*\s+")
DOCUMENT_RULES = frozenset({"c4_lorem_ipsum", "c4_curly_brace"})  # a line failing these drops the document


def count_sentences(line: str) -> int:
    """Sentences in ``line``: the non-blank pieces between runs of ``.``, ``!``, ``?`` or ``…``
    (with closing quotes or brackets) followed by whitespace. ``"Hi. Bye."`` → 2, ``"no mark"`` → 1."""
    return sum(1 for piece in _SENTENCE_END.split(line) if piece.strip())


class C4Outcome(NamedTuple):
    """What C4's rules made of one text.

    Attributes:
        text: the text left (unchanged when no line was removed); ``None`` when dropped.
        reason: why the document is dropped (``c4_lorem_ipsum``, ``c4_curly_brace``, ``c4_no_lines``,
            ``c4_few_sentences``, ``c4_bad_words``); ``None`` when kept.
        lines_removed: ``{rule: lines}`` removed from a kept text (``c4_long_word``,
            ``c4_no_terminal_punct``, ``c4_short_line``, ``c4_javascript``, ``c4_policy``).
    """

    text: str | None
    reason: str | None
    lines_removed: Mapping[str, int]


def _line_verdict(line: str, cfg: C4Config) -> str | None:
    """The first rule the stripped, non-blank ``line`` fails, in C4's order (a line rule, or one of
    :data:`DOCUMENT_RULES`), or ``None`` to keep it."""
    words = line.split()
    if cfg.max_word_len and any(len(w) > cfg.max_word_len for w in words):
        return "c4_long_word"
    if cfg.terminal_punct and (not line.endswith(TERMINAL_PUNCT) or line.endswith("...")):
        return "c4_no_terminal_punct"
    if len(words) < cfg.min_words_per_line:
        return "c4_short_line"
    lower = line.lower()
    if cfg.lorem_ipsum and "lorem ipsum" in lower:
        return "c4_lorem_ipsum"
    if cfg.javascript and "javascript" in lower:
        return "c4_javascript"
    if cfg.curly_brace and "{" in line:
        return "c4_curly_brace"
    if cfg.policy and any(p in lower for p in POLICY_PHRASES):
        return "c4_policy"
    return None


def bad_words_pattern(spec: str) -> re.Pattern:
    """A pattern finding any word or phrase of the list ``spec`` (a named list, a path or a URL:
    :func:`~pipelines.stages.quality.word_lists.word_list_path`; one word or phrase per line, blank
    lines skipped) as a whole word in lower-cased text, as C4's code matches its list.

    Args:
        spec: the value of ``quality.c4.bad_words``.
    Returns:
        the compiled pattern.
    Raises:
        colaflow.config.ConfigError: no such list, its package is not installed, or it holds no word
            (one line saying what to give or install).
    """
    path = word_list_path(spec)
    fs, local = fsspec.core.url_to_fs(path)
    if not fs.isfile(local):  # a URL: word_list_path checked only local paths
        raise ConfigError(f"quality.c4.bad_words={spec}: no such file; give a word list (one word or phrase "
                          "per line), a named list or quality.c4.bad_words=null")
    with fsspec.open(path, "rt", encoding="utf-8") as f:
        words = sorted({w.strip().lower() for w in f if w.strip()}, key=lambda w: (-len(w), w))
    if not words:
        raise ConfigError(f"quality.c4.bad_words={spec}: the list holds no word; give one word or phrase per line")
    return re.compile(r"(?:\W|^)(?:" + "|".join(map(re.escape, words)) + r")(?:\W|$)")


def c4_filter(text: str, cfg: C4Config, bad_words: re.Pattern | None = None) -> C4Outcome:
    """Apply C4's line rules to each line of ``text`` and then its document rules (``bad_words``:
    :func:`bad_words_pattern` of ``cfg.bad_words``, searched in the kept lines).

    The text left is the kept lines as they were (indentation kept) with the blank lines between
    them (a run of blank lines, or blank lines left at an end by removed lines, become one or none),
    so paragraphs survive; a text with no line removed is returned unchanged.
    """
    out: list[str] = []
    removed: dict[str, int] = {}
    sentences = kept = 0
    for line in text.split("\n"):
        stripped = line.strip()
        if not stripped:
            if out and out[-1]:
                out.append("")
            continue
        why = _line_verdict(stripped, cfg)
        if why in DOCUMENT_RULES:
            return C4Outcome(None, why, {})
        if why:
            removed[why] = removed.get(why, 0) + 1
            continue
        out.append(line)
        kept += 1
        if cfg.min_sentences:
            sentences += count_sentences(stripped)
    if not kept:
        return C4Outcome(None, "c4_no_lines", {})
    if sentences < cfg.min_sentences:
        return C4Outcome(None, "c4_few_sentences", {})
    if bad_words is not None and bad_words.search("\n".join(out).lower()):
        return C4Outcome(None, "c4_bad_words", {})
    if not removed:
        return C4Outcome(text, None, {})
    while out and not out[-1]:
        out.pop()
    return C4Outcome("\n".join(out), None, removed)


class C4Step(DocumentStep):
    """Removes C4's lines (counted as ``lines_removed:<rule>`` events of a kept document) and rejects a
    document by C4's document rules as ``quality_<reason>`` (:func:`c4_filter`).

    Args:
        cfg: the rules' settings.
        enabled: ``quality.enabled``; the step is active when this and ``cfg.enabled`` are true.
    """

    def __init__(self, cfg: C4Config, enabled: bool = True):
        self.cfg = cfg
        self.active = enabled and cfg.enabled
        self._bad_words: re.Pattern | None = None

    def setup(self) -> None:
        """Read the bad-words list when active and ``cfg.bad_words`` is set."""
        if self.active and self.cfg.bad_words:
            self._bad_words = bad_words_pattern(self.cfg.bad_words)

    def apply(self, doc: Doc) -> StepResult:
        """The document with C4's lines removed, or rejected; unchanged when inactive.

        Raises:
            RuntimeError: ``cfg.bad_words`` is set and :meth:`setup` has not read it.
        """
        if not self.active:
            return StepResult.keep(doc)
        if self.cfg.bad_words and self._bad_words is None:
            raise RuntimeError("C4Step.apply before setup(): quality.c4.bad_words is not read")
        outcome = c4_filter(doc.text, self.cfg, self._bad_words)
        if outcome.text is None:
            return StepResult.reject(f"quality_{outcome.reason}")
        if not outcome.lines_removed:
            return StepResult.keep(doc)
        return StepResult.keep(doc._replace(text=outcome.text),
                               {f"lines_removed:{rule}": n for rule, n in outcome.lines_removed.items()})
