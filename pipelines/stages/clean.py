"""Text cleaning, its document steps (raw length, normalisation, length), and the content hash
used by exact dedup, the tokenizer sample and the split."""
from __future__ import annotations

import functools
import hashlib
import re
import sys
import unicodedata

import ftfy

from pipelines.config import CleanConfig
from pipelines.records import Doc
from pipelines.stages.step import DocumentStep, StepResult

# ECMA-48 escape sequences: CSI (ESC [ ... final), OSC (ESC ] ... BEL/ST) and two-byte ESC forms
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]?")
# C0 and C1 controls except tab and newline, DEL, and the byte-order mark
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ufeff]")
# The look-behinds make every pattern linear: a match can only start where a run starts, so a
# long run of spaces without a newline is scanned once, not once per position.
_TRAILING_SPACE = re.compile(r"(?<![ \t])[ \t]+\n")
_SPACE_RUN = re.compile(r"(?<![^\S\n])[^\S\n]+")  # any whitespace except newline
_BLANK_LINES = re.compile(r"\n{3,}")
WHITESPACE_MODES = ("trim", "collapse", "keep")
# ftfy limited to repairing broken Unicode: no quote uncurling, width folding (would change CJK
# full-width forms), HTML unescaping, ligature or line-break changes; we normalise ourselves.
_FTFY = ftfy.TextFixerConfig(unescape_html=False, remove_terminal_escapes=False, fix_latin_ligatures=False,
                             fix_character_width=False, uncurl_quotes=False, fix_line_breaks=False,
                             remove_control_chars=False, normalization=None, explain=False)


def repair_unicode(text: str) -> str:
    """Undo mojibake (UTF-8 read as Latin-1/cp1252 and similar), with ``ftfy.fix_text``
    (Speer 2019, ftfy, https://ftfy.readthedocs.io). ASCII text is returned unchanged at once."""
    return text if text.isascii() else ftfy.fix_text(text, _FTFY)


def _strip_control(text: str) -> str:
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    return _CONTROL.sub("", text)


def clean_text(text: str, cfg: CleanConfig) -> str:
    """Normalise one document.

    Steps: CRLF/CR → LF; ANSI escape sequences and control characters removed (NUL included;
    tab and newline kept; ``cfg.strip_control``), before Unicode repair (``cfg.fix_unicode``,
    :func:`repair_unicode`) so removing them later cannot create new mojibake; Unicode normal
    form ``cfg.normalization`` (UAX #15); whitespace by ``cfg.whitespace`` (``trim``: trailing spaces of
    lines; ``collapse``: also runs of any whitespace but newline → one space, 3+ newlines → 2;
    ``keep``: nothing) and the text stripped. Every step is linear in the text length.
    Returns the cleaned text (possibly empty).

    Raises:
        ValueError: ``cfg.whitespace`` is not one of ``trim``, ``collapse``, ``keep``.
    """
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if cfg.strip_control:
        text = _strip_control(text)
    if cfg.fix_unicode:
        text = repair_unicode(text)
    text = unicodedata.normalize(cfg.normalization, text)
    if cfg.strip_control and cfg.fix_unicode:  # a repaired text may decode to a control character
        text = _strip_control(text)
    if cfg.whitespace == "collapse":
        text = _BLANK_LINES.sub("\n\n", _SPACE_RUN.sub(" ", text))
    if cfg.whitespace in ("trim", "collapse"):
        text = _TRAILING_SPACE.sub("\n", text)
    elif cfg.whitespace != "keep":
        raise ValueError(f"clean.whitespace={cfg.whitespace!r}; expected one of {', '.join(WHITESPACE_MODES)}")
    return text.strip()


# Characters that draw nothing: format (zero-width space/joiners, soft hyphen, bidi marks), other
# controls, separators, combining marks without a base, and letters/symbols that render blank.
_INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Zs", "Zl", "Zp", "Mn", "Me"})
_BLANK_GLYPHS = "\u115f\u1160\u2800\u3164\uffa0"  # Hangul fillers, braille blank


@functools.cache
def _visible_pattern() -> re.Pattern:
    """Regex matching one visible character (built once per process, about 0.2 s)."""
    invisible = [chr(c) for c in range(sys.maxunicode + 1)
                 if unicodedata.category(chr(c)) in _INVISIBLE_CATEGORIES] + list(_BLANK_GLYPHS)
    return re.compile("[^" + "".join(re.escape(c) for c in invisible) + "\\s]")


def has_visible(text: str) -> bool:
    """Whether ``text`` holds at least one character that draws something (not whitespace, a
    format/control character such as U+200B or U+00AD, a lone combining mark or a blank glyph).
    Stops at the first visible character, so it costs nothing on ordinary text."""
    return _visible_pattern().search(text) is not None


def length_reason(text: str, cfg: CleanConfig) -> str | None:
    """Why a cleaned text is filtered by length: ``empty`` (nothing visible, see
    :func:`has_visible`), ``too_short``, ``too_long``, or ``None``."""
    if not text or not has_visible(text):
        return "empty"
    if len(text) < cfg.min_chars:
        return "too_short"
    if len(text) > cfg.max_chars:
        return "too_long"
    return None


class RawLengthStep(DocumentStep):
    """Rejects a document whose raw text is longer than ``cfg.max_chars`` as ``too_long``, before
    any cleaning work, so a huge document costs no more than its reading."""

    def __init__(self, cfg: CleanConfig):
        self.cfg = cfg

    def apply(self, doc: Doc) -> StepResult:
        """Reject as ``too_long`` (characters of the raw text), else keep unchanged."""
        return StepResult.reject("too_long") if len(doc.text) > self.cfg.max_chars else StepResult.keep(doc)


class CleanTextStep(DocumentStep):
    """Replaces the text by :func:`clean_text` of it; never rejects."""

    def __init__(self, cfg: CleanConfig):
        self.cfg = cfg

    def apply(self, doc: Doc) -> StepResult:
        """The document with its cleaned text."""
        return StepResult.keep(doc._replace(text=clean_text(doc.text, self.cfg)))


class LengthStep(DocumentStep):
    """Rejects a cleaned text by :func:`length_reason` (``empty``, ``too_short``, ``too_long``)."""

    def __init__(self, cfg: CleanConfig):
        self.cfg = cfg

    def apply(self, doc: Doc) -> StepResult:
        """Reject with the length reason, else keep unchanged."""
        reason = length_reason(doc.text, self.cfg)
        return StepResult.reject(reason) if reason else StepResult.keep(doc)


def dedup_text(text: str) -> str:
    """The form compared by exact dedup: casefolded, whitespace runs collapsed to one space."""
    return " ".join(text.casefold().split())


def content_hash(text: str) -> str:
    """128-bit BLAKE2b hex digest of :func:`dedup_text` (32 hex chars); equal texts ⇔ equal hash."""
    return hashlib.blake2b(dedup_text(text).encode("utf-8"), digest_size=16).hexdigest()


def hash_fraction(hex_digest: str) -> float:
    """Position of a hex digest in the hash space, in ``[0, 1)`` (first 64 bits)."""
    return int(hex_digest[:16], 16) / 2.0**64


def stable_bucket(key: str, n: int) -> int:
    """Bucket ``0..n-1`` of a string from its SHA-256 (same on every machine and Python run)."""
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") % n
