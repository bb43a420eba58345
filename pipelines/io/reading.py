"""Reading input files in splits, never whole: byte ranges, Parquet row groups, streamed lines.

A matched file becomes one or more :class:`Split` s (:func:`plan_splits`), which different
workers read (:func:`read_split`) into :class:`~pipelines.records.RawUnit` s:

* uncompressed JSONL: byte ranges of ``input.split_bytes``. A line belongs to the range its
  first byte lies in (the Hadoop ``LineRecordReader`` rule): a reader seeks to ``start - 1``,
  skips to the next newline, and reads lines that start before ``end``. Line numbers are
  exact in the range starting at byte 0; later ranges report byte offsets only (line 0).
* Parquet: groups of consecutive row groups of up to ``input.split_bytes``, read in record
  batches of the text/id/source columns only (pyarrow over Beam's filesystems, so ``gs://``
  and ``s3://`` work).
* compressed files and text (paragraph) files: one split, streamed line by line.
* WARC: ``.warc.gz`` in byte ranges of ``input.split_bytes`` cut at gzip member boundaries, any
  other WARC file one split, one unit per record (:mod:`pipelines.io.warc`).

Each format's planning and reading is one :class:`Reader` in :data:`READERS`.

Lines are read with a length limit (``input.max_record_bytes``); a longer record is skipped
in 1 MiB steps and becomes one ``too_large`` unit, so memory stays bounded by the limit
however long a line is. A read error, or a compressed stream that ends before its end marker
(a truncated download), ends the split with one ``unreadable`` unit naming how far it was read.
A file that cannot be opened in its format at all (``input.format=parquet`` given JSONL) is one
such ``unreadable`` unit too, naming the file and the reader's error.
A file whose format is unknown (:func:`pipelines.records.file_format` is ``None``) has no splits.
"""
from __future__ import annotations

import bz2
import gzip
import io
import re
import sys
import zlib
from typing import BinaryIO, Callable, Iterator, NamedTuple

import zstandard
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from tqdm import tqdm

from colaflow.wording import count
from pipelines.config import InputConfig
from pipelines.io.warc import warc_ranges, warc_units
from pipelines.records import (PARQUET, RAW_EXCERPT_BYTES, TOO_LARGE, UNREADABLE, WARC, ParquetRow, RawUnit,
                               file_format)

CHUNK_BYTES = 1 << 20
_COMPRESSED = (".gz", ".bz2", ".zst")
_BLANK = frozenset(b" \t\r\n")


class Split(NamedTuple):
    """A piece of one input file: bytes ``[start, end)`` (Parquet: row groups ``[start, end)``);
    ``end`` -1 = to the end of the file."""

    path: str
    fmt: str
    start: int
    end: int


def _open(path: str) -> BinaryIO:
    return FileSystems.open(path, mime_type="application/octet-stream",
                            compression_type=CompressionTypes.UNCOMPRESSED)


class ZstdReader(io.RawIOBase):
    """Read-only decompressed view of a zstd stream (RFC 8878) of one or more frames that raises
    ``EOFError`` when the input ends inside a frame, as Python's gzip and bz2 readers do.
    (``zstandard``'s own ``stream_reader`` returns a short stream without a word.)"""

    def __init__(self, raw: BinaryIO):
        super().__init__()
        self._raw, self._dctx = raw, zstandard.ZstdDecompressor()
        self._obj, self._buf, self._in_frame = self._dctx.decompressobj(), b"", False

    def readable(self) -> bool:
        """Always ``True`` (a read-only stream)."""
        return True

    def readinto(self, b) -> int:
        """Fill ``b`` with up to ``len(b)`` decompressed bytes; 0 at the clean end of the stream.

        Raises:
            EOFError: the compressed input ended inside a frame.
            zstandard.ZstdError: corrupt data.
        """
        while not self._buf:
            chunk = self._raw.read(CHUNK_BYTES)
            if not chunk:
                if self._in_frame:
                    raise EOFError("zstd stream ended before the end of its frame (truncated file)")
                return 0
            while chunk:
                self._in_frame = True
                self._buf += self._obj.decompress(chunk)
                chunk = b""
                if self._obj.eof:  # frame complete; the bytes after it start the next frame
                    chunk, self._in_frame = self._obj.unused_data, False
                    self._obj = self._dctx.decompressobj()
        n = min(len(b), len(self._buf))
        b[:n], self._buf = self._buf[:n], self._buf[n:]
        return n


def _decompressed(raw: BinaryIO, path: str) -> BinaryIO:
    """Wrap a raw byte stream in the decompressor its extension names.

    Python's own gzip and bz2 readers (and :class:`ZstdReader`) are used instead of Beam's,
    because Beam's stop silently at a truncated stream while these raise ``EOFError``.
    """
    path = path.lower()  # A.JSONL.GZ is as compressed as a.jsonl.gz
    if path.endswith(".gz"):
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if path.endswith(".bz2"):
        return bz2.BZ2File(raw, mode="rb")
    if path.endswith(".zst"):
        return io.BufferedReader(ZstdReader(raw), CHUNK_BYTES)
    return raw


def _size(path: str) -> int:
    try:
        return FileSystems.match([path])[0].metadata_list[0].size_in_bytes
    except (OSError, IndexError):
        return -1


def _row_groups(path: str, size: int, cfg: InputConfig) -> list[tuple[int, int]]:
    """Parquet: groups of row groups up to ``cfg.split_bytes``; a file that cannot be opened as
    Parquet is one split, which :func:`read_split` dead-letters whole."""
    import pyarrow.parquet as pq

    try:
        with _open(path) as f:
            meta = pq.ParquetFile(f).metadata
    except (OSError, ValueError, EOFError):  # not Parquet (pyarrow's ArrowInvalid is a ValueError)
        return [(0, -1)]  # read_split meets the same error: one unreadable_file dead letter
    ranges, first, acc = [], 0, 0
    for i in range(meta.num_row_groups):
        acc += meta.row_group(i).total_byte_size
        if acc >= cfg.split_bytes:
            ranges.append((first, i + 1))
            first, acc = i + 1, 0
    if first < meta.num_row_groups or not ranges:
        ranges.append((first, meta.num_row_groups))
    return ranges


def _byte_ranges(path: str, size: int, cfg: InputConfig) -> list[tuple[int, int]]:
    """Uncompressed JSONL: byte ranges of ``cfg.split_bytes``; a compressed file is one split."""
    if path.lower().endswith(_COMPRESSED) or size <= cfg.split_bytes:
        return [(0, -1)]
    return [(s, min(s + cfg.split_bytes, size)) for s in range(0, size, cfg.split_bytes)]


def _whole(path: str, size: int, cfg: InputConfig) -> list[tuple[int, int]]:
    """Text: one split, streamed."""
    return [(0, -1)]


def plan_splits(path: str, size: int, cfg: InputConfig) -> list[Split]:
    """Splits of one matched file of ``size`` bytes (its format's :attr:`Reader.plan`; see the module
    docstring for the rules); none for a file of unknown format (``input.unknown_files``). Never
    raises on bad data."""
    fmt = file_format(path, cfg)
    if fmt is None:
        return []
    return [Split(path, fmt, start, end) for start, end in READERS[fmt].plan(path, size, cfg)]


_EOL = re.compile(rb"[\r\n]")


def iter_lines(stream: BinaryIO, limit: int) -> Iterator[tuple[bytes | None, bytes, int]]:
    """Lines of ``stream`` as ``(line or None when longer than limit, head, bytes consumed)``.

    A line ends at ``\\n``, ``\\r\\n`` or a lone ``\\r`` (old Mac text), which ``line`` does not
    include; ``head`` is the first 200 bytes of an over-long line, whose remainder is skipped in
    1 MiB reads without being held, so memory stays within ``limit`` plus one read. Reads return
    what one underlying read gives (``read1``), so the lines before a read error are all yielded.
    """
    read = getattr(stream, "read1", stream.read)
    buf, i, eof = b"", 0, False
    while True:
        m = _EOL.search(buf, i)
        if m is not None and (m.end() < len(buf) or eof or buf[m.start()] == 0x0A):
            j = m.start()
            end = j + 2 if buf[j] == 0x0D and buf[j + 1:j + 2] == b"\n" else j + 1
            if j - i > limit:
                yield None, buf[i:i + RAW_EXCERPT_BYTES], end - i
            else:
                yield buf[i:j], b"", end - i
            i = end
            continue
        if eof:
            if i < len(buf):
                rest = buf[i:]
                yield (None, rest[:RAW_EXCERPT_BYTES], len(rest)) if len(rest) > limit else (rest, b"", len(rest))
            return
        if m is None and len(buf) - i > limit:  # an over-long line: keep its head, stream past the rest
            head, consumed, buf, i = buf[i:i + RAW_EXCERPT_BYTES], len(buf) - i, b"", 0
            while True:
                chunk = read(CHUNK_BYTES)
                if not chunk:
                    eof = True
                    break
                hit = _EOL.search(chunk)
                if hit is None:
                    consumed += len(chunk)
                    continue
                if chunk[hit.start()] == 0x0D and hit.end() == len(chunk):  # a CR last: its LF may follow
                    chunk += read(1)
                stop = hit.start() + (2 if chunk[hit.start():hit.start() + 2] == b"\r\n" else 1)
                consumed, buf = consumed + stop, chunk[stop:]
                break
            yield None, head, consumed
            continue
        chunk = read(CHUNK_BYTES)
        buf, i, eof = buf[i:] + chunk, 0, not chunk


def _jsonl_units(stream, split: Split, cfg: InputConfig):
    pos = split.start
    if pos > 0:
        stream.seek(pos - 1)
    lines = iter_lines(stream, cfg.max_record_bytes)
    if pos > 0:  # the line holding byte start - 1 belongs to the split before (it ends at or after start)
        pos += next(lines, (None, b"", 1))[2] - 1
    line_no = 1 if split.start == 0 else 0
    for line, head, n in lines:
        if 0 <= split.end <= pos:
            return
        if line is None:
            yield RawUnit(split.path, line_no, pos, head, TOO_LARGE, n)
        else:
            yield RawUnit(split.path, line_no, pos, line, split.fmt, n)
        pos += n
        line_no += 1 if line_no else 0


def _text_units(stream, split: Split, cfg: InputConfig):
    """Paragraphs (or ``cfg.separator``-ended units) of a text file, bounded by ``max_record_bytes``."""
    sep = cfg.separator.encode("utf-8")
    lines: list[bytes] = []
    start = offset = pos = size = 0
    too_large = b""

    def flush():
        if too_large:
            return RawUnit(split.path, start, offset, too_large, TOO_LARGE, size)
        return RawUnit(split.path, start, offset, b"\n".join(lines), split.fmt, size)

    for i, (line, head, n) in enumerate(iter_lines(stream, cfg.max_record_bytes), 1):
        boundary = (line == sep) if sep else (line is not None and _BLANK.issuperset(line))
        if boundary:
            if lines or too_large:
                yield flush()
            lines, too_large, size = [], b"", 0
        else:
            if not lines and not too_large:
                start, offset = i, pos
            size += n
            if line is None or size > cfg.max_record_bytes:  # keep the head, drop the rest as it streams by
                too_large = too_large or (b"\n".join(lines) + (line or head))[:RAW_EXCERPT_BYTES]
                lines = []
            elif not too_large:
                lines.append(line)
        pos += n
    if lines or too_large:
        yield flush()


def _parquet_units(raw: BinaryIO, split: Split, cfg: InputConfig):
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(raw)
    names = set(pf.schema_arrow.names)
    wanted = [c for c in (cfg.text_field, cfg.id_field, cfg.source_field) if c in names]
    row = sum(pf.metadata.row_group(i).num_rows for i in range(split.start))
    groups = list(range(split.start, split.end))
    for batch in pf.iter_batches(batch_size=1024, row_groups=groups, columns=wanted):
        cols = batch.to_pydict()
        none = [None] * batch.num_rows
        texts, ids, sources = (cols.get(c, none) for c in (cfg.text_field, cfg.id_field, cfg.source_field))
        for text, doc_id, source in zip(texts, ids, sources):
            row += 1
            yield _parquet_unit(split.path, row, ParquetRow(text, doc_id, source), cfg)


def _parquet_unit(path: str, row: int, values: ParquetRow, cfg: InputConfig) -> RawUnit:
    """One Parquet row's unit: ``too_large`` when its text (a string, or bytes of a column stored as
    binary) is longer than ``cfg.max_record_bytes`` in UTF-8, else the row for :func:`parse_unit`."""
    text = values.text
    if isinstance(text, str):
        size = len(text) if len(text) * 4 <= cfg.max_record_bytes else len(text.encode("utf-8", "surrogatepass"))
        head = text[:RAW_EXCERPT_BYTES].encode("utf-8", "replace")
    elif isinstance(text, bytes):
        size, head = len(text), text[:RAW_EXCERPT_BYTES]
    else:
        size, head = 0, b""
    if size > cfg.max_record_bytes:
        return RawUnit(path, row, -1, head, TOO_LARGE, size)
    return RawUnit(path, row, -1, values, PARQUET, size)


def iter_units(stream: BinaryIO, path: str, fmt: str, cfg: InputConfig) -> Iterator[RawUnit]:
    """The :class:`~pipelines.records.RawUnit` s of a whole (decompressed) JSONL or text stream."""
    split = Split(path, fmt, 0, -1)
    return (_jsonl_units if fmt == "jsonl" else _text_units)(stream, split, cfg)


class Reader(NamedTuple):
    """How one input format is planned and read.

    Attributes:
        plan: ``(path, size, cfg)`` → the file's ``(start, end)`` ranges (bytes, Parquet: row groups).
        read: ``(raw, split, cfg)`` → the split's units, ``raw`` the file as stored.
    """

    plan: Callable[[str, int, InputConfig], list[tuple[int, int]]]
    read: Callable[[BinaryIO, Split, InputConfig], Iterator[RawUnit]]


def _read_warc(raw: BinaryIO, split: Split, cfg: InputConfig) -> Iterator[RawUnit]:
    stream = raw if split.path.lower().endswith(".gz") else _decompressed(raw, split.path)
    return warc_units(stream, split.path, split.start, split.end, cfg)


def _warc_ranges(path: str, size: int, cfg: InputConfig) -> list[tuple[int, int]]:
    return warc_ranges(path, size, cfg.split_bytes)


# every input format (``input.format``, :data:`pipelines.records.FORMATS`) and how it is read
READERS: dict[str, Reader] = {
    "jsonl": Reader(_byte_ranges, lambda raw, split, cfg: _jsonl_units(_decompressed(raw, split.path), split, cfg)),
    "text": Reader(_whole, lambda raw, split, cfg: _text_units(_decompressed(raw, split.path), split, cfg)),
    PARQUET: Reader(_row_groups, _parquet_units),
    WARC: Reader(_warc_ranges, _read_warc),
}


class _Progress:
    """One tqdm bar per worker process and run over input bytes (updated from every reading DoFn).

    Shown on a terminal every second and, in logs (stderr not a terminal), every 15 seconds; closed
    once the run's bytes are all read, so later messages start on a line of their own.
    """

    bar = None
    run_id = None

    @classmethod
    def update(cls, n: int, total: int, run_id: str) -> None:
        if cls.bar is None or cls.run_id != run_id:
            if cls.bar is not None:
                cls.bar.close()
            interactive = sys.stderr.isatty()
            cls.run_id = run_id
            cls.bar = tqdm(desc="read", total=total or None, unit="B", unit_scale=True, leave=interactive,
                           mininterval=1.0 if interactive else 15.0, delay=1.0, file=sys.stderr)
        cls.bar.update(n)
        if total and cls.bar.n >= total:  # all read: end the bar's line before the next stage prints its own
            cls.bar.close()


def read_split(split: Split, cfg: InputConfig, total_bytes: int = 0, run_id: str = "") -> Iterator[RawUnit]:
    """FlatMap body: a :class:`Split` → its :class:`~pipelines.records.RawUnit` s.

    Never raises on bad data: a file that breaks off (truncated or corrupt compression,
    I/O error) ends with one unit of format ``unreadable`` whose bytes say where reading stopped
    (decompressed byte offset, compressed bytes read of the file's size) and the error.
    ``total_bytes`` (all input files) sizes the progress bar of run ``run_id``.
    """
    last_offset, last_line, done = max(split.start, 0), 0, 0
    raw_read = -1  # compressed bytes read when an error stops a compressed file
    try:
        with _open(split.path) as raw:
            units = READERS[split.fmt].read(raw, split, cfg)
            try:
                for i, unit in enumerate(units):
                    last_offset, last_line = unit.offset + unit.size, unit.line
                    yield unit
                    if i % 1024 == 1023:
                        pos = raw.tell() - max(split.start, 0) if split.fmt != PARQUET else 0
                        _Progress.update(pos - done, total_bytes, run_id)
                        done = pos
            except (OSError, EOFError, ValueError, zlib.error, zstandard.ZstdError):
                raw_read = raw.tell()
                raise
            if split.fmt != PARQUET:
                _Progress.update(raw.tell() - max(split.start, 0) - done, total_bytes, run_id)
    except (OSError, EOFError, ValueError, zlib.error, zstandard.ZstdError) as e:  # gzip.BadGzipFile is an OSError
        where = f"reading stopped at {f'row {last_line}' if split.fmt == PARQUET else f'byte {last_offset}'}"
        if split.path.lower().endswith(_COMPRESSED) and raw_read >= 0:
            where += f" of the decompressed data, after {raw_read:,} of {count(_size(split.path), 'compressed byte')}"
        message = f"{where}: {type(e).__name__}: {e}"
        yield RawUnit(split.path, last_line + 1 if last_line else 0, last_offset, message.encode("utf-8"),
                      UNREADABLE, 0)
