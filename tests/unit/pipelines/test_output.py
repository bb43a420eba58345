"""Shard writing and the final commit step against a non-local fsspec filesystem (``memory://``)."""
from __future__ import annotations

import json
import tracemalloc

import apache_beam as beam
import fsspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.config import ShardsConfig, TokenizerConfig
from pipelines.records import Doc
from pipelines.io.frames import decode_list, encode
from pipelines.stages.write_shards import (TMP_DIR, AssignBucketsFn, SpilledSamples, WriteBucketFn, assign_bucket,
                                           commit_shards, encode_sample, spill,
                                encoded_size, finalize, held_bytes, num_buckets, sample_order,
                                tokenizer_output)
from pipelines.stages.tokenize import train_sentencepiece, trained_file
from shards import iter_samples
from shards.format.blocks import decode_meta_dict
from tests.support.pipeline import synthetic_config


SPILL = "memory://colaflow-test-spill"  # the runs' folder, outside the output folder


def _read(path: str) -> list:
    with fsspec.open(path, "rb") as f:
        return decode_list(f.read())


def _write(output_dir, docs):
    samples = [encode_sample((d, np.arange(len(d.text), dtype=np.uint16))) for d in docs]
    fn = WriteBucketFn(output_dir, write_index=True)
    shards, events = [], []
    for bucket, group in ((1, samples[:2]), (0, samples[2:])):
        for out in fn.process((bucket, [spill(SPILL, encode(sorted(group, key=sample_order)))])):
            (events if isinstance(out, beam.pvalue.TaggedOutput) else shards).append(
                out.value if isinstance(out, beam.pvalue.TaggedOutput) else out)
    return shards, events


def test_remote_output_commits_shards_manifest_and_stats(tmp_path):
    docs = [Doc("b", "beta text", "s"), Doc("a", "alpha", "s"), Doc("c", "gamma words", "t"),
            Doc("c", "gamma other", "t")]  # same id twice: one is filtered as duplicate_id
    model = trained_file(["alpha beta gamma delta epsilon"] * 50, TokenizerConfig(vocab_size=300))
    fs = fsspec.filesystem("memory")
    fs.pipe_file("/colaflow-test/shard-000007.tar", b"stale shard of an earlier run")
    fs.pipe_file("/colaflow-test/shard-000007.idx", b"stale index")
    shards, events = _write("memory://colaflow-test", docs)
    events.append((("s", "input"), 2))
    events.append((("t", "input"), 2))
    stats = finalize(None, "memory://colaflow-test", ShardsConfig(), TokenizerConfig(), shards, events, model)
    names = sorted(p.rsplit("/", 1)[-1] for p in fs.ls("/colaflow-test", detail=False))
    assert names == ["manifest.json", "shard-000000.idx", "shard-000000.tar", "shard-000001.idx", "shard-000001.tar",
                     "shardindex.json", "stats.json", "tokenizer.json", "tokenizer.model", "tokenizer_config.json"]
    assert not fs.exists(f"/colaflow-test/{TMP_DIR}")
    manifest = json.loads(fs.cat_file("/colaflow-test/manifest.json"))
    assert [s["documents"] for s in manifest["shards"]] == [1, 2]  # bucket 0 first
    assert [s["blocks"] for s in manifest["shards"]] == [1, 1] and manifest["layout"] == "token_blocks"
    assert stats["shard_bytes_per_token"] > 0 and stats["layout"] == "token_blocks"
    shard_bytes = sum(s["bytes"] for s in manifest["shards"]) + stats["index_bytes"]
    assert stats["shard_bytes_per_token"] == shard_bytes / manifest["total_tokens"]
    from pipelines.accounting.report import report_text
    assert f"shard bytes/token{stats['shard_bytes_per_token']:>12.2f}  (shards + indexes, token_blocks)" in report_text(stats)
    assert stats["total"]["kept"] == 3 and stats["total"]["filtered"] == {"duplicate_id": 1}
    assert stats["total"]["balanced"] and stats["shards"] == 2
    local = tmp_path / "shard.tar"
    local.write_bytes(fs.cat_file("/colaflow-test/shard-000001.tar"))
    [block] = list(iter_samples(str(local)))
    assert decode_meta_dict(block["json"]).ids == ["a", "b"]
    assert block["tokens"].tolist() == list(range(5)) + list(range(9))
    wids = json.loads(fs.cat_file("/colaflow-test/shardindex.json"))
    fs.rm("/colaflow-test-spill", recursive=True)
    assert [(s["url"], s["nsamples"], s["dali_index"]) for s in wids["shardlist"]] == [
        ("shard-000000.tar", 1, "shard-000000.idx"), ("shard-000001.tar", 1, "shard-000001.idx")]
    assert wids["shardlist"][1]["sha256"] == manifest["shards"][1]["sha256"]
    fs.rm("/colaflow-test", recursive=True)


def _bucket_samples(n: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    docs = [Doc(f"src/f.jsonl:{int(i)}", "x" * int(rng.integers(1, 40)), "src") for i in rng.permutation(n)]
    docs.append(Doc(docs[0].id, docs[0].text + " other", "src"))  # one id twice: the first in sort order is kept
    return [encode_sample((d, rng.integers(0, 300, len(d.text)).astype(np.uint16))) for d in docs]


def _tar(output_dir, runs) -> tuple[bytes, int]:
    out = list(WriteBucketFn(str(output_dir), write_index=False).process((3, runs)))
    shard = out[-1]
    with open(f"{output_dir}/{TMP_DIR}/bucket-000003", "rb") as f:
        return f.read(), shard[1].documents


@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 700), cuts=st.lists(st.integers(0, 700), max_size=6), seed=st.integers(0, 99))
def test_a_bucket_written_from_sorted_runs_equals_the_bucket_written_from_one(tmp_path_factory, n, cuts, seed):
    """AssignBucketsFn sorts each bundle's samples of a bucket into a run; WriteBucketFn merges the
    runs, so any split of the bucket into runs writes the same shard bytes."""
    samples = _bucket_samples(n, seed)
    edges = sorted({0, len(samples), *[min(c, len(samples)) for c in cuts]})
    folder = str(tmp_path_factory.mktemp("runs"))
    runs = [spill(folder, encode(sorted(samples[a:b], key=sample_order))) for a, b in zip(edges, edges[1:])]
    one, docs = _tar(tmp_path_factory.mktemp("one"), [spill(folder, encode(sorted(samples, key=sample_order)))])
    split, docs_split = _tar(tmp_path_factory.mktemp("split"), runs)
    assert split == one and docs == docs_split == n


def test_assign_buckets_emits_one_sorted_run_per_bucket_and_bundle(tmp_path):
    samples = _bucket_samples(300, 1)
    fn = AssignBucketsFn(str(tmp_path))
    fn.start_bundle()
    total = sum(encoded_size(s) for s in samples)
    cfg = ShardsConfig(target_bytes=total // 3)
    for part in (samples[:100], samples[100:]):
        assert list(fn.process(SpilledSamples(spill(str(tmp_path), encode(part)), 0), total, cfg)) == []
    out = [wv.value for wv in fn.finish_bundle()]
    assert [b for b, _ in out] == list(range(num_buckets(total, cfg)))  # each bucket once, in order
    runs = {b: _read(path) for b, path in out}
    assert sum(len(r) for r in runs.values()) == len(samples)
    for b, run in runs.items():
        assert run == sorted(run, key=sample_order) and {assign_bucket(s, total, cfg)[0] for s in run} == {b}


def test_the_writer_holds_one_frame_per_run_not_the_bucket_as_objects(tmp_path):
    """52,000 short documents per shard at 16x the demo corpus: as objects they were several
    times their encoded bytes, and the writer held all of them to sort them."""
    rng = np.random.default_rng(0)
    samples = [encode_sample((Doc(f"src/f.jsonl:{i}", "x" * 200, "src"), rng.integers(0, 8000, 60).astype(np.uint16)))
               for i in range(20_000)]
    runs = [spill(str(tmp_path / "runs"), encode(sorted(samples[k::8], key=sample_order))) for k in range(8)]
    del samples
    run_bytes = sum((tmp_path / "runs" / path.rsplit("/", 1)[-1]).stat().st_size for path in runs)
    tracemalloc.start()
    try:
        list(WriteBucketFn(str(tmp_path), write_index=False).process((0, runs)))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 0.6 * run_bytes, (peak, run_bytes)  # the runs are read from their files a frame at a time


def test_a_large_bundle_emits_its_runs_early(monkeypatch, tmp_path):
    """The DirectRunner may run the whole corpus as one bundle: past RUN_BUFFER_BYTES the runs
    are emitted, so AssignBucketsFn never holds more than that as objects."""
    import pipelines.stages.write_shards as sharding

    samples = _bucket_samples(400, 2)
    total = sum(encoded_size(s) for s in samples)
    monkeypatch.setattr(sharding, "RUN_BUFFER_BYTES", sum(held_bytes(s) for s in samples) // 4)
    fn, cfg = AssignBucketsFn(str(tmp_path)), ShardsConfig(target_bytes=total // 2)
    fn.start_bundle()
    early = [run for k in range(0, len(samples), 20)
             for run in fn.process(SpilledSamples(spill(str(tmp_path), encode(samples[k:k + 20])), 0), total, cfg)]
    late = [wv.value for wv in fn.finish_bundle()]
    assert len(early) >= 3 * num_buckets(total, cfg)  # emitted at least three times before the bundle's end
    runs = [_read(path) for _, path in early + late]
    assert sorted(map(repr, (s for run in runs for s in run))) == sorted(map(repr, samples))
    assert all(run == sorted(run, key=sample_order) for run in runs)


def test_a_bundle_of_short_documents_holds_its_bound_in_objects_not_in_encoded_bytes(monkeypatch, tmp_path):
    """Issue 38: the buffer was counted in encoded bytes, which a short document's objects take
    several times over, so at 16x a quarter of the demo corpus the bundle held 135 MB for 32 MB."""
    import pipelines.stages.write_shards as sharding

    rng = np.random.default_rng(3)
    samples = [encode_sample((Doc(f"src/f.jsonl:{i}", "x" * 40, "src"), rng.integers(0, 8000, 8).astype(np.uint16)))
               for i in range(8000)]
    held, encoded = sum(held_bytes(s) for s in samples), sum(encoded_size(s) for s in samples)
    assert held > 8 * encoded  # 8 tokens: 32 encoded bytes, about 400 bytes of objects
    bound = held // 16
    monkeypatch.setattr(sharding, "RUN_BUFFER_BYTES", bound)
    fn, cfg = AssignBucketsFn(str(tmp_path)), ShardsConfig(num_shards=2)
    files = [SpilledSamples(spill(str(tmp_path), encode(samples[k:k + 100])), 0) for k in range(0, len(samples), 100)]
    del samples
    fn.start_bundle()
    tracemalloc.start()
    try:
        runs = [run for spilled in files for run in fn.process(spilled, encoded, cfg)]
        runs += [wv.value for wv in fn.finish_bundle()]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(runs) >= 2 * 15  # each bucket's run written 15 times or more
    assert peak < 2.5 * bound, (peak, bound)  # the buffer, its sort and a run's encoding at once


def test_a_job_with_a_given_tokenizer_that_keeps_no_document_fails_and_commits_nothing(tmp_path, capsys):
    """Issue 15: it used to commit an empty manifest ("committed 0 shards") and succeed; without
    --tokenizer the same input fails in tokenizer training, so it fails here too, saying why."""
    from pipelines.job import run
    from pipelines.stages.tokenize import EmptySampleError

    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"id": f"d{i}", "text": f"short text {i}"}) + "\n"
                                               for i in range(5)))
    model = train_sentencepiece(["alpha beta gamma"] * 50, TokenizerConfig(vocab_size=300))
    (tmp_path / "tok.model").write_bytes(model)
    cfg = synthetic_config()
    cfg.tokenizer.path = str(tmp_path / "tok.model")
    cfg.clean.min_chars = 10_000  # every document filtered
    with pytest.raises(EmptySampleError, match=r"no document was kept, so no shard was written; of 5 records read: "
                                               r"5 filtered \(too_short: 5\); check the settings of the steps"):
        run(str(tmp_path / "in.jsonl"), str(tmp_path / "out"), cfg)
    assert "committed" not in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_an_empty_shard_set_is_committed_with_the_configured_layout():
    model = trained_file(["alpha beta gamma"] * 50, TokenizerConfig(vocab_size=300))
    fs = fsspec.filesystem("memory")
    for layout in ("documents", "token_blocks"):
        manifest = commit_shards(f"memory://colaflow-empty-{layout}", ShardsConfig(layout=layout), [],
                                 tokenizer_output(model, TokenizerConfig()))
        saved = json.loads(fs.cat_file(f"/colaflow-empty-{layout}/manifest.json"))
        assert manifest.layout == saved["layout"] == layout
        fs.rm(f"/colaflow-empty-{layout}", recursive=True)


def test_the_tokenizer_files_are_made_once_for_the_training_and_validation_sets(tmp_path, monkeypatch):
    """transformers' conversion of a tokenizer takes tens of seconds for a 100k vocabulary: made once a run."""
    import pipelines.stages.write_shards as write_shards
    from pipelines.job import run

    made = []
    real = write_shards.folder_files
    monkeypatch.setattr(write_shards, "folder_files", lambda *a: made.append(1) or real(*a))  # the real one, counted
    texts = [f"document {i} tells of the river that ran past {i % 7} old stone walls" for i in range(40)]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"id": str(i), "text": t}) + "\n"
                                               for i, t in enumerate(texts)))
    (tmp_path / "tok.model").write_bytes(train_sentencepiece(texts, TokenizerConfig(vocab_size=400)))
    cfg = synthetic_config()
    cfg.tokenizer.path, cfg.split.val_fraction = str(tmp_path / "tok.model"), 0.3
    run(str(tmp_path / "in.jsonl"), str(tmp_path / "out"), cfg, report=False)
    assert len(made) == 1
    for name in ("tokenizer.model", "tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "out" / name).read_bytes() == (tmp_path / "out" / "val" / name).read_bytes()
    assert json.loads((tmp_path / "out" / "val" / "manifest.json").read_text())["tokenizer_identity"] == json.loads(
        (tmp_path / "out" / "manifest.json").read_text())["tokenizer_identity"]


def test_jsonl_parts_are_the_sorted_lines_merged_from_bounded_runs(monkeypatch, tmp_path):
    """Issue 38: the listing's lines reach the part writer as sorted runs in the spill folder (a
    bundle holds at most JSONL_RUN_BYTES of them), and each part is their merge: the same bytes as
    all its lines sorted at once."""
    import pipelines.io.output as output
    from pipelines.stages.clean import stable_bucket

    monkeypatch.setattr(output, "JSONL_RUN_BYTES", 4000)
    rng = np.random.default_rng(5)
    lines = [json.dumps({"id": f"in.jsonl/{int(i)}", "note": "é\u2028" * int(i % 3), "kind": "exact"},
                        ensure_ascii=False) for i in rng.integers(0, 10_000, 600)]
    with beam.Pipeline() as p:
        p | beam.Create(lines, reshuffle=False) | output.WriteJsonl(str(tmp_path / "dups"), str(tmp_path / "spill"))
    parts = {}
    for line in lines:
        parts.setdefault(stable_bucket(line, output.JSONL_PARTS), []).append(line)
    assert sorted(f.name for f in (tmp_path / "dups").iterdir()) == [f"part-{k:05d}.jsonl" for k in sorted(parts)]
    for k, part in parts.items():
        assert (tmp_path / "dups" / f"part-{k:05d}.jsonl").read_bytes() == "".join(
            f"{line}\n" for line in sorted(part)).encode("utf-8")
    assert len(list((tmp_path / "spill").iterdir())) > 3 * len(parts)  # spilled early, several runs per part
    with beam.Pipeline() as p:
        p | beam.Create([]) | output.WriteJsonl(str(tmp_path / "none"), str(tmp_path / "spill"))
    assert not (tmp_path / "none").exists()  # no line, no file


def test_bucket_runs_hold_an_item_whether_or_not_the_caller_reads_what_add_returns(tmp_path):
    # add() was a generator: an item whose returned iterator went unread was never held, dropped silently
    from pipelines.stages.write_shards import BucketRuns

    runs = BucketRuns(str(tmp_path), limit=100, encode_run=lambda items: "".join(sorted(items)).encode())
    runs.add(3, "b", 1)
    runs.add(3, "a", 1)
    runs.add(1, "c", 1)
    written = runs.flush()
    assert [bucket for bucket, _ in written] == [1, 3]
    assert [open(path, "rb").read() for _, path in written] == [b"c", b"ab"]
    assert runs.add(2, "x" * 200, 200) and not runs.flush()  # past the limit: written at once
