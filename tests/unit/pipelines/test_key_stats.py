"""Issue 38, item 1: what crosses the global steps for every document is one compact row per
document in an array per split (``KEY_ROW``), combined into the repeated content hashes and the
shared ids (``KeyStats``); only the documents of a repeated hash go on as ``DocKey`` s."""
from __future__ import annotations

import json

import numpy as np
import pytest

import pipelines.stages.keys as keys_module
from pipelines.config import DedupConfig, TokenizerConfig
from pipelines.io.frames import encode
from pipelines.io.resume import _replay
from pipelines.job import run
from pipelines.records import Doc, disambiguate_id
from pipelines.stages.keys import KEY_ROW, KEYS, KeyStats, doc_keys, id_hash, key_rows, sample_sizes
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


def _stats(rows_per_split, merge_at: int):
    fn = KeyStats()
    accs = [fn.create_accumulator(), fn.create_accumulator()]
    for i, rows in enumerate(rows_per_split):
        accs[i >= merge_at] = fn.add_input(accs[i >= merge_at], rows)
    return fn.extract_output(fn.merge_accumulators([fn.compact(a) for a in accs]))


@pytest.mark.parametrize("first_compact", [1, 1 << 16])
def test_key_stats_finds_repeated_hashes_and_shared_ids_whatever_the_partitioning(monkeypatch, first_compact):
    monkeypatch.setattr(keys_module, "_FIRST_COMPACT", first_compact)  # 1: compacted at every split
    keys = _keys()
    rows = key_rows(keys)
    assert rows.dtype == KEY_ROW and rows.nbytes == 48 * len(keys)
    assert [tuple(r) for r in rows[["i1", "i2"]].tolist()] == [id_hash(k.id) for k in keys]
    for merge_at in range(len(keys) + 1):
        stats = _stats([rows[i:i + 1] for i in range(len(keys))], merge_at)
        assert repeated(keys, stats).tolist() == [True, True, False, False, True, True, False]
        assert np.isin(keys_module.ids_of(keys), stats.shared_ids).tolist() == [False, False, True, True,
                                                                                False, False, False]


def test_no_rows_give_empty_stats():
    stats = KeyStats().extract_output(KeyStats().create_accumulator())
    assert len(stats.hashes) == 0 and len(stats.shared_ids) == 0
    assert unique_keys(_keys(), stats) == _keys()


def test_unique_keys_renames_only_the_ids_two_texts_share():
    keys = _keys()
    renamed = unique_keys(keys, _stats([key_rows(keys)], 1))
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


def test_key_stats_holds_its_pairs_about_twice_while_it_compacts():
    """Issue 38: np.unique's copies held the pairs five to six times over at once (40 MB for the
    8.6 MB of pairs of 16x a quarter of the demo corpus), within the Work stage's bundle."""
    import tracemalloc

    rng = np.random.default_rng(0)
    splits = []
    for _ in range(24):
        rows = np.zeros(8192, KEY_ROW)
        for name in KEY_ROW.names:
            rows[name] = rng.integers(0, 1 << 62, len(rows), dtype=np.uint64)
        rows[["h1", "h2"]][:100] = rows[["h1", "h2"]][100:200]  # 100 texts under two ids each
        splits.append(rows)
    pair_bytes = 32 * sum(len(rows) for rows in splits)
    fn = KeyStats()
    tracemalloc.start()
    try:
        acc = fn.create_accumulator()
        for rows in splits:
            acc = fn.add_input(acc, rows)
        stats = fn.extract_output(fn.merge_accumulators([fn.compact(acc)]))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(stats.hashes) == 24 * 100 and len(stats.shared_ids) == 0
    assert peak < 2.6 * pair_bytes, (peak, pair_bytes)
