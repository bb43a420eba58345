"""End-to-end Beam runs on a small real slice of the demo corpus (Shakespeare + KJV)."""
from __future__ import annotations

import filecmp
import io
import json
import os

import numpy as np
import pytest
import sentencepiece as spm
import webdataset as wds
import zstandard

from pipelines.stages.clean import clean_text
from pipelines.config import CleanConfig, PipelineConfig
from examples.demo.corpus import write_corpus
from pipelines.job import run
from shards import Manifest, iter_documents, iter_samples, read_sample, unescape_key
from shards.format.blocks import block_documents, decode_meta_dict
from tests.support.pipeline import synthetic_config

MULTI = ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]
# records per source: 200 KJV chapters are ~170k words, enough for 3 shards and a 600-piece tokenizer, and
# 200 Shakespeare paragraphs repeat a stage direction (a duplicate); each of the four runs below reads them all
PER_SOURCE = 200


def small_config() -> PipelineConfig:
    cfg = synthetic_config()
    cfg.tokenizer.vocab_size = 600
    cfg.shards.num_shards = 3
    cfg.dedup.near = True  # exercised on every runner; must not change byte-identity
    return cfg


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    counts = write_corpus(str(d), limit_per_source=PER_SOURCE)
    assert counts == {"shakespeare": PER_SOURCE, "kjv": PER_SOURCE}
    return d


@pytest.fixture(scope="module")
def runs(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("out")
    in_memory = run(f"{corpus}/*.jsonl", str(out / "mem"), small_config())
    multi = run(f"{corpus}/*.jsonl", str(out / "multi"), small_config(), MULTI)
    return out / "mem", out / "multi", in_memory, multi


def test_runners_write_byte_identical_output(runs):
    mem, multi, _, _ = runs
    names = sorted(os.listdir(mem))
    assert names == sorted(os.listdir(multi))
    assert {"manifest.json", "stats.json", "tokenizer.model", "shardindex.json"} <= set(names)
    assert "dead_letter" not in names  # a clean corpus writes no (empty) dead-letter file
    assert len([n for n in names if n.endswith(".idx")]) == 3  # DALI index per shard
    files = [n for n in names if n.endswith((".tar", ".json", ".model", ".idx"))]
    match, mismatch, errors = filecmp.cmpfiles(mem, multi, files, shallow=False)
    assert mismatch == [] and errors == []
    assert len([n for n in match if n.endswith(".tar")]) == 3


def test_stats_balance_and_counts(runs):
    _, _, stats, multi_stats = runs
    total = stats["total"]
    assert total["input_records"] == 2 * PER_SOURCE
    assert total["dead_letter"] == 0
    assert total["duplicates"] > 0  # stage directions such as "Exit." repeat in the first plays
    assert total["kept"] + total["duplicates"] + sum(total["filtered"].values()) == 2 * PER_SOURCE
    for entry in [total, *stats["sources"].values()]:
        assert entry["balanced"]
    assert stats["sources"]["kjv"]["kept"] == PER_SOURCE
    assert stats["metrics"]["input"] == 2 * PER_SOURCE and stats["metrics"]["kept"] == total["kept"]  # Beam counters
    assert stats["metrics"]["duplicate"] == total["duplicates"]
    assert {k: v for k, v in stats.items() if k != "seconds"} == {
        k: v for k, v in multi_stats.items() if k != "seconds"}


def test_manifest_matches_shards(runs):
    mem, _, stats, _ = runs
    m = Manifest.load(str(mem))
    assert m.token_dtype == "uint16" and m.tokenizer == "tokenizer.model"
    assert m.layout == "token_blocks" and m.total_documents == stats["total"]["kept"]
    assert m.total_tokens == stats["total"]["tokens"]
    sp = spm.SentencePieceProcessor(model_file=str(mem / m.tokenizer))
    assert m.vocab_size == sp.get_piece_size() <= 600
    keys = []
    for info in m.shards:
        path = mem / info.name
        assert path.stat().st_size == info.bytes
        samples = list(iter_samples(str(path)))
        assert len(samples) == info.samples == info.blocks
        assert sum(s["tokens"].size for s in samples) == info.tokens
        docs = list(iter_documents(str(path)))
        assert len(docs) == info.documents
        keys += [s["__key__"] for s in docs]
    assert len(keys) == len(set(keys))
    last = list(iter_samples(str(mem / m.shards[1].name)))[-1]
    assert read_sample(str(mem / m.shards[1].name), -1)["__key__"] == last[
        "__key__"]  # random access through the DALI index the pipeline wrote


def test_webdataset_reads_same_tokens(runs, corpus):
    mem, _, _, _ = runs
    m = Manifest.load(str(mem))
    sp = spm.SentencePieceProcessor(model_file=str(mem / m.tokenizer))
    texts = {}
    for name in ("shakespeare.jsonl", "kjv.jsonl"):
        with open(corpus / name, encoding="utf-8") as f:
            texts.update((f"{name}/{r['id']}", r["text"]) for r in map(json.loads, f))
    ours = {s["__key__"]: s["tokens"] for info in m.shards for s in iter_documents(str(mem / info.name))}
    urls = [str(mem / info.name) for info in m.shards]
    seen = 0
    for sample in wds.WebDataset(urls, shardshuffle=False):  # token blocks: raw .npy and zstd JSON metadata
        block = np.load(io.BytesIO(sample["tokens.npy"]), allow_pickle=False)
        meta = json.loads(zstandard.ZstdDecompressor().decompressobj().decompress(sample["json.zst"]))
        assert block.dtype == np.uint16 and unescape_key(sample["__key__"]) == decode_meta_dict(meta).ids[0]
        for doc in block_documents({"__key__": sample["__key__"], "json": meta, "tokens": block}):
            tokens = doc["tokens"]
            np.testing.assert_array_equal(tokens, ours[doc["__key__"]])
            assert unescape_key(doc["__key__"]) == doc["json"]["id"]
            # every document ends with the model's EOS (tokenizer.add_eos, the default), no BOS
            assert tokens.tolist() == sp.encode(clean_text(texts[doc["json"]["id"]], CleanConfig())) + [sp.eos_id()]
            seen += 1
    assert seen == len(ours)


def test_existing_tokenizer_is_reused(runs, corpus, tmp_path):
    mem, _, stats, _ = runs
    cfg = small_config()
    cfg.tokenizer.path = str(mem / "tokenizer.model")
    again = run(f"{corpus}/kjv.jsonl", str(tmp_path), cfg)
    assert (tmp_path / "tokenizer.model").read_bytes() == (mem / "tokenizer.model").read_bytes()
    assert again["total"]["tokens"] == stats["sources"]["kjv"]["tokens"]


def test_no_matching_input_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing-here"):
        run(str(tmp_path / "nothing-here-*.jsonl"), str(tmp_path / "out"), small_config())


def test_portable_runner_embedded_matches(runs, corpus, tmp_path):
    mem, _, _, _ = runs
    run(f"{corpus}/*.jsonl", str(tmp_path), small_config(),
        ["--runner=PortableRunner", "--job_endpoint=embed", "--environment_type=LOOPBACK"])
    files = [n for n in os.listdir(mem) if n.endswith((".tar", ".json", ".model"))]
    match, mismatch, errors = filecmp.cmpfiles(mem, tmp_path, files, shallow=False)
    assert mismatch == [] and errors == [] and len(match) == len(files)
