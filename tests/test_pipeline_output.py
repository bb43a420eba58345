"""Shard writing and the final commit step against a non-local fsspec filesystem (``memory://``)."""
from __future__ import annotations

import json

import apache_beam as beam
import fsspec
import numpy as np

from pipelines.config import ShardsConfig, TokenizerConfig
from pipelines.records import Doc
from pipelines.sharding import TMP_DIR, WriteBucketFn, encode_sample, finalize
from pipelines.tokenizer import train_sentencepiece
from shards import iter_samples


def _write(output_dir, docs):
    samples = [encode_sample((d, np.arange(len(d.text), dtype=np.uint16))) for d in docs]
    fn = WriteBucketFn(output_dir, write_index=True)
    shards, events = [], []
    for bucket, group in ((1, samples[:2]), (0, samples[2:])):
        for out in fn.process((bucket, group)):
            (events if isinstance(out, beam.pvalue.TaggedOutput) else shards).append(
                out.value if isinstance(out, beam.pvalue.TaggedOutput) else out)
    return shards, events


def test_remote_output_commits_shards_manifest_and_stats(tmp_path):
    docs = [Doc("b", "beta text", "s"), Doc("a", "alpha", "s"), Doc("c", "gamma words", "t"),
            Doc("c", "gamma other", "t")]  # same id twice: one is filtered as duplicate_id
    model = train_sentencepiece(["alpha beta gamma delta epsilon"] * 50, TokenizerConfig(vocab_size=300))
    fs = fsspec.filesystem("memory")
    fs.pipe_file("/colaflow-test/shard-000007.tar", b"stale shard of an earlier run")
    fs.pipe_file("/colaflow-test/shard-000007.idx", b"stale index")
    shards, events = _write("memory://colaflow-test", docs)
    events.append((("s", "input"), 2))
    events.append((("t", "input"), 2))
    stats = finalize(None, "memory://colaflow-test", ShardsConfig(), shards, events, model)
    names = sorted(p.rsplit("/", 1)[-1] for p in fs.ls("/colaflow-test", detail=False))
    assert names == ["manifest.json", "shard-000000.idx", "shard-000000.tar", "shard-000001.idx", "shard-000001.tar",
                     "shardindex.json", "stats.json", "tokenizer.model"]
    assert not fs.exists(f"/colaflow-test/{TMP_DIR}")
    manifest = json.loads(fs.cat_file("/colaflow-test/manifest.json"))
    assert [s["documents"] for s in manifest["shards"]] == [1, 2]  # bucket 0 first
    assert [s["blocks"] for s in manifest["shards"]] == [1, 1] and manifest["layout"] == "token_blocks"
    assert stats["shard_bytes_per_token"] > 0 and stats["layout"] == "token_blocks"
    shard_bytes = sum(s["bytes"] for s in manifest["shards"]) + stats["index_bytes"]
    assert stats["shard_bytes_per_token"] == shard_bytes / manifest["total_tokens"]
    from pipelines.report import report_text
    assert f"shard bytes/token{stats['shard_bytes_per_token']:>12.2f}  (shards + indexes, token_blocks)" in report_text(stats)
    assert stats["total"]["kept"] == 3 and stats["total"]["filtered"] == {"duplicate_id": 1}
    assert stats["total"]["balanced"] and stats["shards"] == 2
    local = tmp_path / "shard.tar"
    local.write_bytes(fs.cat_file("/colaflow-test/shard-000001.tar"))
    [block] = list(iter_samples(str(local)))
    assert block["json"]["ids"] == ["a", "b"] and block["tokens"].tolist() == list(range(5)) + list(range(9))
    wids = json.loads(fs.cat_file("/colaflow-test/shardindex.json"))
    assert [(s["url"], s["nsamples"], s["dali_index"]) for s in wids["shardlist"]] == [
        ("shard-000000.tar", 1, "shard-000000.idx"), ("shard-000001.tar", 1, "shard-000001.idx")]
    assert wids["shardlist"][1]["sha256"] == manifest["shards"][1]["sha256"]
    fs.rm("/colaflow-test", recursive=True)
