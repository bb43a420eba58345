"""Text cleaning and the content hash used by exact dedup and tokenizer sampling.

Pure functions on ``str`` so the Beam transforms and the plain-Python baseline
(``benchmarks/bench_preprocess.py``) share one implementation.
"""
from __future__ import annotations

import hashlib
import re
import unicodedata

from .config import CleanConfig

# ECMA-48 escape sequences: CSI (ESC [ ... final), OSC (ESC ] ... BEL/ST) and two-byte ESC forms
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]?")
# C0 and C1 controls except tab and newline, DEL, and the byte-order mark
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ufeff]")
_TRAILING_SPACE = re.compile(r"[ \t]+\n")


def clean_text(text: str, cfg: CleanConfig) -> str:
    """Normalise one document.

    Steps: Unicode normal form ``cfg.normalization`` (UAX #15); CRLF/CR → LF; when
    ``cfg.strip_control``, ANSI escape sequences and control characters (NUL included; tab
    and newline kept) are removed; trailing spaces of lines and surrounding whitespace are
    stripped. Returns the cleaned text (possibly empty).
    """
    text = unicodedata.normalize(cfg.normalization, text)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if cfg.strip_control:
        text = _CONTROL.sub("", _ANSI.sub("", text))
    return _TRAILING_SPACE.sub("\n", text).strip()


def length_reason(text: str, cfg: CleanConfig) -> str | None:
    """Why a cleaned text is filtered by length: ``empty``, ``too_short``, ``too_long``, or ``None``."""
    if not text:
        return "empty"
    if len(text) < cfg.min_chars:
        return "too_short"
    if len(text) > cfg.max_chars:
        return "too_long"
    return None


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
