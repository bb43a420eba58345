"""Benchmark: the Beam pipeline vs a plain Python loop doing the same transforms on the same data.

Both sides parse, clean, redact, exact-dedup (smallest id wins, then the first in input order), train the tokenizer on the
same hash-ordered sample, tokenise and write the same bucketed shards, so their manifests
must match; the script checks that and prints input MB/s for each and the ratio.

    python benchmarks/bench_preprocess.py [--input 'data/corpus/*.jsonl'] [--workers 2] [--near]
        [--no-multi] [--datatrove]

``--near`` turns MinHash-LSH near-dedup on for both sides; ``--datatrove`` also runs the
same cleaning, filters and MinHash with datatrove (``benchmarks/datatrove_baseline.py``)
and prints its time against ours. Wall time and process CPU time are both printed: other
work on the machine slows wall time, CPU time much less.

The demo corpus is written to ``data/corpus`` first when the default input is missing.
"""
from __future__ import annotations

import argparse
import glob
import os
import resource
import sys
import tempfile
import time
from collections import defaultdict

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import datatrove_baseline  # noqa: E402

from pipelines.stages.clean import content_hash, stable_bucket  # noqa: E402
from pipelines.config import PipelineConfig  # noqa: E402
from examples.demo.corpus import write_corpus  # noqa: E402
from pipelines.job import run  # noqa: E402
from pipelines.stages.near_dedup import band_keys, minhash_batch, similarity  # noqa: E402
from pipelines.stages.filters import build_steps  # noqa: E402
from pipelines.stages.step import run_steps  # noqa: E402
from pipelines.io.reading import iter_units  # noqa: E402
from pipelines.records import Doc, file_format, parse_unit  # noqa: E402
from pipelines.stages.write_shards import encode_sample, encoded_size, num_buckets, sample_order  # noqa: E402
from shards.format.layouts import get_layout  # noqa: E402
from pipelines.stages.tokenize import SmallestHashSample, identity, token_dtype, trained_file  # noqa: E402
from shards.tokenizers import build  # noqa: E402
from shards import Manifest, ShardInfo, TarShardWriter, shard_name  # noqa: E402


def near_dedup(keepers: dict[str, Doc], cfg) -> dict[str, Doc]:
    """MinHash-LSH as in :class:`pipelines.stages.near_dedup.NearDedup`: a document and the smallest id of each
    of its band buckets are an edge when their estimated Jaccard similarity is >= threshold; each connected
    component keeps its smallest id."""
    docs = list(keepers.items())
    sigs = {}
    for i in range(0, len(docs), 512):
        batch = [d for _, d in docs[i:i + 512]]
        sigs.update(zip((d.id for d in batch), minhash_batch([d.text for d in batch], cfg)))
    bucket_keeper: dict = {}
    bands = {doc_id: band_keys(sig, cfg.bands) for doc_id, sig in sigs.items()}
    for doc_id, keys in bands.items():
        for key in keys:
            if key not in bucket_keeper or doc_id < bucket_keeper[key]:
                bucket_keeper[key] = doc_id
    parent = {doc_id: doc_id for doc_id in sigs}

    def root(x: str) -> str:
        while parent[x] != x:
            x = parent[x]
        return x

    for doc_id, keys in bands.items():
        for keeper in {bucket_keeper[k] for k in keys} - {doc_id}:
            if similarity(sigs[doc_id], sigs[keeper]) >= cfg.threshold:
                a, b = root(doc_id), root(keeper)
                parent[max(a, b)] = min(a, b)
    return {h: d for h, d in docs if root(d.id) == d.id}


def plain_loop(paths: list[str], out: str, cfg: PipelineConfig) -> Manifest:
    """The same transforms as :func:`pipelines.job.build`, as one sequential Python loop."""
    keepers: dict[str, Doc] = {}
    steps = build_steps(cfg)
    for step in steps:
        step.setup()
    sampler = SmallestHashSample(cfg.tokenizer.sample_max_bytes)
    acc = sampler.create_accumulator()
    for path in paths:
        fmt = file_format(path, cfg.input)
        with open(path, "rb") as f:
            for unit in iter_units(f, path, fmt, cfg.input):
                parsed = parse_unit(unit.path, unit.line, unit.raw, unit.fmt, cfg.input, unit.offset, unit.size)
                doc = run_steps(parsed, steps).doc if isinstance(parsed, Doc) else None
                if doc is None:
                    continue
                h = content_hash(doc.text)
                if int(h[:16], 16) < cfg.tokenizer.sample_fraction * 2**64:  # sample before dedup
                    acc = sampler.add_input(acc, (h, doc.text))
                best = keepers.get(h)
                if best is None or doc.id < best.id:  # the smallest id, the first in input order among equal ids
                    keepers[h] = doc
    if cfg.dedup.near:
        keepers = near_dedup(keepers, cfg.dedup)
    tok = build(trained_file(sampler.extract_output(acc), cfg.tokenizer))
    ends = identity(tok, cfg.tokenizer)
    head, tail = [ends.bos_id] if ends.add_bos else [], [ends.eos_id] if ends.add_eos else []
    dtype = token_dtype(tok.vocab_size)
    docs = list(keepers.values())
    layout = get_layout(cfg.shards.layout)
    samples = [encode_sample((d, np.asarray(head + t + tail, dtype=dtype)), cfg.shards.store_text, cfg.shards.layout)
               for d, t in zip(docs, tok.encode_batch([d.text for d in docs])) if t]
    n = num_buckets(sum(encoded_size(s, cfg.shards.layout) for s in samples), cfg.shards)
    buckets = defaultdict(list)
    for s in samples:
        buckets[stable_bucket(s.key, n)].append(s)
    infos = []
    for index, bucket in enumerate(sorted(buckets)):
        with TarShardWriter(os.path.join(out, shard_name(cfg.shards.prefix, index))) as w:
            sink = layout.sink(w.write, cfg.shards.compression, cfg.shards.block_tokens)
            last = None
            for s in sorted(buckets[bucket], key=sample_order):
                if s.key != last:  # a second text under one id: the shard writer keeps the first too
                    sink.add(s)
                last = s.key
            sink.flush()
        infos.append(w.info)
    return Manifest(shards=[ShardInfo(*[getattr(i, f) for f in ("name", "samples", "tokens", "bytes", "sha256")])
                            for i in infos], vocab_size=tok.vocab_size, token_dtype=dtype.name)


def cpu_seconds() -> float:
    """CPU seconds of this process and its finished children (user + system)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def main() -> int:
    """Run the Beam job and the plain-Python baseline on the same corpus and print the ratio."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--input", default="data/corpus/*.jsonl")
    ap.add_argument("--workers", type=int, default=2, help="DirectRunner multi_processing workers")
    ap.add_argument("--near", action="store_true", help="MinHash-LSH near-dedup on (dedup.near=true)")
    ap.add_argument("--no-multi", action="store_true", help="skip the multi_processing run")
    ap.add_argument("--datatrove", action="store_true", help="also run the datatrove baseline (implies --near)")
    args = ap.parse_args()
    if args.input == "data/corpus/*.jsonl" and not glob.glob(args.input):
        write_corpus("data/corpus")
    paths = sorted(glob.glob(args.input))
    mb = sum(os.path.getsize(p) for p in paths) / 1e6
    cfg = PipelineConfig()
    cfg.shards.write_index = False  # the loop writes no .idx files; compare the same work
    cfg.quality.enabled = False  # as BENCHMARKS.md measured: the verse demo corpus fails the web-text rules
    args.near = args.near or args.datatrove
    cfg.dedup.near = args.near
    cfg.dedup.write_duplicates = False  # the loop does not list duplicates
    results, cpu = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        t, c = time.perf_counter(), cpu_seconds()
        os.makedirs(os.path.join(tmp, "loop"))
        loop_manifest = plain_loop(paths, os.path.join(tmp, "loop"), cfg)
        results["plain Python loop"], cpu["plain Python loop"] = time.perf_counter() - t, cpu_seconds() - c
        runs = {"Beam DirectRunner (in-memory)": []}
        if not args.no_multi:
            runs[f"Beam DirectRunner (multi_processing, {args.workers} workers)"] = [
                "--direct_running_mode=multi_processing", f"--direct_num_workers={args.workers}"]
        same = True
        for name, beam_args in runs.items():
            out = os.path.join(tmp, name.split()[2].strip("(,"))
            t, c = time.perf_counter(), cpu_seconds()
            run(args.input, out, cfg, beam_args, report=False)  # the loop writes no report either
            results[name], cpu[name] = time.perf_counter() - t, cpu_seconds() - c
            beam_manifest = Manifest.load(out)
            same &= [s.sha256 for s in beam_manifest.shards] == [s.sha256 for s in loop_manifest.shards]
        datatrove_note = None
        if args.datatrove:
            datatrove_note = datatrove_baseline.available()
            if datatrove_note is None:
                c = cpu_seconds()
                seconds, kept = datatrove_baseline.run_datatrove(
                    os.path.dirname(paths[0]), os.path.basename(args.input), os.path.join(tmp, "datatrove"))
                results["datatrove 0.10 (1 task, 1 worker)"] = seconds
                cpu["datatrove 0.10 (1 task, 1 worker)"] = cpu_seconds() - c
                stand_ins = "".join(f"; {s}" for s in datatrove_baseline.substitutes())  # slower than datatrove's own
                datatrove_note = (f"datatrove kept {kept:,} documents (no exact dedup, no tokenizer/shards"
                                  f"{stand_ins}); colaflow kept {beam_manifest.total_samples:,}")
    print(f"\ninput: {len(paths)} files, {mb:.1f} MB ({args.input}); near-dedup {'on' if args.near else 'off'}")
    base, base_cpu = results["plain Python loop"], cpu["plain Python loop"]
    print(f"{'':<50} {'wall':>7}    {'MB/s':>6}       {'cpu':>7}    {'MB/cpu-s':>8}  loop/this (wall, cpu)")
    for name, seconds in results.items():
        print(f"{name:<50} {seconds:7.1f} s  {mb / seconds:6.2f} MB/s  {cpu[name]:7.1f} s  {mb / cpu[name]:8.2f}"
              f"  {base / seconds:5.2f}x {base_cpu / cpu[name]:5.2f}x")
    if datatrove_note:
        print(datatrove_note)
    if "datatrove 0.10 (1 task, 1 worker)" in results:
        dt = "datatrove 0.10 (1 task, 1 worker)"
        print(f"datatrove time / colaflow Beam in-memory time: {results[dt] / results['Beam DirectRunner (in-memory)']:.2f}x "
              f"wall, {cpu[dt] / cpu['Beam DirectRunner (in-memory)']:.2f}x cpu")
    print(f"byte-identical shards across all runs: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
