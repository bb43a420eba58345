"""Beam transforms of the front half of the pipeline: read, parse, clean, exact dedup.

Every DoFn routes each element to exactly one place (next stage, dead letter, or a
``filtered:<reason>``/``duplicate`` event), which is what keeps ``stats.json`` balanced.
"""
from __future__ import annotations

import uuid

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.io.fileio import EmptyMatchTreatment

from pipelines.stages.clean import clean_text, content_hash, length_reason
from pipelines.config import InputConfig, PipelineConfig
from pipelines.stages.language import LanguageFilter
from pipelines.stages.pii import redact
from pipelines.stages.quality import quality_reason
from pipelines.io.reading import plan_splits, read_split
from pipelines.records import (DUPLICATES, DeadLetter, Doc, disambiguate_id, duplicate_record, file_format, file_stem,
                      input_root, parse_unit, relative_name)
from pipelines.accounting.stats import EVENTS, EventTally, event

DEAD = "dead"


class ReadRecords(beam.PTransform):
    """``PBegin`` → ``{"units": units, "events": events}``: units ``(path, line, offset, raw, format,
    size)`` of every file matching ``glob``.

    Files are planned into splits (:func:`pipelines.io.reading.plan_splits`), the splits are
    redistributed, and each is read by one worker (:func:`pipelines.io.reading.read_split`), so a
    large file is read by many workers and never held whole. ``total_bytes`` sizes the progress bar.
    A file of unknown format (``input.unknown_files: skip``) is not read; it counts as a
    ``skipped_file`` event of its stem (tag ``events``), and a 0-byte file as an ``empty_file`` event. Raises (at run time) ``OSError`` naming
    the glob when nothing matches.
    """

    def __init__(self, glob: str, cfg: InputConfig, total_bytes: int = 0):
        super().__init__()
        self.glob, self.cfg, self.total_bytes = glob, cfg, total_bytes
        self.run_id = uuid.uuid4().hex  # one progress bar per run, even when runs share a process

    def expand(self, pbegin):
        """Match the glob, plan file splits and read them: returns ``{"units": ..., "events": ...}``
        (raw record units for :class:`ParseFn`, and ``skipped_file`` events of unknown formats and
        ``empty_file`` events of 0-byte files)."""
        planned = (pbegin
                   | "Match" >> fileio.MatchFiles(self.glob, EmptyMatchTreatment.DISALLOW)
                   | "Plan" >> beam.FlatMap(_plan, self.cfg).with_outputs(EVENTS, main="splits"))
        units = (planned.splits
                 | "Spread" >> beam.Reshuffle()
                 | "ReadSplit" >> beam.FlatMap(read_split, self.cfg, self.total_bytes, self.run_id))
        return {"units": units, EVENTS: planned[EVENTS]}


def _plan(match, cfg: InputConfig):
    if file_format(match.path, cfg) is None:
        yield event(file_stem(match.path), "skipped_file")
    elif match.size_in_bytes == 0:  # nothing to read, but the user gave it: counted, not dropped unseen
        yield event(file_stem(match.path), "empty_file")
    else:
        yield from plan_splits(match.path, match.size_in_bytes, cfg)


class ParseFn(beam.DoFn):
    """Unit → :class:`Doc` (main) or :class:`DeadLetter` (tag ``dead``); ``input``/``dead:*`` events.

    Ids are qualified by each file's path relative to the root of ``glob``
    (:func:`pipelines.records.input_root`, :func:`pipelines.records.qualify_id`).
    """

    def __init__(self, cfg: InputConfig, glob: str = ""):
        self.cfg, self.root = cfg, input_root(glob)

    def start_bundle(self):
        """A fresh event tally for the bundle."""
        self.tally = EventTally()

    def process(self, unit):
        """Parse one unit ``(path, line, offset, raw, format, size)`` into a :class:`Doc` with a qualified
        id, or a :class:`DeadLetter` on tag ``dead`` naming the file and position."""
        path, line, offset, raw, fmt, size = unit
        parsed = parse_unit(path, line, raw, fmt, self.cfg, offset, size, relative_name(path, self.root))
        self.tally.add(parsed.source, "input")
        if isinstance(parsed, DeadLetter):
            self.tally.add(parsed.source, f"dead:{parsed.reason}")
            yield beam.pvalue.TaggedOutput(DEAD, parsed)
        else:
            yield parsed

    def finish_bundle(self):
        """Emit the bundle's event counts on tag ``events``."""
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
        """Load the language identifier once per DoFn instance."""
        self.lang = LanguageFilter(self.cfg.language)

    def start_bundle(self):
        """A fresh event tally for the bundle."""
        self.tally = EventTally()

    def process(self, doc: Doc):
        """Clean, filter and redact one :class:`Doc`; yields the cleaned document or nothing (counted as
        ``filtered:<reason>``)."""
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
        """Emit the bundle's event counts on tag ``events``."""
        yield from self.tally.flush()


def key_by_hash(doc: Doc) -> tuple[str, Doc]:
    """``(content_hash(doc.text), doc)``: the exact-dedup key, also the tokenizer sample's order."""
    return content_hash(doc.text), doc


class TwoTexts(beam.CombineFn):
    """Combine the content hashes seen under one id into at most two distinct ones (bounded
    memory however often an id repeats): two means different texts share the id."""

    def create_accumulator(self):
        """No hash seen yet: an empty tuple."""
        return ()

    def add_input(self, acc, text_hash: str):
        """Add one content hash (hex str); keeps at most two distinct hashes, sorted."""
        return acc if text_hash in acc or len(acc) == 2 else tuple(sorted(acc + (text_hash,)))

    def merge_accumulators(self, accumulators):
        """Union of partial results, still at most two distinct hashes."""
        merged: tuple = ()
        for acc in accumulators:
            for h in acc:
                merged = self.add_input(merged, h)
        return merged

    def extract_output(self, acc):
        """The tuple of at most two distinct hashes seen under the id."""
        return acc


def _disambiguate(pair: tuple[str, Doc], shared: dict):
    text_hash, doc = pair
    if doc.id in shared:
        doc = Doc(disambiguate_id(doc.id, text_hash), doc.text, doc.source)
    return text_hash, doc


class UniqueIds(beam.PTransform):
    """``(content hash, Doc)`` pairs → the same pairs with every id naming one text.

    Qualified ids (:func:`pipelines.records.qualify_id`) collide only when one file repeats an
    id with different texts; every document under such an id gets
    :func:`pipelines.records.disambiguate_id` (the id plus its text's hash), so no distinct text
    is dropped for its id and ``duplicates/`` names documents unambiguously. Cost: one combine of
    ``(id, hash)`` pairs (:class:`TwoTexts`); the side input holds only the colliding ids.
    Copies of one text under one id stay as they are (exact dedup keeps one).
    """

    def expand(self, hashed):
        """``(hash, Doc)`` pairs → the same pairs, with ids that several different texts share in one file
        made unique by :func:`pipelines.records.disambiguate_id`."""
        shared = (hashed
                  | "IdHash" >> beam.MapTuple(lambda h, d: (d.id, h))
                  | "TwoTexts" >> beam.CombinePerKey(TwoTexts())
                  | "Shared" >> beam.Filter(lambda kv: len(kv[1]) == 2))
        return hashed | "Disambiguate" >> beam.Map(_disambiguate, beam.pvalue.AsDict(shared))


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
        """``(keeper Doc or None, {source: copies}, [(id, source), ...] or None)``."""
        return None, {}, []

    def add_input(self, acc, doc: Doc):
        """Add one copy: keep the smaller ``(id, text)``, count its source, list it while the list is short."""
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
        """Merge partial results; the member list becomes ``None`` once past ``list_max``."""
        best, counts, members = None, {}, []
        for b, c, m in accumulators:
            if b is not None and (best is None or (b.id, b.text) < (best.id, best.text)):
                best = b
            for s, n in c.items():
                counts[s] = counts.get(s, 0) + n
            members = None if m is None or members is None or len(members) + len(m) > self.list_max else members + m
        return best, counts, members

    def extract_output(self, acc):
        """``(keeper, counts per source, sorted members or None for a hot key)``."""
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


IDS = "ids"  # ExactDedup's stream of (content hash, id, source), one per document


def _with_ids(pair: tuple[str, Doc]):
    text_hash, doc = pair
    yield beam.pvalue.TaggedOutput(IDS, (text_hash, doc.id, doc.source))
    yield pair


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
        """``Doc`` (or ``(hash, Doc)`` when ``keyed_input``) → ``{"docs", "events", "duplicates"}``: one
        keeper per distinct text, ``duplicate:*`` events, and one duplicate line per dropped copy."""
        keyed = docs if self.keyed_input else docs | "KeyByHash" >> beam.Map(key_by_hash)
        if self.list_duplicates:
            # the ids for ListHot are a second output of the combine's own input step, so a runner
            # that materialises steps (Dask) never keeps the documents until ListHot's side input is ready
            split = keyed | "Ids" >> beam.FlatMap(_with_ids).with_outputs(IDS, main="docs")
            keyed, ids = split.docs, split[IDS]
        combiner = KeepSmallestId(LIST_MAX if self.list_duplicates else 0)
        out = (keyed
               | "KeepSmallestId" >> beam.CombinePerKey(combiner)
               | "Emit" >> beam.FlatMap(_emit_keeper, self.list_duplicates).with_outputs(
                   EVENTS, DUPLICATES, "hot", main="docs"))
        dups = out[DUPLICATES]
        if self.list_duplicates:
            hot = (ids
                   | "ListHot" >> beam.FlatMap(_list_hot, beam.pvalue.AsDict(out.hot)))
            dups = (dups, hot) | "AllExact" >> beam.Flatten()
        return {"docs": out.docs, EVENTS: out[EVENTS], DUPLICATES: dups}
