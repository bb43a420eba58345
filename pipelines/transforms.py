"""Beam transforms of the front half of the pipeline: read, parse, clean, exact dedup.

Every DoFn routes each element to exactly one place (next stage, dead letter, or a
``filtered:<reason>``/``duplicate`` event), which is what keeps ``stats.json`` balanced.
"""
from __future__ import annotations

import bz2
import gzip
import io
import zlib

import apache_beam as beam
import zstandard
from apache_beam.io import fileio
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.fileio import EmptyMatchTreatment
from tqdm import tqdm

from .cleaning import clean_text, content_hash, length_reason
from .config import InputConfig, PipelineConfig
from .pii import redact
from .quality import quality_reason
from .records import UNREADABLE, DeadLetter, Doc, file_format, file_stem, iter_units, parse_unit
from .stats import EVENTS, event

DEAD = "dead"


def _decompressed(raw, path: str):
    """Wrap a raw byte stream in the decompressor its extension names.

    Python's own gzip and bz2 readers are used instead of Beam's, because Beam's stop silently
    at a truncated stream while these raise ``EOFError``. (zstd truncation is not detected; the
    cut last line is still dead-lettered as ``bad_json``.)
    """
    if path.endswith(".gz"):
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if path.endswith(".bz2"):
        return bz2.BZ2File(raw, mode="rb")
    if path.endswith(".zst"):
        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True))
    return raw


def read_units(readable: fileio.ReadableFile, cfg: InputConfig):
    """FlatMap body: a matched file → ``(path, line, raw bytes, format)`` per record unit.

    Files are opened through Beam's filesystems (local, ``gs://``, ``s3://``, ``hdfs://``);
    ``.gz``, ``.bz2`` and ``.zst`` are decompressed by extension (:func:`_decompressed`). A file
    that breaks off (truncated or corrupt compression, I/O error) ends with one unit of
    format ``unreadable`` whose bytes are the error, so it is dead-lettered, not fatal.
    """
    path = readable.metadata.path
    fmt = file_format(path, cfg)
    last = 0
    bar = tqdm(desc=f"read {file_stem(path)}", unit=" rec", mininterval=2.0, leave=False, delay=2.0,
                   disable=None)  # no bar when stderr is not a terminal
    try:
        with readable.open(mime_type="application/octet-stream",
                           compression_type=CompressionTypes.UNCOMPRESSED) as raw_stream:
            for last, raw in iter_units(_decompressed(raw_stream, path), fmt):
                bar.update()
                yield path, last, raw, fmt
    except (OSError, EOFError, ValueError, zlib.error, zstandard.ZstdError) as e:  # gzip.BadGzipFile is an OSError
        yield path, last + 1, f"{type(e).__name__}: {e}".encode("utf-8"), UNREADABLE
    finally:
        bar.close()


class ReadRecords(beam.PTransform):
    """``PBegin`` → ``(path, line, raw bytes, format)`` units of every file matching ``glob``, redistributed.

    Raises (at run time) ``OSError`` naming the glob when nothing matches.
    """

    def __init__(self, glob: str, cfg: InputConfig):
        super().__init__()
        self.glob, self.cfg = glob, cfg

    def expand(self, pbegin):
        return (pbegin
                | "Match" >> fileio.MatchFiles(self.glob, EmptyMatchTreatment.DISALLOW)
                | "Open" >> fileio.ReadMatches()
                | "Split" >> beam.FlatMap(read_units, self.cfg)
                | "Spread" >> beam.Reshuffle())


class ParseFn(beam.DoFn):
    """Unit → :class:`Doc` (main) or :class:`DeadLetter` (tag ``dead``); ``input``/``dead:*`` events."""

    def __init__(self, cfg: InputConfig):
        self.cfg = cfg

    def process(self, unit):
        path, line, raw, fmt = unit
        parsed = parse_unit(path, line, raw, fmt, self.cfg)
        yield event(parsed.source, "input")
        if isinstance(parsed, DeadLetter):
            yield event(parsed.source, f"dead:{parsed.reason}")
            yield beam.pvalue.TaggedOutput(DEAD, parsed)
        else:
            yield parsed


class CleanFn(beam.DoFn):
    """:class:`Doc` → cleaned, PII-redacted :class:`Doc`, or a ``filtered:<reason>`` event.

    Order: normalise and strip (``clean_text``), length checks, quality rules, PII redaction
    (redaction counts as ``redacted:<kind>`` events; redacted documents are kept).
    """

    def __init__(self, cfg: PipelineConfig):
        self.cfg = cfg

    def process(self, doc: Doc):
        text = clean_text(doc.text, self.cfg.clean)
        reason = length_reason(text, self.cfg.clean) or quality_reason(text, self.cfg.quality)
        if reason:
            yield event(doc.source, f"filtered:{reason}")
            return
        text, redactions = redact(text, self.cfg.pii)
        for kind, n in redactions.items():
            yield event(doc.source, f"redacted:{kind}", n)
        yield Doc(doc.id, text, doc.source)


class KeepSmallestId(beam.CombineFn):
    """Combine documents sharing a content hash into ``(keeper, {source: count})``.

    The keeper is the document with the smallest ``(id, text)``, so the choice does not depend
    on arrival order or partitioning; the accumulator holds one document and one count per
    source, so memory per hash stays bounded however many copies exist.
    """

    def create_accumulator(self):
        return None, {}

    def add_input(self, acc, doc: Doc):
        best, counts = acc
        counts[doc.source] = counts.get(doc.source, 0) + 1
        if best is None or (doc.id, doc.text) < (best.id, best.text):
            best = doc
        return best, counts

    def merge_accumulators(self, accumulators):
        best, counts = None, {}
        for b, c in accumulators:
            if b is not None and (best is None or (b.id, b.text) < (best.id, best.text)):
                best = b
            for s, n in c.items():
                counts[s] = counts.get(s, 0) + n
        return best, counts

    def extract_output(self, acc):
        return acc


def _emit_keeper(item):
    _, (keeper, counts) = item
    for source, n in sorted(counts.items()):
        dups = n - (source == keeper.source)
        if dups:
            yield event(source, "duplicate", dups)
    yield keeper


class ExactDedup(beam.PTransform):
    """``PCollection[Doc]`` → one :class:`Doc` per distinct normalised text (tag ``events``: ``duplicate``).

    Key = :func:`content_hash`; ``CombinePerKey(KeepSmallestId())`` picks the keeper.
    """

    def expand(self, docs):
        return (docs
                | "KeyByHash" >> beam.Map(lambda d: (content_hash(d.text), d))
                | "KeepSmallestId" >> beam.CombinePerKey(KeepSmallestId())
                | "Emit" >> beam.FlatMap(_emit_keeper).with_outputs(EVENTS, main="docs"))
