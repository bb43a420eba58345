"""The validation split of preprocessing: deterministic by content hash, its own shard set and
manifest section, counted in stats.json; identical across runners and reruns."""
from __future__ import annotations

import filecmp
import json
import os

from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.config import PipelineConfig
from examples.demo.corpus import write_corpus
from pipelines.job import run
from pipelines.stages.split import is_validation, split_position
from shards import Manifest, iter_documents
from shards.format.manifest import split_manifest_url
from tests.support.pipeline import synthetic_config

MULTI = ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]


def _config() -> PipelineConfig:
    cfg = synthetic_config()
    cfg.tokenizer.vocab_size = 400
    cfg.shards.num_shards = 2
    cfg.split.val_fraction = 0.1
    return cfg


def _ids(folder) -> set[str]:
    m = Manifest.load(str(folder))
    return {s["json"]["id"] for sh in m.shards for s in iter_documents(os.path.join(folder, sh.name))}


@given(st.text(min_size=1, max_size=200), st.floats(0.0, 0.99))
@settings(max_examples=200, deadline=None)
def test_split_depends_on_text_only_and_is_monotone_in_the_fraction(text, fraction):
    assert split_position(text) == split_position(text)
    assert 0.0 <= split_position(text) < 1.0
    # a larger fraction only adds documents: a validation document stays one
    assert not is_validation(text, fraction) or is_validation(text, min(fraction + 0.005, 0.999))


def test_split_fraction_is_close_to_the_requested_one():
    texts = [f"document number {i}" for i in range(20000)]
    share = sum(is_validation(t, 0.05) for t in texts) / len(texts)
    assert 0.04 < share < 0.06


def test_validation_split_in_the_pipeline(tmp_path):
    corpus = tmp_path / "corpus"
    write_corpus(str(corpus), limit_per_source=150)
    mem, multi = tmp_path / "mem", tmp_path / "multi"
    stats = run(f"{corpus}/*.jsonl", str(mem), _config(), report=False)
    run(f"{corpus}/*.jsonl", str(multi), _config(), MULTI, report=False)

    top = Manifest.load(str(mem))
    val_url = split_manifest_url(str(mem), top, "val")
    assert val_url == f"{mem}/val/manifest.json"
    val = Manifest.load(val_url)
    entry = top.splits["val"]
    assert entry["samples"] == val.total_documents > 0 and entry["tokens"] == val.total_tokens > 0
    assert (mem / "val" / "tokenizer.model").read_bytes() == (mem / "tokenizer.model").read_bytes()

    train_ids, val_ids = _ids(mem), _ids(mem / "val")
    assert train_ids and val_ids and not train_ids & val_ids
    assert len(train_ids) + len(val_ids) == stats["total"]["kept"]
    assert stats["splits"]["val"]["samples"] == len(val_ids)
    assert stats["splits"]["train"]["samples"] == len(train_ids)
    assert stats["splits"]["train"]["tokens"] + stats["splits"]["val"]["tokens"] == stats["total"]["tokens"]
    assert stats["total"]["balanced"]
    # the chosen documents are exactly those whose text hashes below the fraction
    texts = {}
    for name in ("shakespeare", "kjv"):
        for line in (corpus / f"{name}.jsonl").read_text(encoding="utf-8").splitlines():
            rec = json.loads(line)
            texts[f"{name}.jsonl/{rec['id']}"] = rec["text"]  # ids are qualified by their input file
    assert all(is_validation(texts[i], 0.1) for i in val_ids)
    assert not any(is_validation(texts[i], 0.1) for i in train_ids)

    # another runner writes byte-identical files in both shard sets
    for sub in ("", "val"):
        names = sorted(n for n in os.listdir(mem / sub) if n.endswith((".tar", ".json", ".idx")))
        assert names == sorted(n for n in os.listdir(multi / sub) if n.endswith((".tar", ".json", ".idx")))
        _, mismatch, errors = filecmp.cmpfiles(mem / sub, multi / sub, names, shallow=False)
        assert mismatch == [] and errors == [], sub
