"""The records (and stage outputs) that pass between the pipeline's stages, and parsing a raw unit into a document.

Parsing never raises on bad input: every :class:`RawUnit` becomes exactly one :class:`Doc` or
:class:`DeadLetter` (:func:`parse_unit`). Ids are unique in a run by construction
(:func:`qualify_id`); the one collision left, an id repeated inside one file with different
texts, is resolved after cleaning (:func:`disambiguate_id`).
"""
from __future__ import annotations

import json
import os
import re
from typing import TYPE_CHECKING, NamedTuple, Union

from pipelines.config import InputConfig

if TYPE_CHECKING:
    import apache_beam as beam
    import numpy as np

RAW_EXCERPT_BYTES = 200
UNREADABLE = "unreadable"  # unit format of a read error: the unit's bytes are the error message
TOO_LARGE = "too_large"  # unit format of a skipped over-long record: the unit's bytes are its head
PARQUET = "parquet"  # unit format of a Parquet row: the payload is (text, id, source) as read
WARC = "warc"  # unit format of a WARC response record: the payload is a WarcResponse
WARC_OTHER = "warc_other"  # unit format of a WARC record that is no document: the unit's bytes are its type
DUPLICATES = "duplicates"  # tag of the duplicate_record lines written to OUT/duplicates/
UNREADABLE_FILE = "unreadable_file"  # dead-letter reason of a file read stopped (or could not start)
BLANK_LINE = "blank_line"  # dead-letter reason of a blank JSONL line (counted, but no record)
_COMPRESSED = (".gz", ".bz2", ".zst")
UTF8_BOM = b"\xef\xbb\xbf"
# by extension, in ``input.format: auto``; anything else is an unknown file (``input.unknown_files``)
FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".txt": "text", ".text": "text", ".parquet": PARQUET,
           ".warc": WARC}


class ParquetRow(NamedTuple):
    """The payload of a Parquet unit: the row's text, id and source columns as read (``None`` for
    a column the file lacks; any type, checked by :func:`parse_unit`)."""

    text: object
    id: object
    source: object


class WarcResponse(NamedTuple):
    """The payload of a WARC unit: one response record as read (:mod:`pipelines.io.warc`).

    Attributes:
        url: ``WARC-Target-URI``.
        date: ``WARC-Date`` as written (ISO 8601, e.g. ``2024-03-01T12:00:00Z``).
        status: HTTP status code (0 when the record holds no HTTP status line).
        content_type: HTTP ``Content-Type`` media type, lower case, without parameters ("" when absent).
        charset: the ``charset`` parameter of the HTTP ``Content-Type`` ("" when absent).
        body: the HTTP payload (transfer and content encodings undone).
    """

    url: str
    date: str
    status: int
    content_type: str
    charset: str
    body: bytes


class RawUnit(NamedTuple):
    """One input record as read (:func:`pipelines.io.reading.read_split`), before parsing.

    Attributes:
        path: input path or URL.
        line: 1-based line number of the unit's first line (Parquet: row number); 0 when unknown
            (a unit of a byte-range split that does not start the file).
        offset: byte offset of the unit in the (decompressed) file; -1 for Parquet rows.
        raw: the unit's bytes (a JSONL line without its newline, a text paragraph); a
            :class:`ParquetRow` for format ``parquet``; a :class:`WarcResponse` for ``warc``; the
            record type (``request``, ...) for ``warc_other``; the head of the record for ``too_large``;
            the error message (UTF-8) for ``unreadable``.
        fmt: ``jsonl``, ``text``, ``parquet``, ``warc``, ``warc_other``, or :data:`TOO_LARGE` /
            :data:`UNREADABLE`.
        size: bytes the unit took in the file (newline included; a ``.warc.gz`` record: its gzip
            member), 0 for ``unreadable``.
    """

    path: str
    line: int
    offset: int
    raw: Union[bytes, ParquetRow, WarcResponse]
    fmt: str
    size: int


class DocMeta(NamedTuple):
    """What a document carries besides its text, written into its sample's metadata (fields left
    ``None`` are not written).

    Attributes:
        url: a web page's URL (``WARC-Target-URI``).
        date: its crawl date (``WARC-Date``, ISO 8601).
        language: ISO 639-1 code of the extracted text (py3langid).
        quality_score: the quality classifier's probability of ``classifier.label``, in [0, 1].
    """

    url: str | None = None
    date: str | None = None
    language: str | None = None
    quality_score: float | None = None

    def fields(self) -> dict:
        """The fields that are set, as a JSON-able dict."""
        return {k: v for k, v in self._asdict().items() if v is not None}


class Doc(NamedTuple):
    """A parsed document. ``text`` is a Python ``str``; ``source`` names the corpus it came from;
    ``meta`` holds what a step learnt of it (a web page's origin, a quality score; ``None``: nothing)."""

    id: str
    text: str
    source: str
    meta: DocMeta | None = None


class Filtered(NamedTuple):
    """An input record read but not made a document (a WARC response that is no HTML page, an HTTP
    error, a page without text): counted as ``filtered:<reason>`` of ``source``."""

    source: str
    reason: str


class TokenizedDoc(NamedTuple):
    """A kept document and its tokens (:class:`pipelines.stages.tokenize.TokenizeFn`).

    Attributes:
        doc: the document.
        tokens: 1-D ``uint16`` array (``uint32`` when the vocabulary exceeds 65,536), at least one token.
    """

    doc: Doc
    tokens: "np.ndarray"


class DedupOutput(NamedTuple):
    """The outputs of exact dedup (:class:`pipelines.stages.exact_dedup.ExactDedup`; near dedup's are
    :class:`pipelines.stages.near_dedup.NearOutput`), each a ``PCollection``.

    Attributes:
        docs: the documents kept (:class:`~pipelines.stages.keys.DocKey` s).
        events: ``((source, name), n)`` events (``duplicate``).
        duplicates: a tuple of PCollections of one :func:`duplicate_record` JSON line per dropped
            document, left apart so that :class:`pipelines.io.output.WriteJsonl` spills each one's lines
            in the stage that makes them (a Flatten of them was held whole by the DirectRunner).
    """

    docs: "beam.PCollection"
    events: "beam.PCollection"
    duplicates: "beam.PCollection"


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
        """One JSON line (UTF-8 text kept readable; ``\\u`` escapes only when the error quotes a
        lone surrogate, which UTF-8 cannot hold)."""
        line = json.dumps(self._asdict(), sort_keys=True, ensure_ascii=False)
        try:
            line.encode("utf-8")
        except UnicodeEncodeError:
            line = json.dumps(self._asdict(), sort_keys=True)
        return line


Parsed = Union[Doc, DeadLetter, Filtered]


def duplicate_record(doc_id: str, source: str, keeper: str, kind: str) -> str:
    """One JSON line of ``OUT/duplicates/*.jsonl``: the dropped document's id and source, the kept
    id it duplicates (``duplicate_of``) and ``kind`` (``exact`` or ``near``)."""
    return json.dumps({"id": doc_id, "source": source, "duplicate_of": keeper, "kind": kind},
                      sort_keys=True, ensure_ascii=False)


def file_stem(path: str) -> str:
    """``data/shakespeare.jsonl.gz`` → ``shakespeare`` (compression and format suffixes removed)."""
    name = path.rstrip("/").rsplit("/", 1)[-1]
    for suffix in _COMPRESSED:
        if name.lower().endswith(suffix):  # A.JSONL.GZ too, as file_format reads it
            name = name[: -len(suffix)]
    return os.path.splitext(name)[0] or name


def file_format(path: str, cfg: InputConfig) -> str | None:
    """``jsonl``, ``text``, ``parquet`` or ``warc`` for ``path`` under ``cfg.format``, or ``None``
    for a file to skip.

    ``auto`` looks at the extension under any ``.gz``/``.bz2``/``.zst``: ``.jsonl``/``.ndjson``
    → jsonl, ``.txt``/``.text`` → text, ``.parquet``, ``.warc`` (:data:`FORMATS`). Any other file
    (``README.md``, ``.csv``, ``.json``: usually one JSON document, not JSON Lines) follows
    ``cfg.unknown_files``: ``skip`` → ``None``, ``text`` → read as text, ``error`` → ``None`` too (the driver refuses such a
    run before it starts, see :func:`pipelines.job.run`).
    """
    if cfg.format != "auto":
        return cfg.format
    name = path.rsplit("/", 1)[-1].lower()
    for suffix in _COMPRESSED:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    ext = os.path.splitext(name)[1]
    if ext in FORMATS:
        return FORMATS[ext]
    return "text" if cfg.unknown_files == "text" else None


def input_root(pattern: str) -> str:
    """The folder a glob's matches are named relative to: the pattern up to its first wildcard
    (``*``, ``?``, ``[``), cut at the last ``/``; for a plain path, its folder.
    ``data/in/**/*.jsonl`` → ``data/in``; ``s3://b/x/a.jsonl`` → ``s3://b/x``."""
    head = re.split(r"[*?\[]", pattern, maxsplit=1)[0]
    return head.rsplit("/", 1)[0] if "/" in head else ""


def relative_name(path: str, root: str) -> str:
    """``path`` relative to ``root`` (see :func:`input_root`); local paths are compared absolute,
    so a relative glob and Beam's absolute matches agree. Falls back to the file name."""
    pairs = [(path, root)]
    if "://" not in path:
        pairs.append((os.path.abspath(path), os.path.abspath(root or ".")))
    for p, r in pairs:
        r = r.rstrip("/")
        if r and p.startswith(r + "/"):
            return p[len(r) + 1:]
    return path.rstrip("/").rsplit("/", 1)[-1]


def _escape(part: str) -> str:
    return part.replace("%", "%25").replace("#", "%23")


def qualify_id(name: str, doc_id: str | None, position: str = "") -> str:
    """A document id unique in the run: ``{name}/{doc_id}``, or ``{name}#{position}`` without an id.

    ``name`` is the file's path relative to the input root (:func:`relative_name`). ``%`` and
    ``#`` in ``name`` and ``doc_id`` are percent-escaped, so ``#`` only ever separates a position
    or a disambiguator. Unique by construction: a file name never contains ``/``, so no file path
    plus ``/`` is a prefix of another file's path, and positions are unique within a file.
    """
    if doc_id is None:
        return f"{_escape(name)}#{position}"
    return f"{_escape(name)}/{_escape(doc_id)}"


def disambiguate_id(doc_id: str, text_hash: str) -> str:
    """``{doc_id}#{first 16 hex of the content hash}``: the id of a document whose qualified id is
    shared by a different text of the same file (its own id escapes ``#``, so this never collides)."""
    return f"{doc_id}#{text_hash[:16]}"


def _excerpt(raw: bytes) -> str:
    return raw[:RAW_EXCERPT_BYTES].decode("utf-8", errors="backslashreplace")


def _bad_unicode(fields: dict) -> str | None:
    """Name of the first field holding a lone surrogate (JSON ``"\\udc80"``), which no UTF-8
    writer can encode, or ``None``."""
    for name, value in fields.items():
        if isinstance(value, str) and not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return name
    return None


def _doc(body, doc_id, source, stem: str, name: str, position: str, cfg: InputConfig, dead) -> Parsed:
    if body is None:
        return dead("missing_text", f"no {cfg.text_field!r} field or column, or it is null")
    if not isinstance(body, str):
        return dead("text_not_string", f"{cfg.text_field!r} is {type(body).__name__}, expected a string")
    has_id = not isinstance(doc_id, bool) and isinstance(doc_id, (str, int)) and doc_id != ""
    source = source if isinstance(source, str) and source else stem
    bad = _bad_unicode({cfg.text_field: body, cfg.id_field: doc_id if has_id else None, cfg.source_field: source})
    if bad:
        return dead("lone_surrogate", f"{bad!r} holds an unpaired UTF-16 surrogate (not encodable as UTF-8)")
    return Doc(qualify_id(name, str(doc_id) if has_id else None, position), body, source)


def parse_unit(path: str, line: int, raw, fmt: str, cfg: InputConfig, offset: int = -1, size: int = 0,
               name: str | None = None) -> Parsed:
    """Turn the fields of one :class:`RawUnit` into a :class:`Doc` or a :class:`DeadLetter` (never raises).

    JSONL units must be UTF-8 JSON objects with a string ``cfg.text_field`` (a UTF-8 BOM at the
    start of a file is dropped). Ids are qualified by ``name``, the file's path relative to the
    input root (default: the file name), with :func:`qualify_id`: ``{name}/{id}``, or without an
    id ``{name}#{line:08d}`` (``{name}#@{offset:012d}`` when ``line`` is 0, i.e. unknown); a
    missing source becomes the file stem. Text units (paragraphs) get the position id. Parquet
    units carry a :class:`ParquetRow` (``raw``; the row number is the line); a binary column's bytes
    are decoded as UTF-8 (``not_utf8`` when they are not).
    Units of format ``unreadable`` (a read error) and ``too_large`` (``size`` bytes, longer than
    ``cfg.max_record_bytes``; ``raw`` is its head) become dead letters; see :mod:`pipelines.io.reading`.
    A lone surrogate in the text, id or source makes a ``lone_surrogate`` dead letter.
    """
    stem = file_stem(path)
    name = name or path.rstrip("/").rsplit("/", 1)[-1]
    position = f"{line:08d}" if line > 0 else f"@{offset:012d}"

    def dead(reason: str, error: str) -> DeadLetter:
        # a Parquet row's excerpt is the repr of its values as a plain tuple, as dead letters always showed it
        excerpt = _excerpt(raw) if isinstance(raw, bytes) else repr(tuple(raw))[:RAW_EXCERPT_BYTES]
        return DeadLetter(path, line, reason, error, stem, excerpt, offset)

    if fmt == UNREADABLE:
        return dead(UNREADABLE_FILE, raw.decode("utf-8", "replace"))
    if fmt == TOO_LARGE:
        return dead("too_large", f"record of {size} bytes exceeds input.max_record_bytes={cfg.max_record_bytes}")
    if fmt == PARQUET:  # a string column stored as binary holds UTF-8 bytes
        values = []
        for column, value in zip((cfg.text_field, cfg.id_field, cfg.source_field), raw):
            try:
                values.append(value.decode("utf-8") if isinstance(value, bytes) else value)
            except UnicodeDecodeError as e:
                return dead("not_utf8", f"column {column!r} (binary) is not UTF-8 at byte {e.start}: {e.reason}")
        return _doc(*values, stem, name, position, cfg, dead)
    if offset == 0 and raw.startswith(UTF8_BOM):
        raw = raw[len(UTF8_BOM):]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return dead("not_utf8", f"invalid UTF-8 at byte {e.start}: {e.reason}")
    if fmt == "text":
        return _doc(text, None, None, stem, name, position, cfg, dead)
    if not text.strip():
        return dead(BLANK_LINE, "blank line in JSONL input")
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        return dead("bad_json", f"not JSON: {e}")
    if not isinstance(obj, dict):
        return dead("not_object", f"JSON {type(obj).__name__}, expected an object")
    if cfg.text_field in obj and obj[cfg.text_field] is None:
        return dead("missing_text", f"{cfg.text_field!r} is null")
    if cfg.text_field not in obj:
        return dead("missing_text", f"no {cfg.text_field!r} field (fields: {', '.join(sorted(obj))[:100]})")
    return _doc(obj.get(cfg.text_field), obj.get(cfg.id_field), obj.get(cfg.source_field), stem, name, position,
                cfg, dead)
