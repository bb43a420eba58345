"""Beam transforms of the front half of the pipeline: read, parse, clean, exact dedup.

Every DoFn routes each element to exactly one place (next stage, dead letter, or a
``filtered:<reason>``/``duplicate`` event), which is what keeps ``stats.json`` balanced.
"""
from __future__ import annotations

import uuid

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.io.fileio import EmptyMatchTreatment

from .cleaning import clean_text, content_hash, length_reason
from .config import InputConfig, PipelineConfig
from .language import LanguageFilter
from .pii import redact
from .quality import quality_reason
from .reading import plan_splits, read_split
from .records import DUPLICATES, DeadLetter, Doc, duplicate_record, parse_unit
from .stats import EVENTS, EventTally, event

DEAD = "dead"


class ReadRecords(beam.PTransform):
    """``PBegin`` → units ``(path, line, offset, raw, format, size)`` of every file matching ``glob``.

    Files are planned into splits (:func:`pipelines.reading.plan_splits`), the splits are
    redistributed, and each is read by one worker (:func:`pipelines.reading.read_split`), so a
    large file is read by many workers and never held whole. ``total_bytes`` sizes the progress bar.
    Raises (at run time) ``OSError`` naming the glob when nothing matches.
    """

    def __init__(self, glob: str, cfg: InputConfig, total_bytes: int = 0):
        super().__init__()
        self.glob, self.cfg, self.total_bytes = glob, cfg, total_bytes
        self.run_id = uuid.uuid4().hex  # one progress bar per run, even when runs share a process

    def expand(self, pbegin):
        return (pbegin
                | "Match" >> fileio.MatchFiles(self.glob, EmptyMatchTreatment.DISALLOW)
                | "Plan" >> beam.FlatMap(lambda m, cfg: plan_splits(m.path, m.size_in_bytes, cfg), self.cfg)
                | "Spread" >> beam.Reshuffle()
                | "ReadSplit" >> beam.FlatMap(read_split, self.cfg, self.total_bytes, self.run_id))


class ParseFn(beam.DoFn):
    """Unit → :class:`Doc` (main) or :class:`DeadLetter` (tag ``dead``); ``input``/``dead:*`` events."""

    def __init__(self, cfg: InputConfig):
        self.cfg = cfg

    def start_bundle(self):
        self.tally = EventTally()

    def process(self, unit):
        path, line, offset, raw, fmt, size = unit
        parsed = parse_unit(path, line, raw, fmt, self.cfg, offset, size)
        self.tally.add(parsed.source, "input")
        if isinstance(parsed, DeadLetter):
            self.tally.add(parsed.source, f"dead:{parsed.reason}")
            yield beam.pvalue.TaggedOutput(DEAD, parsed)
        else:
            yield parsed

    def finish_bundle(self):
        yield from self.tally.flush()


class CleanFn(beam.DoFn):
    """:class:`Doc` → cleaned, PII-redacted :class:`Doc`, or a ``filtered:<reason>`` event.

    Order: a length check on the raw text (so a huge document costs no cleaning), Unicode
    repair, normalisation and stripping (``clean_text``), length checks, language
    identification, quality rules, PII redaction (redaction counts as ``redacted:<kind>``
    events; redacted documents are kept).
    """

    def __init__(self, cfg: PipelineConfig):
        self.cfg = cfg

    def setup(self):
        self.lang = LanguageFilter(self.cfg.language)

    def start_bundle(self):
        self.tally = EventTally()

    def process(self, doc: Doc):
        if len(doc.text) > self.cfg.clean.max_chars:
            self.tally.add(doc.source, "filtered:too_long")
            return
        text = clean_text(doc.text, self.cfg.clean)
        reason = (length_reason(text, self.cfg.clean) or self.lang.reason(text)
                  or quality_reason(text, self.cfg.quality))
        if reason:
            self.tally.add(doc.source, f"filtered:{reason}")
            return
        text, redactions = redact(text, self.cfg.pii)
        for kind, n in redactions.items():
            self.tally.add(doc.source, f"redacted:{kind}", n)
        yield Doc(doc.id, text, doc.source)

    def finish_bundle(self):
        yield from self.tally.flush()


def key_by_hash(doc: Doc) -> tuple[str, Doc]:
    """``(content_hash(doc.text), doc)``: the exact-dedup key, also the tokenizer sample's order."""
    return content_hash(doc.text), doc


LIST_MAX = 64  # members a combiner accumulator lists before a key counts as a hot key


class KeepSmallestId(beam.CombineFn):
    """Combine documents sharing a content hash into ``(keeper, {source: count}, members)``.

    The keeper is the document with the smallest ``(id, text)``, so the choice does not depend
    on arrival order or partitioning. ``members`` lists the ``(id, source)`` of every document
    under the key, sorted, while there are at most ``list_max`` of them, else is ``None`` (a hot
    key; :class:`ExactDedup` lists those through a side input instead). The accumulator holds
    one document, one count per source and at most ``list_max`` ids, so memory per hash stays
    bounded however many copies exist.
    """

    def __init__(self, list_max: int = LIST_MAX):
        self.list_max = list_max

    def create_accumulator(self):
        return None, {}, []

    def add_input(self, acc, doc: Doc):
        best, counts, members = acc
        counts[doc.source] = counts.get(doc.source, 0) + 1
        if best is None or (doc.id, doc.text) < (best.id, best.text):
            best = doc
        if members is not None:
            members.append((doc.id, doc.source))
            if len(members) > self.list_max:
                members = None
        return best, counts, members

    def merge_accumulators(self, accumulators):
        best, counts, members = None, {}, []
        for b, c, m in accumulators:
            if b is not None and (best is None or (b.id, b.text) < (best.id, best.text)):
                best = b
            for s, n in c.items():
                counts[s] = counts.get(s, 0) + n
            members = None if m is None or members is None or len(members) + len(m) > self.list_max else members + m
        return best, counts, members

    def extract_output(self, acc):
        best, counts, members = acc
        return best, counts, None if members is None else sorted(members)


def _emit_keeper(item, list_duplicates: bool):
    content, (keeper, counts, members) = item
    for source, n in sorted(counts.items()):
        dups = n - (source == keeper.source)
        if dups:
            yield event(source, "duplicate", dups)
    if list_duplicates and sum(counts.values()) > 1:
        if members is None:
            yield beam.pvalue.TaggedOutput("hot", (content, keeper.id))
        for doc_id, source in members or ():
            if doc_id != keeper.id:
                yield beam.pvalue.TaggedOutput(DUPLICATES, duplicate_record(doc_id, source, keeper.id, "exact"))
    yield keeper


def _list_hot(item, hot: dict):
    content, doc_id, source = item
    keeper = hot.get(content)
    if keeper is not None and doc_id != keeper:
        yield duplicate_record(doc_id, source, keeper, "exact")


class ExactDedup(beam.PTransform):
    """``PCollection[Doc]`` (or ``(content hash, Doc)`` pairs with ``keyed_input``) → one :class:`Doc`
    per distinct normalised text (tag ``events``: ``duplicate``).

    Key = :func:`content_hash`; ``CombinePerKey(KeepSmallestId())`` picks the keeper with a
    bounded accumulator however many copies share a key. With ``list_duplicates`` every dropped
    copy becomes a :func:`pipelines.records.duplicate_record` line on tag ``duplicates`` naming
    the keeper's id (a copy that has the keeper's own id is not listed): keys with at most
    ``LIST_MAX`` copies are listed from the combiner's output; hot keys (more copies) from the
    ``(hash, id, source)`` stream joined with a side input holding only the hot keys' keepers
    (at most one entry per ``LIST_MAX`` documents), so no key's copies are ever grouped.
    """

    def __init__(self, list_duplicates: bool = True, keyed_input: bool = False):
        super().__init__()
        self.list_duplicates, self.keyed_input = list_duplicates, keyed_input

    def expand(self, docs):
        keyed = docs if self.keyed_input else docs | "KeyByHash" >> beam.Map(key_by_hash)
        combiner = KeepSmallestId(LIST_MAX if self.list_duplicates else 0)
        out = (keyed
               | "KeepSmallestId" >> beam.CombinePerKey(combiner)
               | "Emit" >> beam.FlatMap(_emit_keeper, self.list_duplicates).with_outputs(
                   EVENTS, DUPLICATES, "hot", main="docs"))
        dups = out[DUPLICATES]
        if self.list_duplicates:
            hot = (keyed
                   | "Ids" >> beam.MapTuple(lambda h, d: (h, d.id, d.source))
                   | "ListHot" >> beam.FlatMap(_list_hot, beam.pvalue.AsDict(out.hot)))
            dups = (dups, hot) | "AllExact" >> beam.Flatten()
        return {"docs": out.docs, EVENTS: out[EVENTS], DUPLICATES: dups}
