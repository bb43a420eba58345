"""Issue 38, item 1: what crosses the global steps for every document is one compact row per
document in an array per split (``KEY_ROW``), combined into the repeated content hashes and the
shared ids (``KeyStats``); only the documents of a repeated hash go on as ``DocKey`` s."""
from __future__ import annotations

import collections
import io
import json

import numpy as np
import pytest

import pipelines.stages.keys as keys_module
import pipelines.stages.sorted_runs as sorted_runs
from pipelines.config import DedupConfig, TokenizerConfig
from pipelines.io.frames import encode
from pipelines.io.resume import _replay
from pipelines.job import run
from pipelines.records import Doc, disambiguate_id
from pipelines.stages.keys import (KEY_ROW, KEYS, KeyStats, doc_keys, id_hash, key_rows, record_keys,
                                   sample_sizes)
from pipelines.stages.payload import repeated, unique_keys
from pipelines.stages.tokenize import train_sentencepiece
from pipelines.stages.tokenizer_sample import sample_key
from tests.support.pipeline import synthetic_config

DOCS = [Doc("f/a", "One text.", "s"), Doc("f/b", "one  TEXT.", "s"),  # one normalised text, two ids
        Doc("f/c", "Its own text.", "t"), Doc("f/c", "Another text.", "t"),  # one id, two texts
        Doc("f/d", "Twice here.", "t"), Doc("f/d", "Twice here.", "t"),  # one text twice under one id
        Doc("f/e", "Alone.", "s")]


def _keys(docs=DOCS):
    return [key for key, _ in doc_keys(docs, "sp", 0, DedupConfig(near=False))]


def _stats(rows_per_split, merge_at: int, folder):
    fn = KeyStats(str(folder))
    accs = [fn.create_accumulator(), fn.create_accumulator()]
    for i, rows in enumerate(rows_per_split):
        accs[i >= merge_at] = fn.add_input(accs[i >= merge_at], rows)
    return fn.extract_output(fn.merge_accumulators([fn.compact(a) for a in accs]))


@pytest.mark.parametrize("run_rows", [1, 1 << 17])
def test_key_stats_finds_repeated_hashes_and_shared_ids_whatever_the_partitioning(monkeypatch, tmp_path, run_rows):
    monkeypatch.setattr(sorted_runs, "RUN_ROWS", run_rows)  # 1: a run per split
    keys = _keys()
    rows = key_rows(keys)
    assert rows.dtype == KEY_ROW and rows.nbytes == 48 * len(keys)
    assert [tuple(r) for r in rows[["i1", "i2"]].tolist()] == [id_hash(k.id) for k in keys]
    for merge_at in range(len(keys) + 1):
        stats = _stats([rows[i:i + 1] for i in range(len(keys))], merge_at, tmp_path)
        assert repeated(keys, stats).tolist() == [True, True, False, False, True, True, False]
        assert np.isin(keys_module.ids_of(keys), stats.shared_ids).tolist() == [False, False, True, True,
                                                                                False, False, False]


def test_no_rows_give_empty_stats(tmp_path):
    stats = KeyStats(str(tmp_path)).extract_output(KeyStats(str(tmp_path)).create_accumulator())
    assert len(stats.hashes) == 0 and len(stats.shared_ids) == 0
    assert unique_keys(_keys(), stats) == _keys()


def test_unique_keys_renames_only_the_ids_two_texts_share(tmp_path):
    keys = _keys()
    renamed = unique_keys(keys, _stats([key_rows(keys)], 1, tmp_path))
    assert [k.id for k in renamed] == ["f/a", "f/b", disambiguate_id("f/c", keys[2].hash),
                                       disambiguate_id("f/c", keys[3].hash), "f/d", "f/d", "f/e"]
    assert renamed[2].id != renamed[3].id and [k._replace(id="") for k in renamed] == [k._replace(id="") for k in keys]


def test_sample_sizes_are_those_of_the_documents():
    keys = _keys()
    assert list(sample_sizes(key_rows(keys))) == [sample_key((k.hash, d)) for k, d in zip(keys, DOCS)]


def test_a_split_is_one_array_of_rows_on_work_s_main_output():
    pairs = doc_keys(DOCS, "sp", 0, DedupConfig(near=False))
    record = encode([(None, d) for d in DOCS] + [(KEYS, p) for p in pairs])
    (out,) = [o for o in _replay(record) if isinstance(o, np.ndarray)]
    assert out.tolist() == key_rows([k for k, _ in pairs]).tolist()
    assert list(_replay(encode([(None, DOCS[0])]))) == []  # a split that keeps nothing emits no rows


def test_a_record_s_keys_are_read_without_its_documents():
    """The keys come first in a split record; the keys-only passes (Candidates, HotDocs, near dedup's
    signatures) stop at the first frame of documents: a record damaged past it still gives its keys."""
    pairs = doc_keys(DOCS, "sp", 0, DedupConfig(near=False))
    record = encode([(KEYS, p) for p in pairs], chunk=3) + encode([(None, d) for d in DOCS], chunk=3)
    assert record_keys(io.BytesIO(record + b"not a frame")) == pairs
    assert record_keys(io.BytesIO(encode([(None, d) for d in DOCS]))) == []  # a split that keeps nothing


@pytest.mark.parametrize("exact", [True, False])
def test_the_final_pass_keeps_the_documents_no_global_step_decided_on(tmp_path, exact):
    rows = [{"id": "a", "text": "the river runs by the old mill today"},
            {"id": "b", "text": "The river runs by the OLD mill today"},  # a's text, normalised
            {"id": "c", "text": "apples grow in the garden by the wall"},
            {"id": "c", "text": "pears grow in the garden by the gate"},  # c again, another text
            {"id": "d", "text": "a quiet evening on the hill"}]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (tmp_path / "tok.model").write_bytes(train_sentencepiece([r["text"] for r in rows] * 20,
                                                             TokenizerConfig(vocab_size=300)))
    cfg = synthetic_config()
    cfg.dedup.near, cfg.dedup.exact = False, exact
    cfg.tokenizer.path = str(tmp_path / "tok.model")
    stats = run(str(tmp_path / "in.jsonl"), str(tmp_path / "out"), cfg, report=False)
    total = stats["total"]
    assert total["balanced"] and total["input_records"] == 5
    assert (total["kept"], total["duplicates"]) == ((4, 1) if exact else (5, 0))
    assert "duplicate_id" not in total["filtered"]  # c's two texts were kept under two ids


def _random_rows(rng, n: int) -> np.ndarray:
    rows = np.zeros(n, KEY_ROW)
    for name in KEY_ROW.names:
        rows[name] = rng.integers(0, np.iinfo(np.uint64).max, n, dtype=np.uint64, endpoint=True)
    return rows


def test_key_stats_agrees_with_counting_every_document(monkeypatch, tmp_path):
    """Runs of a few splits each, read back a range of the hash at a time (all 256 ranges hold rows),
    give what counting the documents in Python gives: texts under two ids, an id over two texts, one
    (text, id) pair in two runs (a repeated text, not a shared id)."""
    monkeypatch.setattr(sorted_runs, "RUN_ROWS", 3000)
    rng = np.random.default_rng(1)
    splits = [_random_rows(rng, 1000) for _ in range(20)]
    splits[0][["h1", "h2"]][:50] = splits[0][["h1", "h2"]][50:100]
    splits[7][["i1", "i2"]][:30] = splits[19][["i1", "i2"]][:30]
    splits[12][:40] = splits[3][:40]
    splits[5][["h1", "i1"]][:8] = splits[5][["h1", "i1"]][8:16]  # only the low halves differ
    stats = _stats(splits, 11, tmp_path)
    rows = np.concatenate(splits)
    texts = collections.Counter(zip(rows["h1"].tolist(), rows["h2"].tolist()))
    pairs = set(zip(rows["i1"].tolist(), rows["i2"].tolist(), rows["h1"].tolist(), rows["h2"].tolist()))
    ids = collections.Counter((i1, i2) for i1, i2, _, _ in pairs)
    assert stats.hashes.tolist() == sorted(h for h, n in texts.items() if n > 1)
    assert stats.shared_ids.tolist() == sorted(i for i, n in ids.items() if n > 1)
    assert (len(stats.hashes), len(stats.shared_ids)) == (50 + 40, 30)


def test_key_stats_holds_a_run_not_every_document(monkeypatch, tmp_path):
    """Issue 38: the accumulator held 32 bytes for every document (35 MB at 16x the demo corpus, 70 MB
    while it compacted, then again decoded where the partials merged); now every RUN_ROWS documents go
    to a file, and the output is found one range of the hash at a time."""
    import tracemalloc

    monkeypatch.setattr(sorted_runs, "RUN_ROWS", 16384)
    rng = np.random.default_rng(0)
    splits = [_random_rows(rng, 8192) for _ in range(48)]
    for rows in splits:
        rows[["h1", "h2"]][:100] = rows[["h1", "h2"]][100:200]  # 100 texts under two ids each
    pair_bytes = 32 * sum(len(rows) for rows in splits)
    fn = KeyStats(str(tmp_path))
    tracemalloc.start()
    try:
        acc = fn.create_accumulator()
        for rows in splits:
            acc = fn.add_input(acc, rows)
        stats = fn.extract_output(fn.merge_accumulators([fn.compact(acc)]))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(stats.hashes) == 48 * 100 and len(stats.shared_ids) == 0
    assert peak < 0.25 * pair_bytes, (peak, pair_bytes)
