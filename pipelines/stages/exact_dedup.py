"""Exact dedup: one document per distinct normalised text (:class:`ExactDedup`), after ids made
unique per text (:func:`pipelines.stages.payload.unique_keys`). Keys are
:func:`pipelines.stages.clean.content_hash`; the documents are :class:`~pipelines.stages.keys.DocKey` s
(their text stays in ``OUT/.work/``). The job hands it only the documents of a content hash that
another document has too (:class:`pipelines.stages.payload.Candidates`); it works on any."""
from __future__ import annotations

from typing import NamedTuple

import apache_beam as beam

from pipelines.accounting.stats import EVENTS, event
from pipelines.records import DUPLICATES, DedupOutput, duplicate_record
from pipelines.stages.keys import DocKey

LIST_MAX = 64  # members a combiner accumulator lists before a key counts as a hot key
HOT = "hot"  # tag of the (content hash, keeper id) of each hot key


def key_by_hash(doc: DocKey) -> tuple[str, DocKey]:
    """``(doc.hash, doc)``: the exact-dedup key (the content hash), also the tokenizer sample's order."""
    return doc.hash, doc


class ExactGroup(NamedTuple):
    """The documents of one content hash, as :class:`KeepSmallestId` combines them (its
    accumulator and its output).

    Attributes:
        keeper: the document with the smallest ``(id, split, index)``; ``None`` before the first document.
        counts: documents per source, ``{source: n}``.
        members: ``(id, source)`` of every document, while there are at most ``list_max`` (sorted
            in the output); ``None`` for a hot key.
    """

    keeper: DocKey | None
    counts: dict[str, int]
    members: list[tuple[str, str]] | None


def _smaller(a: DocKey | None, b: DocKey | None) -> DocKey | None:
    """The document with the smaller ``(id, split, index)`` (``None`` loses): the smallest id, and
    among copies under one id the first in input order, whatever the arrival order."""
    if a is None or (b is not None and (b.id, b.split, b.index) < (a.id, a.split, a.index)):
        return b
    return a


class KeepSmallestId(beam.CombineFn):
    """Combine documents sharing a content hash into an :class:`ExactGroup`.

    The keeper is the document with the smallest ``(id, split, index)``, so the choice does not depend
    on arrival order or partitioning. Members are listed while there are at most ``list_max``
    (more make a hot key; :class:`ExactDedup` lists those through a side input instead). The
    accumulator holds one document, one count per source and at most ``list_max`` ids, so memory
    per hash stays bounded however many copies exist.
    """

    def __init__(self, list_max: int = LIST_MAX):
        self.list_max = list_max

    def create_accumulator(self) -> ExactGroup:
        """No document yet: ``ExactGroup(None, {}, [])``."""
        return ExactGroup(None, {}, [])

    def add_input(self, acc: ExactGroup, doc: DocKey) -> ExactGroup:
        """Add one copy: keep the smaller ``(id, split, index)``, count its source, list it while the list is short."""
        counts, members = acc.counts, acc.members
        counts[doc.source] = counts.get(doc.source, 0) + 1
        if members is not None:
            members.append((doc.id, doc.source))
            if len(members) > self.list_max:
                members = None
        return ExactGroup(_smaller(acc.keeper, doc), counts, members)

    def merge_accumulators(self, accumulators) -> ExactGroup:
        """Merge partial results; the member list becomes ``None`` once past ``list_max``."""
        best, counts, members = None, {}, []
        for acc in accumulators:
            best = _smaller(best, acc.keeper)
            for s, n in acc.counts.items():
                counts[s] = counts.get(s, 0) + n
            members = None if acc.members is None or members is None \
                or len(members) + len(acc.members) > self.list_max else members + acc.members
        return ExactGroup(best, counts, members)

    def extract_output(self, acc: ExactGroup) -> ExactGroup:
        """The group, its members sorted (``None`` for a hot key)."""
        return acc._replace(members=None if acc.members is None else sorted(acc.members))


def _emit_keeper(item: tuple[str, ExactGroup], list_duplicates: bool):
    content, group = item
    keeper = group.keeper
    for source, n in sorted(group.counts.items()):
        dups = n - (source == keeper.source)
        if dups:
            yield event(source, "duplicate", dups)
    if list_duplicates and sum(group.counts.values()) > 1:
        if group.members is None:
            yield beam.pvalue.TaggedOutput(HOT, (content, keeper.id))
        for doc_id, source in group.members or ():
            if doc_id != keeper.id:
                yield beam.pvalue.TaggedOutput(DUPLICATES, duplicate_record(doc_id, source, keeper.id, "exact"))
    yield keeper


class DocHash(NamedTuple):
    """One document of a hot key, as :class:`ExactDedup`'s ``hot_docs`` gives it: its content hash
    (hex), id and source."""

    hash: str
    id: str
    source: str


def _list_hot(item: DocHash, hot: dict):
    keeper = hot.get(item.hash)
    if keeper is not None and item.id != keeper:
        yield duplicate_record(item.id, item.source, keeper, "exact")


class ExactDedup(beam.PTransform):
    """``PCollection[DocKey]`` (or ``(content hash, DocKey)`` pairs with ``keyed_input``) →
    :class:`~pipelines.records.DedupOutput`: one :class:`DocKey` per distinct normalised text,
    ``duplicate`` events, and with ``list_duplicates`` one
    :func:`~pipelines.records.duplicate_record` line (kind ``exact``) per dropped copy.

    ``CombinePerKey(KeepSmallestId())`` picks the keeper with a bounded accumulator however
    many copies share a key. A dropped copy names the keeper's id (a copy that has the keeper's
    own id is not listed): keys with at most ``LIST_MAX`` copies are listed from the combiner's
    output; hot keys (more copies) from ``hot_docs``, the :class:`DocHash` of the hot keys'
    documents, read again where they lie (the job reads them from the split records), joined
    with a side input holding only the hot keys' keepers (at most one entry per ``LIST_MAX``
    documents). So no key's copies are ever grouped, and no stream of one object per document
    waits for that side input (the DirectRunner held it whole until the combine was done).

    Args:
        list_duplicates: list the dropped copies.
        keyed_input: the input is ``(content hash, DocKey)`` pairs already.
        hot_docs: with ``list_duplicates``, ``hot_docs(hot)`` is the PCollection of the
            :class:`DocHash` of the documents whose hash is a key of ``hot`` (a side input:
            ``{content hash: keeper id}``, the hot keys); with no hot key it may be empty.
    """

    def __init__(self, list_duplicates: bool = True, keyed_input: bool = False, hot_docs=None):
        super().__init__()
        if list_duplicates and hot_docs is None:
            raise ValueError("ExactDedup(list_duplicates=True) needs hot_docs, the documents of the hot keys")
        self.list_duplicates, self.keyed_input, self.hot_docs = list_duplicates, keyed_input, hot_docs

    def expand(self, docs):
        """Key by content hash (unless ``keyed_input``), keep one document per key, count and list the others:
        a :class:`~pipelines.records.DedupOutput` (not annotated: Beam warns about a return type that is not a PCollection)."""
        keyed = docs if self.keyed_input else docs | "KeyByHash" >> beam.Map(key_by_hash)
        combiner = KeepSmallestId(LIST_MAX if self.list_duplicates else 0)
        out = (keyed
               | "KeepSmallestId" >> beam.CombinePerKey(combiner)
               | "Emit" >> beam.FlatMap(_emit_keeper, self.list_duplicates).with_outputs(
                   EVENTS, DUPLICATES, HOT, main="docs"))
        dups = (out[DUPLICATES],)
        if self.list_duplicates:
            hot = beam.pvalue.AsDict(out[HOT])
            dups += (self.hot_docs(hot) | "ListHot" >> beam.FlatMap(_list_hot, hot),)
        return DedupOutput(docs=out.docs, events=out[EVENTS], duplicates=dups)
