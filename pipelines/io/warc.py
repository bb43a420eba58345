"""Reading WARC files (ISO 28500) into raw units, one per record, parsed with FastWARC.

A ``.warc.gz`` file is a series of gzip members, normally one record each (the standard's
recommendation, and Common Crawl's layout). The members are decompressed here, one at a time,
with ``zlib``, so that

* a member that ends before its end (a truncated download) or holds corrupt data is found and
  named by its byte offset in the file (FastWARC's own gzip reader stops silently there); after a
  corrupt member reading goes on at the next member;
* a large file is read in byte ranges by different workers (:func:`warc_ranges`). A range is read
  from the first member boundary at or after its start (:func:`next_member`: the gzip magic, whose
  data decompresses to ``WARC/``; the file's start for the first range) up to the first boundary
  at or after its end, where the next range begins. So every member is read exactly once, whatever
  the split count, also a member whose header is broken (no boundary, read by the range before).

An uncompressed ``.warc`` (and ``.warc.bz2``/``.warc.zst``) is one split, streamed by FastWARC.

Each record becomes one unit: a response record a ``warc`` unit (a
:class:`~pipelines.records.WarcResponse`), any other record (``warcinfo``, ``request``,
``metadata``, ``revisit``, ...) a ``warc_other`` unit naming its type (no document, counted as
``skipped_records``); a member or record over ``input.max_record_bytes`` a ``too_large`` unit; a
broken member (truncated, corrupt, or holding no valid WARC record) an ``unreadable`` unit naming
its byte offset in the file. An uncompressed file that breaks off (inside a record's block or
header) ends its split with one ``unreadable`` unit naming the byte offset, as other inputs do.
"""
from __future__ import annotations

import io
import zlib
from typing import BinaryIO, Iterator, NamedTuple

from fastwarc.warc import ArchiveIterator, WarcRecord, WarcRecordType

from pipelines.config import InputConfig
from pipelines.records import (RAW_EXCERPT_BYTES, TOO_LARGE, UNREADABLE, WARC, WARC_OTHER, RawUnit, WarcResponse)

GZIP_MAGIC = b"\x1f\x8b\x08"  # ID1, ID2 and CM (deflate) of a gzip member header (RFC 1952)
CHUNK_BYTES = 1 << 20
_PROBE_BYTES = 64 << 10  # compressed bytes read to tell a member boundary from a stray magic


class Member(NamedTuple):
    """One gzip member of a ``.warc.gz`` file.

    Attributes:
        offset: byte offset of the member in the (compressed) file.
        size: compressed bytes of the member (as far as it could be read).
        data: its decompressed bytes; the first 200 when there are more than ``input.max_record_bytes``;
            ``b""`` after an error.
        data_bytes: decompressed bytes of the member (as far as it could be read).
        error: why it could not be read (``""`` when it was).
    """

    offset: int
    size: int
    data: bytes
    data_bytes: int
    error: str = ""


def warc_ranges(path: str, size: int, split_bytes: int) -> list[tuple[int, int]]:
    """Byte ranges ``[start, end)`` of one WARC file (``end`` -1: to the end of the file).

    Args:
        path: the file (``.warc.gz`` is split; any other WARC file is one range).
        size: its size in bytes.
        split_bytes: ``input.split_bytes``.
    Returns:
        ``split_bytes``-long ranges of a larger ``.warc.gz``, else ``[(0, -1)]``.
    """
    if not path.lower().endswith(".gz") or size <= split_bytes:
        return [(0, -1)]
    return [(s, min(s + split_bytes, size)) for s in range(0, size, split_bytes)]


def _is_member(raw: BinaryIO, pos: int) -> bool:
    raw.seek(pos)
    try:
        return zlib.decompressobj(31).decompress(raw.read(_PROBE_BYTES), 8).startswith(b"WARC/")
    except zlib.error:
        return False


def next_member(raw: BinaryIO, pos: int) -> int:
    """Offset of the first gzip member at or after ``pos`` whose data starts a WARC record, or -1.

    A stray ``1f 8b 08`` inside compressed data would also have to decompress to ``WARC/`` to be
    taken for a boundary, which random deflate data does not do.
    """
    while True:
        raw.seek(pos)
        window = raw.read(CHUNK_BYTES + len(GZIP_MAGIC) - 1)
        if len(window) < len(GZIP_MAGIC):
            return -1
        i = window.find(GZIP_MAGIC)
        while i >= 0:
            if _is_member(raw, pos + i):
                return pos + i
            i = window.find(GZIP_MAGIC, i + 1)
        pos += CHUNK_BYTES


def _inflate(raw: BinaryIO, offset: int, buf: bytes, limit: int) -> tuple[Member | None, bytes]:
    """The member at ``offset`` (``buf``: bytes already read from there), and the bytes read past it.

    Returns ``(None, b"")`` at the clean end of the file.
    """
    d = zlib.decompressobj(31)
    parts: list[bytes] = []  # the data; only its first 200 bytes once it exceeds ``limit``
    used = size = 0

    def keep(out: bytes) -> None:
        nonlocal parts, size
        if size <= limit:
            parts = parts + [out] if size + len(out) <= limit else [(b"".join(parts) + out)[:RAW_EXCERPT_BYTES]]
        size += len(out)

    try:
        while not d.eof:
            if not buf:
                buf = raw.read(CHUNK_BYTES)
                if not buf:
                    if used == 0:
                        return None, b""
                    keep(d.flush())
                    if d.eof:
                        break
                    return Member(offset, used, b"", size, f"gzip member at byte {offset:,} ends after {used:,} "
                                                           "bytes, before its end (truncated file)"), b""
            keep(d.decompress(buf, CHUNK_BYTES))
            rest = d.unused_data if d.eof else d.unconsumed_tail
            used, buf = used + len(buf) - len(rest), rest
    except zlib.error as e:
        return Member(offset, used, b"", size, f"gzip member at byte {offset:,} is corrupt: {e}"), b""
    return Member(offset, used, b"".join(parts), size), buf


def gzip_members(raw: BinaryIO, start: int, end: int, limit: int) -> Iterator[Member]:
    """The gzip members of ``raw`` from the first member boundary at or after ``start`` up to the first
    at or after ``end`` (``end`` -1: to the end of the file).

    Args:
        raw: the compressed file, seekable.
        start / end: the byte range (see the module docstring for which members belong to it).
        limit: ``input.max_record_bytes``; of a larger member only the first 200 bytes are kept (it
            is decompressed in 1 MiB steps, never held).
    Returns:
        an iterator of :class:`Member`; after a corrupt or truncated member, reading goes on at the
        next member boundary, if any.
    """
    pos = next_member(raw, start) if start > 0 else 0
    stop = next_member(raw, end) if end >= 0 else -1  # -1: to the end of the file
    if pos < 0:
        return
    raw.seek(pos)
    buf = b""
    while stop < 0 or pos < stop:
        member, buf = _inflate(raw, pos, buf, limit)
        if member is None:
            return
        yield member
        if member.error:  # corrupt: go on at the next member (after a truncated one there is none)
            pos = next_member(raw, pos + 1)
            if pos < 0:
                return
            raw.seek(pos)
            continue
        pos += member.size


def _record_unit(path: str, offset: int, size: int, record: WarcRecord) -> RawUnit:
    if record.record_type != WarcRecordType.response:
        return RawUnit(path, 0, offset, str(record.record_type).encode(), WARC_OTHER, size)
    headers = record.headers
    status = (record.http_headers.status_code or 0) if record.is_http else 0
    response = WarcResponse(headers.get("WARC-Target-URI") or "", headers.get("WARC-Date") or "", status,
                            (record.http_content_type or "").lower() if record.is_http else "",
                            (record.http_charset or "") if record.is_http else "", record.reader.read())
    return RawUnit(path, 0, offset, response, WARC, size)


def _records(stream, path: str, offset: int, size: int) -> Iterator[RawUnit]:
    for record in ArchiveIterator(stream, parse_http=True, auto_decode="all"):
        yield _record_unit(path, offset, size, record)
        size = 0  # a member's size is counted once, by its first record


def _cut_off(path: str, offset: int, what: str) -> RawUnit:
    return RawUnit(path, 0, offset, f"WARC record at byte {offset:,} {what} (truncated file)".encode(), UNREADABLE, 0)


def _plain_units(stream: BinaryIO, path: str, cfg: InputConfig) -> Iterator[RawUnit]:
    """The units of an uncompressed (or wholly compressed) WARC stream, streamed by FastWARC, which
    reads a cut-off record as far as it goes: a record whose block is shorter than its
    ``Content-Length`` (or that has none) ends the split as one ``unreadable`` unit, and so do
    bytes after the last record that hold no record (a header cut off), where the stream can seek."""
    last = None
    for record in ArchiveIterator(stream, parse_http=True, auto_decode="all"):
        if record.content_length > cfg.max_record_bytes:
            unit = RawUnit(path, 0, record.stream_pos, b"", TOO_LARGE, record.content_length)
        else:
            unit = _record_unit(path, record.stream_pos, record.content_length, record)
        record.reader.consume()  # the rest of the block: how much of it the file holds
        # the block's length as stored: ``content_length`` leaves out the HTTP headers once parsed
        stored = record.headers.get("Content-Length") or ""
        if record.reader.tell() < record.content_length or not stored.isdigit():
            yield _cut_off(path, record.stream_pos, "ends before its end")
            return
        yield unit
        last = (record.stream_pos, int(stored))
    if last is None or not stream.seekable():
        return
    size = stream.seek(0, io.SEEK_END)
    stream.seek(last[0])
    head = stream.read(min(size - last[0], 1 << 16))
    body = head.find(b"\r\n\r\n") + 4  # where the last record's block begins
    tail_at = last[0] + body + last[1]
    stream.seek(tail_at)
    tail = stream.read(1 << 16)
    if tail.strip():  # a record follows but FastWARC found no valid header in it
        yield _cut_off(path, tail_at + len(tail) - len(tail.lstrip()), "has a header that ends before its end")


def warc_units(stream: BinaryIO, path: str, start: int, end: int, cfg: InputConfig) -> Iterator[RawUnit]:
    """The :class:`~pipelines.records.RawUnit` s of one range of a WARC file (see the module docstring).

    Args:
        stream: a ``.warc.gz`` file as stored (seekable: read member by member), any other WARC file
            decompressed by its extension.
        path: the file's path or URL.
        start / end: the range (:func:`warc_ranges`).
        cfg: ``input`` settings (``max_record_bytes``).
    Returns:
        an iterator of units; a broken member is one ``unreadable`` unit naming its byte offset.
    """
    if not path.lower().endswith(".gz"):
        yield from _plain_units(stream, path, cfg)
        return
    for member in gzip_members(stream, start, end, cfg.max_record_bytes):
        if member.error:
            yield RawUnit(path, 0, member.offset, member.error.encode(), UNREADABLE, 0)
        elif member.data_bytes > cfg.max_record_bytes:  # the unit's size: the record's, decompressed
            yield RawUnit(path, 0, member.offset, member.data, TOO_LARGE, member.data_bytes)
        else:
            try:
                units, why = list(_records(io.BytesIO(member.data), path, member.offset, member.size)), ""
            except OSError as e:  # FastWARC: an invalid header, a payload whose encoding does not decode
                units, why = [], f": {e}"
            if not units:
                yield RawUnit(path, 0, member.offset, f"gzip member at byte {member.offset:,} holds no valid WARC "
                              f"record{why}".encode(), UNREADABLE, 0)
            yield from units
