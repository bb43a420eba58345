"""Input records: reading files into raw units and parsing them into documents or dead letters.

Small explicit types pass between the pipeline stages:

* :class:`Doc` — one document (id, text, source) after parsing;
* :class:`DeadLetter` — an input unit that could not become a document, with file, line,
  byte offset, reason and a short excerpt, written to ``OUT/dead_letter/``.

Reading files into units lives in :mod:`pipelines.reading`.

Parsing never raises on bad input: every unit becomes exactly one ``Doc`` or ``DeadLetter``.
"""
from __future__ import annotations

import json
import os
from typing import NamedTuple, Union

from .config import InputConfig

RAW_EXCERPT_BYTES = 200
UNREADABLE = "unreadable"  # unit format of a read error: the unit's bytes are the error message
TOO_LARGE = "too_large"  # unit format of a skipped over-long record: the unit's bytes are its head
PARQUET = "parquet"  # unit format of a Parquet row: the payload is (text, id, source) as read
DUPLICATES = "duplicates"  # tag of the duplicate_record lines written to OUT/duplicates/
_COMPRESSED = (".gz", ".bz2", ".zst")


class Doc(NamedTuple):
    """A parsed document. ``text`` is a Python ``str``; ``source`` names the corpus it came from."""

    id: str
    text: str
    source: str


class DeadLetter(NamedTuple):
    """An input unit that could not be parsed.

    Attributes:
        file: input path or URL.
        line: 1-based line number of the unit's first line (Parquet: row number); 0 when unknown
            (a record of a byte-range split that does not start the file: see ``offset``).
        reason: short machine-readable reason (``not_utf8``, ``bad_json``, ``not_object``, ...).
        error: human-readable detail.
        source: file stem (the record's source is unknown when it cannot be parsed).
        raw: the first 200 bytes of the unit, undecodable bytes as ``\\xNN`` escapes.
        offset: byte offset of the unit in the (decompressed) file; -1 for Parquet rows.
    """

    file: str
    line: int
    reason: str
    error: str
    source: str
    raw: str
    offset: int = -1

    def to_json(self) -> str:
        return json.dumps(self._asdict(), sort_keys=True, ensure_ascii=False)


Parsed = Union[Doc, DeadLetter]


def duplicate_record(doc_id: str, source: str, keeper: str, kind: str) -> str:
    """One JSON line of ``OUT/duplicates/*.jsonl``: the dropped document's id and source, the kept
    id it duplicates (``duplicate_of``) and ``kind`` (``exact`` or ``near``)."""
    return json.dumps({"id": doc_id, "source": source, "duplicate_of": keeper, "kind": kind},
                      sort_keys=True, ensure_ascii=False)


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
    if name.endswith(".parquet"):
        return PARQUET
    return "jsonl" if name.endswith((".jsonl", ".json", ".ndjson")) else "text"


def _excerpt(raw: bytes) -> str:
    return raw[:RAW_EXCERPT_BYTES].decode("utf-8", errors="backslashreplace")


def _parquet_row(path: str, line: int, row: tuple, cfg: InputConfig, dead) -> Parsed:
    body, doc_id, source = row
    stem = file_stem(path)
    if body is None:
        return dead("missing_text", f"column {cfg.text_field!r} is null or absent")
    if not isinstance(body, str):
        return dead("text_not_string", f"column {cfg.text_field!r} is {type(body).__name__}, expected a string")
    if isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)) or doc_id == "":
        doc_id = f"{stem}/{line:08d}"
    return Doc(str(doc_id), body, source if isinstance(source, str) and source else stem)


def parse_unit(path: str, line: int, raw, fmt: str, cfg: InputConfig, offset: int = -1, size: int = 0) -> Parsed:
    """Turn one raw unit into a :class:`Doc` or a :class:`DeadLetter` (never raises).

    JSONL units must be UTF-8 JSON objects with a string ``cfg.text_field``; ids that are
    missing become ``{file stem}/{line:08d}`` (``{file stem}/@{offset}`` when ``line`` is 0,
    i.e. unknown), a missing source becomes the file stem. Text units (paragraphs) get the
    same fallback id. Parquet units carry ``(text, id, source)`` values (``raw`` is that tuple).
    Units of format ``unreadable`` (a read error) and ``too_large`` (``size`` bytes, longer than
    ``cfg.max_record_bytes``; ``raw`` is its head) become dead letters; see :mod:`pipelines.reading`.
    """
    stem = file_stem(path)

    def dead(reason: str, error: str) -> DeadLetter:
        excerpt = _excerpt(raw) if isinstance(raw, bytes) else repr(raw)[:RAW_EXCERPT_BYTES]
        return DeadLetter(path, line, reason, error, stem, excerpt, offset)

    if fmt == UNREADABLE:
        return dead("unreadable_file", f"reading stopped at byte {offset}: {raw.decode('utf-8', 'replace')}")
    if fmt == TOO_LARGE:
        return dead("too_large", f"record of {size} bytes exceeds input.max_record_bytes={cfg.max_record_bytes}")
    if fmt == PARQUET:
        return _parquet_row(path, line, raw, cfg, dead)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return dead("not_utf8", f"invalid UTF-8 at byte {e.start}: {e.reason}")
    fallback_id = f"{stem}/{line:08d}" if line > 0 else f"{stem}/@{offset:012d}"
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
