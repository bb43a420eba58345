"""Input records: reading files into raw units and parsing them into documents or dead letters.

Small explicit types pass between the pipeline stages:

* :class:`Doc` — one document (id, text, source) after parsing;
* :class:`DeadLetter` — an input unit that could not become a document, with file, line,
  reason and a short excerpt, written to ``OUT/dead_letter/``.

Parsing never raises on bad input: every unit becomes exactly one ``Doc`` or ``DeadLetter``.
"""
from __future__ import annotations

import json
import os
import re
from typing import BinaryIO, Iterator, NamedTuple, Union

from .config import InputConfig

RAW_EXCERPT_BYTES = 200
UNREADABLE = "unreadable"  # unit format of a read error: the unit's bytes are the error message
_COMPRESSED = (".gz", ".bz2", ".zst")
_BLANK_LINE = re.compile(rb"^[ \t\r]*$")


class Doc(NamedTuple):
    """A parsed document. ``text`` is a Python ``str``; ``source`` names the corpus it came from."""

    id: str
    text: str
    source: str


class DeadLetter(NamedTuple):
    """An input unit that could not be parsed.

    Attributes:
        file: input path or URL.
        line: 1-based line number of the unit's first line.
        reason: short machine-readable reason (``not_utf8``, ``bad_json``, ``not_object``, ...).
        error: human-readable detail.
        source: file stem (the record's source is unknown when it cannot be parsed).
        raw: the first 200 bytes of the unit, undecodable bytes as ``\\xNN`` escapes.
    """

    file: str
    line: int
    reason: str
    error: str
    source: str
    raw: str

    def to_json(self) -> str:
        return json.dumps(self._asdict(), sort_keys=True, ensure_ascii=False)


Parsed = Union[Doc, DeadLetter]


def file_stem(path: str) -> str:
    """``data/shakespeare.jsonl.gz`` → ``shakespeare`` (compression and format suffixes removed)."""
    name = path.rstrip("/").rsplit("/", 1)[-1]
    for suffix in _COMPRESSED:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return os.path.splitext(name)[0] or name


def file_format(path: str, cfg: InputConfig) -> str:
    """``jsonl`` or ``text`` for ``path`` under ``cfg.format`` (``auto`` looks at the extension)."""
    if cfg.format != "auto":
        return cfg.format
    name = path
    for suffix in _COMPRESSED:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return "jsonl" if name.endswith((".jsonl", ".json", ".ndjson")) else "text"


def iter_units(stream: BinaryIO, fmt: str) -> Iterator[tuple[int, bytes]]:
    """Split a binary stream into raw units: ``(first line number, bytes)``.

    ``jsonl``: one unit per line (line ending removed). ``text``: one unit per paragraph
    (lines up to a blank line, joined with ``\\n``). Works on bytes so undecodable input
    is reported per unit instead of failing the file.
    """
    if fmt == "jsonl":
        for i, line in enumerate(stream, 1):
            yield i, line.rstrip(b"\r\n")
        return
    start, lines = 0, []
    for i, line in enumerate(stream, 1):
        line = line.rstrip(b"\r\n")
        if _BLANK_LINE.match(line):
            if lines:
                yield start, b"\n".join(lines)
            lines = []
        else:
            if not lines:
                start = i
            lines.append(line)
    if lines:
        yield start, b"\n".join(lines)


def _excerpt(raw: bytes) -> str:
    return raw[:RAW_EXCERPT_BYTES].decode("utf-8", errors="backslashreplace")


def parse_unit(path: str, line: int, raw: bytes, fmt: str, cfg: InputConfig) -> Parsed:
    """Turn one raw unit into a :class:`Doc` or a :class:`DeadLetter` (never raises).

    JSONL units must be UTF-8 JSON objects with a string ``cfg.text_field``; ids that are
    missing become ``{file stem}/{line:08d}``, a missing source becomes the file stem.
    Text units (paragraphs) get the id ``{file stem}/{line:08d}``. A unit of format
    ``unreadable`` (a read error, see :func:`pipelines.transforms.read_units`) becomes an
    ``unreadable_file`` dead letter.
    """
    stem = file_stem(path)

    def dead(reason: str, error: str) -> DeadLetter:
        return DeadLetter(path, line, reason, error, stem, _excerpt(raw))

    if fmt == UNREADABLE:
        return dead("unreadable_file", f"reading stopped after line {line - 1}: {raw.decode('utf-8', 'replace')}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return dead("not_utf8", f"invalid UTF-8 at byte {e.start}: {e.reason}")
    fallback_id = f"{stem}/{line:08d}"
    if fmt == "text":
        return Doc(fallback_id, text, stem)
    if not text.strip():
        return dead("blank_line", "blank line in JSONL input")
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        return dead("bad_json", f"not JSON: {e}")
    if not isinstance(obj, dict):
        return dead("not_object", f"JSON {type(obj).__name__}, expected an object")
    body = obj.get(cfg.text_field)
    if body is None:
        return dead("missing_text", f"no {cfg.text_field!r} field (fields: {', '.join(sorted(obj))[:100]})")
    if not isinstance(body, str):
        return dead("text_not_string", f"{cfg.text_field!r} is {type(body).__name__}, expected a string")
    doc_id = obj.get(cfg.id_field)
    if isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)) or doc_id == "":
        doc_id = fallback_id
    source = obj.get(cfg.source_field)
    if not isinstance(source, str) or not source:
        source = stem
    return Doc(str(doc_id), body, source)
