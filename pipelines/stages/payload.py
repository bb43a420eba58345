"""The passes that read the documents' text back from the split records in ``OUT/.work/``
(:mod:`pipelines.io.resume`), one split at a time, once the global stages have decided on keys
alone: the tokenizer sample's texts (:class:`SampleTexts`) and the final pass (:class:`PayloadFn`:
the kept documents of a split tokenised, split into train and validation, encoded and spilled for
the shard writer)."""
from __future__ import annotations

import apache_beam as beam

from pipelines.config import PipelineConfig
from pipelines.io.frames import PartWriter
from pipelines.io.reading import Split
from pipelines.io.resume import WorkFolder, split_id
from pipelines.stages.keys import record_docs
from pipelines.stages.split import VAL, SplitBatchFn
from pipelines.stages.tokenize import TokenizeFn
from pipelines.stages.tokenizer_sample import SampleLimit, sample_text
from pipelines.stages.write_shards import RUN_FRAME_SAMPLES, SpilledSamples, encode_sample, encoded_size, spill
from shards.tokenizers import TokenizerFile

KEPT = "kept"  # CoGroupByKey tag of a split's kept (index, id) pairs
SPLIT = "split"  # CoGroupByKey tag of the split itself
TOKENIZE_DOCS = 1024  # documents handed to the tokenizer at once (it encodes ENCODE_DOCS at a time)


def _load(work: WorkFolder, split: Split) -> bytes:
    data = work.load(split)
    if data is None:  # Work records every split before any global step can read it
        raise RuntimeError(f"the record of input split {split.path} [{split.start}, {split.end}) is missing from "
                           f"{work.url}; was it deleted during the run?")
    return data


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


class SplitSignatures(beam.DoFn):
    """``(split id, {"split": [Split], "kept": [(index, id), ...]})`` → ``(id, MinHash signature)``
    of each listed document, read from the split's record (computed by Work): near dedup's input,
    so the signatures cross no other global step.

    Args:
        work: the job's work folder.
    """

    def __init__(self, work: WorkFolder):
        self.work = work

    def process(self, item):
        """Yield ``(id, signature bytes)`` of the listed documents of one split."""
        _, grouped = item
        kept = list(grouped[KEPT])
        if not kept:
            return
        (split,) = grouped[SPLIT]
        _, keys = record_docs(_load(self.work, split))
        for index, doc_id in kept:
            yield doc_id, keys[index][1]


def by_split(splits, docs, label: str):
    """The CoGroupByKey of each split (a PCollection of :class:`~pipelines.io.reading.Split`) with
    the ``(index, id)`` of its documents among ``docs`` (:class:`~pipelines.stages.keys.DocKey` s),
    under the steps ``{label}/SplitById``, ``{label}/BySplit`` and ``{label}`` (the join): what
    :class:`SplitSignatures` and :class:`PayloadFn` read."""
    return ({SPLIT: splits | f"{label}/SplitById" >> beam.Map(lambda s: (split_id(s), s)),
             KEPT: docs | f"{label}/BySplit" >> beam.Map(lambda key: (key.split, (key.index, key.id)))}
            | label >> beam.CoGroupByKey())


class PayloadFn(beam.DoFn):
    """``(split id, {"split": [Split], "kept": [(index, id), ...]})`` → the split's kept documents,
    read from its record under the ids the dedup stages gave them, tokenised
    (:class:`~pipelines.stages.tokenize.TokenizeFn`), split into train and validation
    (:class:`~pipelines.stages.split.SplitBatchFn`) and encoded
    (:func:`~pipelines.stages.write_shards.encode_sample`) into one spill file per part: a
    :class:`~pipelines.stages.write_shards.SpilledSamples` on the main output (train) or tag ``val``;
    ``filtered:no_tokens`` events on tag ``events``. Holds one split at a time (``input.split_bytes``).

    Args:
        work: the job's work folder (the records; spill files go to its ``spill`` folder).
        cfg: the job's config (``tokenizer``, ``split.val_fraction``, ``shards.store_text`` and ``layout``).
    """

    def __init__(self, work: WorkFolder, cfg: PipelineConfig):
        self.work, self.store_text, self.layout = work, cfg.shards.store_text, cfg.shards.layout
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

    def process(self, item, model: TokenizerFile):
        """Tokenise, split and spill the kept documents of one split (``model``: the side input)."""
        _, grouped = item
        kept = sorted(grouped[KEPT])
        if not kept:
            return
        (split,) = grouped[SPLIT]
        docs, _ = record_docs(_load(self.work, split))
        chosen = [docs[index]._replace(id=doc_id) for index, doc_id in kept]
        del docs  # the split's other documents are not needed past here
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
