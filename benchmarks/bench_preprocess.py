"""Benchmark: the Beam pipeline vs a plain Python loop doing the same transforms on the same data.

Both sides parse, clean, redact, exact-dedup (smallest id wins), train the tokenizer on the
same hash-ordered sample, tokenise and write the same bucketed shards, so their manifests
must match; the script checks that and prints input MB/s for each and the ratio.

    python benchmarks/bench_preprocess.py [--input 'data/corpus/*.jsonl'] [--workers 2]

The demo corpus is written to ``data/corpus`` first when the default input is missing.
"""
from __future__ import annotations

import argparse
import glob
import os
import sys
import tempfile
import time
from collections import defaultdict

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pipelines.cleaning import clean_text, content_hash, length_reason, stable_bucket  # noqa: E402
from pipelines.config import PipelineConfig  # noqa: E402
from pipelines.corpus import write_corpus  # noqa: E402
from pipelines.job import run  # noqa: E402
from pipelines.pii import redact  # noqa: E402
from pipelines.quality import quality_reason  # noqa: E402
from pipelines.records import Doc, file_format, iter_units, parse_unit  # noqa: E402
from pipelines.sharding import encode_sample, encoded_size, num_buckets  # noqa: E402
from pipelines.tokenizer import SmallestHashSample, load_processor, token_dtype, train_sentencepiece  # noqa: E402
from shards import Manifest, ShardInfo, TarShardWriter, shard_name  # noqa: E402


def plain_loop(paths: list[str], out: str, cfg: PipelineConfig) -> Manifest:
    """The same transforms as :func:`pipelines.job.build`, as one sequential Python loop."""
    keepers: dict[str, Doc] = {}
    for path in paths:
        fmt = file_format(path, cfg.input)
        with open(path, "rb") as f:
            for line, raw in iter_units(f, fmt):
                doc = parse_unit(path, line, raw, fmt, cfg.input)
                if not isinstance(doc, Doc):
                    continue
                text = clean_text(doc.text, cfg.clean)
                if length_reason(text, cfg.clean) or quality_reason(text, cfg.quality):
                    continue
                doc = Doc(doc.id, redact(text, cfg.pii)[0], doc.source)
                h = content_hash(doc.text)
                best = keepers.get(h)
                if best is None or (doc.id, doc.text) < (best.id, best.text):
                    keepers[h] = doc
    sampler = SmallestHashSample(cfg.tokenizer.sample_max_bytes)
    acc = sampler.create_accumulator()
    for h, doc in keepers.items():
        if int(h[:16], 16) < cfg.tokenizer.sample_fraction * 2**64:
            acc = sampler.add_input(acc, (h, doc.text))
    model = train_sentencepiece(sampler.extract_output(acc), cfg.tokenizer)
    sp = load_processor(model)
    dtype = token_dtype(sp.get_piece_size())
    samples = [encode_sample((d, np.asarray(sp.encode(d.text), dtype=dtype))) for d in keepers.values()]
    n = num_buckets(sum(encoded_size(s) for s in samples), cfg.shards)
    buckets = defaultdict(list)
    for s in samples:
        buckets[stable_bucket(s[0], n)].append(s)
    infos = []
    for index, bucket in enumerate(sorted(buckets)):
        with TarShardWriter(os.path.join(out, shard_name(cfg.shards.prefix, index))) as w:
            last = None
            for key, fields, n_tokens, _, _ in sorted(buckets[bucket], key=lambda s: (s[0], s[1]["json"])):
                if key != last:
                    w.write(key, fields, tokens=n_tokens)
                last = key
        infos.append(w.info)
    return Manifest(shards=[ShardInfo(*[getattr(i, f) for f in ("name", "samples", "tokens", "bytes", "sha256")])
                            for i in infos], vocab_size=sp.get_piece_size(), token_dtype=dtype.name)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--input", default="data/corpus/*.jsonl")
    ap.add_argument("--workers", type=int, default=2, help="DirectRunner multi_processing workers")
    args = ap.parse_args()
    if args.input == "data/corpus/*.jsonl" and not glob.glob(args.input):
        write_corpus("data/corpus")
    paths = sorted(glob.glob(args.input))
    mb = sum(os.path.getsize(p) for p in paths) / 1e6
    cfg = PipelineConfig()
    cfg.shards.write_index = False  # the loop writes no .idx files; compare the same work
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        os.makedirs(os.path.join(tmp, "loop"))
        loop_manifest = plain_loop(paths, os.path.join(tmp, "loop"), cfg)
        results["plain Python loop"] = time.perf_counter() - t
        runs = {"Beam DirectRunner (in-memory)": [],
                f"Beam DirectRunner (multi_processing, {args.workers} workers)": [
                    "--direct_running_mode=multi_processing", f"--direct_num_workers={args.workers}"]}
        same = True
        for name, beam_args in runs.items():
            out = os.path.join(tmp, name.split()[2].strip("(,"))
            t = time.perf_counter()
            run(args.input, out, cfg, beam_args)
            results[name] = time.perf_counter() - t
            beam_manifest = Manifest.load(out)
            same &= [s.sha256 for s in beam_manifest.shards] == [s.sha256 for s in loop_manifest.shards]
    print(f"\ninput: {len(paths)} files, {mb:.1f} MB ({args.input})")
    base = results["plain Python loop"]
    for name, seconds in results.items():
        print(f"{name:<50} {seconds:7.1f} s  {mb / seconds:6.2f} MB/s  ratio vs loop {base / seconds:5.2f}x")
    print(f"byte-identical shards across all three: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
