"""PII redaction: e-mail addresses, IPv4/IPv6 addresses and phone numbers become placeholders.

Patterns are deliberately conservative (precision over recall) so prose is not mangled:
e-mail after the HTML5 "valid e-mail address" grammar, IPv4 dotted quads with octets
0–255, IPv6 validated with :mod:`ipaddress`, phone numbers in international
(``+CC ...``) or North-American ``(NNN) NNN-NNNN`` / ``NNN-NNN-NNNN`` shapes.
"""
from __future__ import annotations

import ipaddress
import re

from .config import PIIConfig

PLACEHOLDERS = {"email": "<EMAIL>", "ip": "<IP>", "phone": "<PHONE>"}

# the look-behind lets a match start only where a local part starts: linear on long runs
_EMAIL = re.compile(r"(?<![A-Za-z0-9.!#$%&'*+/=?^_`{|}~-])[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+@[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)+")
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_IPV4 = re.compile(rf"(?<![\d.]){_OCTET}(?:\.{_OCTET}){{3}}(?![\d.]*\d)")
_IPV6_CANDIDATE = re.compile(r"(?<![0-9A-Fa-f:])(?:[0-9A-Fa-f]{0,4}:){2,7}[0-9A-Fa-f]{0,4}(?![0-9A-Fa-f:])")
_PHONE = re.compile(r"(?<![\w+])(?:\+\d{1,3}[ .-]?(?:\(\d{1,4}\)[ .-]?)?\d{1,4}(?:[ .-]?\d{2,4}){2,4}"
                    r"|\(\d{3}\)[ .-]?\d{3}[ .-]\d{4}|\d{3}[.-]\d{3}[.-]\d{4})(?!\w)")


def _ipv6(match: re.Match) -> str:
    try:
        ipaddress.IPv6Address(match.group(0))
    except ValueError:
        return match.group(0)
    return PLACEHOLDERS["ip"]


def redact(text: str, cfg: PIIConfig) -> tuple[str, dict[str, int]]:
    """Replace PII in ``text``; returns ``(text, {kind: replacements})`` (kinds with 0 omitted)."""
    counts: dict[str, int] = {}
    if not cfg.enabled:
        return text, counts
    if cfg.email and "@" in text:
        text, n = _EMAIL.subn(PLACEHOLDERS["email"], text)
        counts["email"] = n
    if cfg.ip:
        n = 0
        if "." in text:
            text, n = _IPV4.subn(PLACEHOLDERS["ip"], text)
        if "::" in text or text.count(":") >= 7:
            before = text.count(PLACEHOLDERS["ip"])
            text = _IPV6_CANDIDATE.sub(_ipv6, text)
            n += text.count(PLACEHOLDERS["ip"]) - before
        counts["ip"] = n
    if cfg.phone:
        text, n = _PHONE.subn(PLACEHOLDERS["phone"], text)
        counts["phone"] = n
    return text, {k: v for k, v in counts.items() if v}
