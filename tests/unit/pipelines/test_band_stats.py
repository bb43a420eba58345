"""Near dedup's band buckets: one BAND_ROW array per split, combined on disk by BandStats into the
band hashes of two documents (or two texts) or more, those documents and the parts the buckets of
many documents are compared in, the same whatever the runs and partials (against counting every
band of every document in a dict)."""
from __future__ import annotations

import collections

import numpy as np
import pytest

import pipelines.stages.near_dedup as near_dedup
import pipelines.stages.sorted_runs as sorted_runs
from pipelines.stages.keys import HASH
from pipelines.stages.near_dedup import BAND_ROW, DOC_REF, BandStats, band_hashes, band_keys, band_rows, split_number

BANDS = 4


def _signatures(n: int, seed: int) -> np.ndarray:
    """``n`` signatures of 16 values drawn from 3 per position, so that bands often agree."""
    return np.random.RandomState(seed).randint(0, 3, size=(n, 16)).astype(np.uint32)


def test_band_hashes_agree_with_band_keys():
    sigs = _signatures(200, 1)
    hashes = band_hashes(sigs, BANDS)
    assert hashes.shape == (200, BANDS) and hashes.dtype == np.uint64
    by_key = collections.defaultdict(set)
    for sig, row in zip(sigs, hashes):
        for key, h in zip(band_keys(sig, BANDS), row.tolist()):
            by_key[key].add(h)
    assert all(len(h) == 1 for h in by_key.values())  # equal bands, equal hashes
    assert len({h for hs in by_key.values() for h in hs}) == len(by_key)  # no collision here


def _texts(sigs: np.ndarray) -> np.ndarray:
    """A content hash per document: the same for the documents of equal signatures (copies of a text)."""
    texts = np.empty(len(sigs), HASH)
    texts["h1"] = [hash(row.tobytes()) & 0xFFFF for row in sigs]  # few values: equal texts across splits
    texts["h2"] = 7
    return texts


@pytest.mark.parametrize("run_rows", [1, 50, 1 << 17])
@pytest.mark.parametrize("distinct_texts", [False, True])
def test_band_stats_finds_the_shared_buckets_whatever_the_partitioning(monkeypatch, tmp_path, run_rows, distinct_texts):
    monkeypatch.setattr(sorted_runs, "RUN_ROWS", run_rows)
    monkeypatch.setattr(near_dedup, "PART_MEMBERS", 4)  # buckets of 5 documents or more in parts
    splits = {f"{i:016x}": _signatures(30 + i, i) for i in range(6)}
    splits["copies"] = np.concatenate([splits["0000000000000000"][:10]] * 2)  # copies of 10 texts
    arrays = [band_rows(split, sigs, _texts(sigs), BANDS) for split, sigs in splits.items()]
    assert all(a.dtype == BAND_ROW and len(a) == len(splits[s]) * BANDS for a, s in zip(arrays, splits))
    fn = BandStats(str(tmp_path), distinct_texts)
    accs = [fn.create_accumulator(), fn.create_accumulator()]
    for i, rows in enumerate(arrays):
        accs[i % 2] = fn.add_input(accs[i % 2], rows)
    found = fn.extract_output(fn.merge_accumulators([fn.compact(a) for a in accs]))
    members, texts = collections.defaultdict(set), collections.defaultdict(set)
    for split, sigs in splits.items():
        for index, (row, text) in enumerate(zip(band_hashes(sigs, BANDS).tolist(), _texts(sigs).tolist())):
            for h in row:
                members[h].add((split_number(split), index))
                texts[h].add(text)
    shared = sorted(h for h, m in members.items() if len(texts[h] if distinct_texts else m) > 1)
    assert found.keys.tolist() == shared
    assert found.refs.dtype == DOC_REF
    assert found.refs.tolist() == sorted({ref for h in shared for ref in members[h]})
    assert found.shared(np.array(shared + [1, 2], np.uint64)).tolist() == [True] * len(shared) + [False, False]
    parts = [-(-len(members[h]) // 4) for h in shared]  # ceil(documents / PART_MEMBERS)
    assert found.parts(np.array(shared + [1], np.uint64)).tolist() == parts + [1]
    assert found.hot.tolist() == [h for h, n in zip(shared, parts) if n > 1] and max(parts) > 2  # not vacuous
    for split, sigs in splits.items():
        mask = found.in_split(split, len(sigs))
        assert mask.tolist() == [(split_number(split), i) in set(found.refs.tolist()) for i in range(len(sigs))]
        assert found.any_in(split) == bool(mask.any())
    assert not found.any_in("not a split")


def test_merging_partials_writes_their_pending_rows_past_run_rows(monkeypatch, tmp_path):
    # partials that were not compacted each hold fewer than RUN_ROWS rows; merged, they must not be
    # held together past RUN_ROWS (the bound on what SpilledRuns holds), and the output is the same
    monkeypatch.setattr(sorted_runs, "RUN_ROWS", 40)
    fn = BandStats(str(tmp_path), False)
    arrays = [band_rows(f"{i:016x}", sigs, _texts(sigs), BANDS) for i, sigs in
              enumerate(_signatures(9, i) for i in range(8))]  # 36 rows each
    partials = [fn.add_input(fn.create_accumulator(), rows) for rows in arrays]
    assert all(acc.rows == 36 and not acc.runs for acc in partials)
    merged = fn.merge_accumulators(partials)
    assert merged.rows < sorted_runs.RUN_ROWS
    whole = fn.create_accumulator()
    for rows in arrays:
        whole = fn.add_input(whole, rows)
    assert fn.extract_output(merged).refs.tolist() == fn.extract_output(whole).refs.tolist()
