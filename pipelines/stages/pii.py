"""PII redaction: e-mail addresses, IPv4/IPv6 addresses and phone numbers become placeholders.

Patterns are deliberately conservative (precision over recall), so prose and code are not
mangled; precision and recall on real documentation text with planted PII are measured by
``benchmarks/bench_pii.py`` (numbers in BENCHMARKS.md). Every match must stand alone: it may
not continue a word, a dotted name or a ``::`` path, so ``std::vector``, ``use std::io::Read``,
reST ``For example::``, slices ``a[1::2]`` and version strings ``v1.2.3.4`` are never touched.

* e-mail: a local part of letters, digits and ``._%+-`` starting with a letter, digit or ``_``
  (the practical subset of RFC 5322; quotes, backquotes, ``=`` or ``/`` before ``@`` start no
  address, so ``addr='bob@x.org'`` yields ``bob@x.org`` and reST ````@decorator```` nothing), a
  domain of LDH labels (RFC 1035) and an alphabetic top-level label of 2+ letters (``a@b.T`` in
  matrix code is not an address);
* IPv4: dotted quads with octets 0–255, not right after ``-``, ``/`` or ``=`` (``novas-3.1.1.3``,
  ``Firefox/2.0.0.11`` are versions);
* IPv6: validated with :mod:`ipaddress` (RFC 4291 text forms), holding at least three
  non-empty groups (``::``, ``::1``, ``a::b`` or ``fe80::1`` are too short to tell from code) and
  not ending in ``::`` (``2001:db8:85a3::`` is a network prefix, no host; ``a:b:c::`` is code);
* phone numbers: international (``+CC ...``, country code not starting with 0, groups separated
  by spaces or hyphens) or North-American ``(NNN) NNN-NNNN`` / ``NNN-NNN-NNNN`` / ``NNN.NNN.NNNN``.
"""
from __future__ import annotations

import ipaddress
import re
from typing import NamedTuple

from pipelines.config import PIIConfig
from pipelines.records import Doc
from pipelines.stages.step import DocumentStep, StepResult

PLACEHOLDERS = {"email": "<EMAIL>", "ip": "<IP>", "phone": "<PHONE>"}
KINDS = tuple(PLACEHOLDERS)

# the look-behind lets a match start only where a local part starts: linear on long runs
_EMAIL = re.compile(r"(?<![\w.%+-])[A-Za-z0-9_][\w.%+-]*@[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.[A-Za-z]{2,63}(?![\w-]|\.\w)", re.ASCII)
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_IPV4 = re.compile(rf"(?<![\w.\-/=]){_OCTET}(?:\.{_OCTET}){{3}}(?!\.?\w)")
_IPV6_CANDIDATE = re.compile(r"(?<![\w:.])(?:[0-9A-Fa-f]{0,4}:){2,7}(?:[0-9A-Fa-f]{1,4}|(?:\d{1,3}\.){3}\d{1,3})?"
                             r"(?![\w:]|\.\w)")
_PHONE = re.compile(r"(?<![\w+.])(?:\+[1-9]\d{0,2}[ -]?(?:\(\d{1,4}\)[ -]?)?\d{1,4}(?:[ -]?\d{2,4}){2,4}"
                    r"|\(\d{3}\)[ .-]?\d{3}[ .-]\d{4}|\d{3}[.-]\d{3}[.-]\d{4})(?![\w.]\w|\w)")
_MIN_IPV6_GROUPS = 3


class Span(NamedTuple):
    """One PII match: ``kind`` (``email``, ``ip``, ``phone``) over characters ``[start, end)``."""

    kind: str
    start: int
    end: int


def _is_ipv6(candidate: str) -> bool:
    if candidate.endswith("::"):  # a prefix (host bits zero) names a network, and reads like a path
        return False
    groups = [g for g in candidate.split(":") if g]
    if len(groups) + sum("." in g for g in groups) < _MIN_IPV6_GROUPS:  # an embedded IPv4 counts as two
        return False
    try:
        ipaddress.IPv6Address(candidate)
    except ValueError:
        return False
    return True


def find_pii(text: str, cfg: PIIConfig) -> list[Span]:
    """Non-overlapping PII spans of ``text`` in text order, for the kinds ``cfg`` enables (none when
    ``cfg.enabled`` is false). Where matches of two kinds overlap, the earlier kind in
    ``email, ip, phone`` wins. Each pattern is linear in the text length."""
    if not cfg.enabled:
        return []
    found: list[Span] = []
    if cfg.email and "@" in text:
        found += [Span("email", m.start(), m.end()) for m in _EMAIL.finditer(text)]
    if cfg.ip:
        if "." in text:
            found += [Span("ip", m.start(), m.end()) for m in _IPV4.finditer(text)]
        if text.count(":") >= 2:
            found += [Span("ip", m.start(), m.end()) for m in _IPV6_CANDIDATE.finditer(text) if _is_ipv6(m.group(0))]
    if cfg.phone:
        found += [Span("phone", m.start(), m.end()) for m in _PHONE.finditer(text)]
    spans: list[Span] = []
    for span in sorted(found, key=lambda s: (s.start, KINDS.index(s.kind))):
        if spans and span.start < spans[-1].end:  # overlap: keep the earlier kind (each kind alone never overlaps)
            if KINDS.index(span.kind) < KINDS.index(spans[-1].kind):
                spans[-1] = span
            continue
        spans.append(span)
    return spans


def redact(text: str, cfg: PIIConfig) -> tuple[str, dict[str, int]]:
    """Replace the spans of :func:`find_pii` by their placeholders (``<EMAIL>``, ``<IP>``,
    ``<PHONE>``); returns ``(text, {kind: replacements})`` (kinds with 0 omitted)."""
    spans = find_pii(text, cfg)
    if not spans:
        return text, {}
    parts, counts, pos = [], {}, 0
    for span in spans:
        parts += [text[pos:span.start], PLACEHOLDERS[span.kind]]
        counts[span.kind] = counts.get(span.kind, 0) + 1
        pos = span.end
    parts.append(text[pos:])
    return "".join(parts), counts


class RedactStep(DocumentStep):
    """Replaces PII by placeholders (:func:`redact`) and counts ``redacted:<kind>`` events per
    replacement kind; never rejects."""

    def __init__(self, cfg: PIIConfig):
        self.cfg = cfg

    def apply(self, doc: Doc) -> StepResult:
        """The document with PII redacted, and ``{"redacted:<kind>": replacements}`` (kinds in text order)."""
        text, counts = redact(doc.text, self.cfg)
        if not counts:
            return StepResult.keep(doc)
        return StepResult.keep(doc._replace(text=text), {f"redacted:{kind}": n for kind, n in counts.items()})
