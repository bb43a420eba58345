"""Near dedup on in-memory documents, as the job runs it on the split records: one ``BAND_ROW`` array
per split (what ``Candidates`` makes of a record), the candidates read back from the same pairs
(what ``NearDocs`` reads from the records)."""
from __future__ import annotations

from collections import defaultdict

import apache_beam as beam
import numpy as np

from pipelines.config import DedupConfig
from pipelines.stages.keys import DocKey, hashes_of
from pipelines.stages.near_dedup import NearDedup, NearDoc, NearOutput, band_rows


def _candidate(pair: tuple[DocKey, bytes], found):
    key, sig = pair
    if found.in_split(key.split, key.index + 1)[key.index]:
        yield NearDoc(key.id, key.source, key.split, key.index, sig)


def near_dedup(p, pairs: list[tuple[DocKey, bytes]], cfg: DedupConfig, folder: str, label: str = "Near") -> NearOutput:
    """:class:`~pipelines.stages.near_dedup.NearDedup` in pipeline ``p`` over ``pairs``.

    Args:
        p: a Beam pipeline.
        pairs: ``(DocKey, signature)`` per document (:func:`pipelines.stages.keys.doc_keys`); a split's
            indexes run from 0 with no gap.
        cfg: the dedup settings.
        folder: a spill folder for the band runs.
        label: the steps' prefix.
    Returns:
        its :class:`~pipelines.stages.near_dedup.NearOutput`.
    """
    splits: dict[str, list] = defaultdict(list)
    for key, sig in pairs:
        splits[key.split].append((key.index, key, sig))
    arrays = []
    for split, docs in splits.items():
        docs.sort(key=lambda doc: doc[0])
        sigs = np.frombuffer(b"".join(sig for _, _, sig in docs), np.uint32).reshape(len(docs), -1)
        arrays.append(band_rows(split, sigs, hashes_of([key for _, key, _ in docs]), cfg.bands))

    def candidates(found):
        return (p | f"{label}/Docs" >> beam.Create(pairs)
                | f"{label}/Candidates" >> beam.FlatMap(_candidate, found))

    return p | f"{label}/Rows" >> beam.Create(arrays) | label >> NearDedup(cfg, folder, candidates)
