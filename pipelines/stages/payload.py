"""The passes that read the documents back from the split records in ``OUT/.work/``
(:mod:`pipelines.io.resume`), one split at a time, once the global stages have decided on keys
alone: the documents that need a global decision (:class:`Candidates`), the tokenizer sample's
texts (:class:`SampleTexts`) and the final pass (:class:`PayloadFn`: the kept documents of a split
tokenised, split into train and validation, encoded and spilled for the shard writer)."""
from __future__ import annotations

import apache_beam as beam
import numpy as np

from pipelines.config import PipelineConfig
from pipelines.io.frames import PartWriter
from pipelines.io.reading import Split
from pipelines.io.resume import WorkFolder, split_id
from pipelines.records import disambiguate_id
from pipelines.stages.exact_dedup import DocHash
from pipelines.stages.keys import DocKey, RepeatStats, hashes_of, ids_of, record_docs
from pipelines.stages.near_dedup import NearCandidates, NearDoc, band_rows
from pipelines.stages.split import VAL, SplitBatchFn
from pipelines.stages.tokenize import TokenizeFn
from pipelines.stages.tokenizer_sample import SampleLimit, sample_text
from pipelines.stages.write_shards import RUN_FRAME_SAMPLES, SpilledSamples, encode_sample, encoded_size, spill
from shards.tokenizers import TokenizerFile

KEPT = "kept"  # CoGroupByKey tag of a split's kept (index, id) pairs
DROPPED = "dropped"  # CoGroupByKey tag of the indexes of a split's documents near dedup dropped
BANDS = "bands"  # Candidates' tag of a split's BAND_ROW array (near dedup's input)
SPLIT = "split"  # CoGroupByKey tag of the split itself
TOKENIZE_DOCS = 1024  # documents handed to the tokenizer at once (it encodes ENCODE_DOCS at a time)


def _load(work: WorkFolder, split: Split, keys_only: bool = False):
    """``split``'s record as bytes, or with ``keys_only`` its ``(DocKey, signature)`` pairs alone
    (:meth:`~pipelines.io.resume.WorkFolder.load_keys`)."""
    data = work.load_keys(split) if keys_only else work.load(split)
    if data is None:  # Work records every split before any global step can read it
        raise RuntimeError(f"the record of input split {split.path} [{split.start}, {split.end}) is missing from "
                           f"{work.url}; was it deleted during the run?")
    return data


def unique_keys(keys: list[DocKey], stats: RepeatStats) -> list[DocKey]:
    """``keys`` with every id that two texts share (``stats.shared_ids``) made unique
    (:func:`pipelines.records.disambiguate_id`: the id plus its text's hash), so no distinct text is
    dropped for its id and ``duplicates/`` names documents unambiguously.

    Args:
        keys: one split's documents.
        stats: the run's :class:`~pipelines.stages.keys.RepeatStats`.
    Returns:
        the keys, in order, those of shared ids with their new id.
    """
    shared = np.isin(ids_of(keys), stats.shared_ids)
    return [key._replace(id=disambiguate_id(key.id, key.hash)) if s else key for key, s in zip(keys, shared)]


def repeated(keys: list[DocKey], stats: RepeatStats) -> np.ndarray:
    """Whether each of ``keys`` has a content hash that another document has too (bool array)."""
    return np.isin(hashes_of(keys), stats.hashes)


def exact_kept(keys: list[DocKey], stats: RepeatStats, exact: bool, listed) -> np.ndarray:
    """Whether exact dedup keeps each of ``keys`` (bool array): every one without ``exact``, else
    those of a content hash no other document has and those it listed as kept.

    Args:
        keys: one split's documents, in order.
        stats: the run's :class:`~pipelines.stages.keys.RepeatStats`.
        exact: ``dedup.exact``.
        listed: the indexes of the split's documents exact dedup kept (a container: ``in`` is asked).
    Returns:
        bool ``(len(keys),)``.
    """
    if not exact:
        return np.ones(len(keys), bool)
    return np.array([not dup or key.index in listed for key, dup in zip(keys, repeated(keys, stats))], bool)


class Candidates(beam.DoFn):
    """``split`` → ``(content hash, DocKey)`` of each of its documents whose hash another document
    has too (exact dedup's input; without ``exact``, none), ids made unique (:func:`unique_keys`);
    with ``bands``, on tag ``bands``, one :data:`~pipelines.stages.near_dedup.BAND_ROW` array of all
    its documents (:func:`~pipelines.stages.near_dedup.band_rows` of the signatures in its record:
    near dedup's input). A document of a hash no other has is kept as it is, crossing no global
    step but as rows of its split's arrays.

    Args:
        work: the job's work folder.
        exact: ``dedup.exact``.
        bands: ``dedup.bands`` under ``dedup.near``, else 0.
    """

    def __init__(self, work: WorkFolder, exact: bool, bands: int):
        self.work, self.exact, self.bands = work, exact, bands

    def process(self, split: Split, stats: RepeatStats):
        """Yield the documents of ``split`` (read from its record) that a global step decides on."""
        pairs = _load(self.work, split, keys_only=True)
        keys = unique_keys([key for key, _ in pairs], stats)
        if self.exact:
            for key, candidate in zip(keys, repeated(keys, stats)):
                if candidate:
                    yield key.hash, key
        if self.bands and pairs:
            sigs = np.frombuffer(b"".join(sig for _, sig in pairs), dtype=np.uint32).reshape(len(pairs), -1)
            yield beam.pvalue.TaggedOutput(BANDS, band_rows(split_id(split), sigs, hashes_of(keys), self.bands))


class HotDocs(beam.DoFn):
    """``split`` → the :class:`~pipelines.stages.exact_dedup.DocHash` of each of its documents whose
    content hash is a hot key of exact dedup, ids made unique (:func:`unique_keys`), read from its
    record: what :class:`~pipelines.stages.exact_dedup.ExactDedup` lists the hot keys' copies from.
    A run without hot keys reads no record.

    Args:
        work: the job's work folder.
    """

    def __init__(self, work: WorkFolder):
        self.work = work

    def process(self, split: Split, stats: RepeatStats, hot: dict):
        """Yield the hot keys' documents of ``split`` (side inputs: the
        :class:`~pipelines.stages.keys.RepeatStats`, ``hot``: ``{content hash: keeper id}``)."""
        if not hot:
            return
        for key in unique_keys([key for key, _ in _load(self.work, split, keys_only=True)], stats):
            if key.hash in hot:
                yield DocHash(key.hash, key.id, key.source)


class SampleTexts(beam.DoFn):
    """``split`` → ``(content hash, text)`` of each of its kept documents that the sample's
    ``limit`` admits (:func:`pipelines.stages.tokenizer_sample.sample_text`), read from its record.

    Args:
        work: the job's work folder.
    """

    def __init__(self, work: WorkFolder):
        self.work = work

    def process(self, split: Split, limit: SampleLimit, fraction: float):
        """Yield the admitted ``(hash, text)`` pairs of ``split`` (``fraction``: ``tokenizer.sample_fraction``)."""
        docs, keys = record_docs(_load(self.work, split))
        for key, _ in keys:
            yield from sample_text((key.hash, docs[key.index]), limit, fraction)


class NearDocs(beam.DoFn):
    """``(split id, {"split": [Split], "kept": [(index, id), ...]})`` (the split's documents exact dedup
    kept) → the :class:`~pipelines.stages.near_dedup.NearDoc` of each of its documents that
    ``found`` marks as near dedup's candidates, read from its record (keys and signatures only), ids
    made unique (:func:`unique_keys`), exact dedup's duplicates left out. A split without a
    candidate is not read.

    Args:
        work: the job's work folder.
        exact: ``dedup.exact`` (else every candidate goes on).
    """

    def __init__(self, work: WorkFolder, exact: bool):
        self.work, self.exact = work, exact

    def process(self, item, stats: RepeatStats, found: NearCandidates):
        """Yield the candidates of one split (side inputs: the :class:`~pipelines.stages.keys.RepeatStats`,
        the :class:`~pipelines.stages.near_dedup.NearCandidates`)."""
        sid, grouped = item
        (split,) = grouped[SPLIT]
        if not found.any_in(sid):
            return
        pairs = _load(self.work, split, keys_only=True)
        keys = unique_keys([key for key, _ in pairs], stats)
        kept = exact_kept(keys, stats, self.exact, {index for index, _ in grouped[KEPT]})
        for i in np.flatnonzero(found.in_split(sid, len(keys)) & kept):
            key = keys[i]
            yield NearDoc(key.id, key.source, key.split, key.index, pairs[i][1])


def by_split(splits, docs, label: str, dropped=None):
    """The CoGroupByKey of each split (a PCollection of :class:`~pipelines.io.reading.Split`) with
    the ``(index, id)`` of its documents among ``docs`` (:class:`~pipelines.stages.keys.DocKey` s)
    and, given ``dropped`` (:class:`~pipelines.stages.near_dedup.DocPlace` s), the indexes of its
    documents among those (tag ``dropped``), under the steps ``{label}/SplitById``,
    ``{label}/BySplit``, ``{label}/DroppedBySplit`` and ``{label}`` (the join): what
    :class:`NearDocs` and :class:`PayloadFn` read."""
    tagged = {SPLIT: splits | f"{label}/SplitById" >> beam.Map(lambda s: (split_id(s), s)),
              KEPT: docs | f"{label}/BySplit" >> beam.Map(lambda key: (key.split, (key.index, key.id)))}
    if dropped is not None:
        tagged[DROPPED] = dropped | f"{label}/DroppedBySplit" >> beam.Map(lambda place: (place.split, place.index))
    return tagged | label >> beam.CoGroupByKey()


class PayloadFn(beam.DoFn):
    """``(split id, {"split": [Split], "kept": [(index, id), ...], "dropped": [index, ...]})`` → the
    split's kept documents, read from its record: those exact dedup listed (``kept``, under the ids
    it gave them) and every document :class:`Candidates` left out (under its unique id,
    :func:`unique_keys`), less those near dedup dropped (``dropped``); tokenised
    (:class:`~pipelines.stages.tokenize.TokenizeFn`), split into train and validation
    (:class:`~pipelines.stages.split.SplitBatchFn`) and encoded
    (:func:`~pipelines.stages.write_shards.encode_sample`) into one spill file per part: a
    :class:`~pipelines.stages.write_shards.SpilledSamples` on the main output (train) or tag ``val``;
    ``filtered:no_tokens`` events on tag ``events``. Holds one split at a time (``input.split_bytes``).

    Args:
        work: the job's work folder (the records; spill files go to its ``spill`` folder).
        cfg: the job's config (``tokenizer``, ``split.val_fraction``, ``shards.store_text`` and ``layout``,
            ``dedup.exact``).
    """

    def __init__(self, work: WorkFolder, cfg: PipelineConfig):
        self.work, self.store_text, self.layout = work, cfg.shards.store_text, cfg.shards.layout
        self.exact = cfg.dedup.exact
        self.tokenize = TokenizeFn(cfg.tokenizer)
        self.split = SplitBatchFn(cfg.split.val_fraction) if cfg.split.val_fraction > 0 else None

    def setup(self):
        """Set up the tokenizer's DoFn."""
        self.tokenize.setup()

    def teardown(self):
        """Tear down the tokenizer's DoFn."""
        self.tokenize.teardown()

    def start_bundle(self):
        """A fresh event tally."""
        self.tokenize.start_bundle()

    def _kept(self, listed: dict, pairs: list, stats: RepeatStats, dropped: set) -> dict:
        """index → id of the documents exact dedup keeps (:func:`exact_kept`: ``listed``, index → id,
        under its ids, and those no global step decided on), less the indexes ``dropped``."""
        keys = unique_keys([key for key, _ in pairs], stats)
        return {key.index: listed.get(key.index, key.id)
                for key, kept in zip(keys, exact_kept(keys, stats, self.exact, listed))
                if kept and key.index not in dropped}

    def process(self, item, model: TokenizerFile, stats: RepeatStats):
        """Tokenise, split and spill the kept documents of one split (side inputs: ``model``, the
        :class:`~pipelines.stages.keys.RepeatStats`)."""
        _, grouped = item
        (split,) = grouped[SPLIT]
        docs, pairs = record_docs(_load(self.work, split))
        kept = self._kept(dict(grouped[KEPT]), pairs, stats, set(grouped.get(DROPPED, ())))
        chosen = [docs[index]._replace(id=kept[index]) for index in sorted(kept)]
        del docs, pairs  # the split's other documents are not needed past here
        parts = {None: [PartWriter(RUN_FRAME_SAMPLES), 0], VAL: [PartWriter(RUN_FRAME_SAMPLES), 0]}
        for start in range(0, len(chosen), TOKENIZE_DOCS):
            for batch in self.tokenize.process(chosen[start:start + TOKENIZE_DOCS], model):
                for part in self.split.process(batch) if self.split else [batch]:
                    tag = part.tag if isinstance(part, beam.pvalue.TaggedOutput) else None
                    writer = parts[tag]
                    for tokenized in (part.value if tag else part):
                        sample = encode_sample(tokenized, self.store_text, self.layout)
                        writer[0].append(sample)
                        writer[1] += encoded_size(sample, self.layout)
        for tag, (writer, size) in parts.items():
            data = writer.getvalue()
            if data:
                out = SpilledSamples(spill(self.work.spill, data), size)
                yield out if tag is None else beam.pvalue.TaggedOutput(tag, out)

    def finish_bundle(self):
        """Emit the bundle's ``filtered:no_tokens`` counts."""
        yield from self.tokenize.finish_bundle()
