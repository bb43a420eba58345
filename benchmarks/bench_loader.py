"""Text loader throughput and packing efficiency vs a plain ``webdataset.WebDataset`` + DataLoader.

Both read the same local shards (random token documents with a long-tailed, log-normal length
distribution, one sample per document) with the same number of worker processes (colaflow's own
:mod:`loaders.worker.pool`; the baseline's DataLoader workers started with ``--start``), and
produce ``[B, seq_len]`` int64 ``input_ids`` and ``labels`` (-100 where no loss is taken):

* colaflow: global sample-level order, exact resume state, best-fit-decreasing packing
  (and token-budget batching), plus position and document ids;
* baseline: ``WebDataset`` (shard-level split over workers, no global order, no exact resume),
  each document cut into ``seq_len`` chunks, one chunk per row, padded to ``seq_len``.

Each loader runs once unmeasured (warms the page cache and colaflow's node-local shard index),
then ``--repeats`` times; the best run is reported. Per loader:
start-up (seconds to the first batch: worker start, imports), steady-state samples/s and real
tokens/s (tokens that carry a loss) after the first batch, the same end to end, and the share of
batch slots holding document tokens. Ratios are colaflow / baseline.

    python benchmarks/bench_loader.py [--docs 6000] [--seq-len 512] [--batch 8] [--workers 2]
"""
from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import time

import numpy as np
import torch
import webdataset as wds
import zstandard
from torch.utils.data import DataLoader
from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from loaders.config import DataConfig  # noqa: E402
from loaders.rank.loader import build_text_loader  # noqa: E402
from shards import Manifest, ShardSequenceWriter, encode_text_sample  # noqa: E402
from colaflow.wording import help_text  # noqa: E402


def write_shards(directory: str, n_docs: int, seed: int = 0) -> int:
    """Write ``n_docs`` documents (log-normal lengths, 1..4000 tokens); returns the token count."""
    rng = np.random.default_rng(seed)
    lengths = np.minimum(rng.lognormal(5.0, 1.2, n_docs).astype(int) + 1, 4000)
    w = ShardSequenceWriter(directory, max_samples=500)
    for i, n in enumerate(tqdm(lengths, desc="writing shards", unit="doc")):
        toks = rng.integers(0, 32000, int(n)).astype(np.uint16)
        w.write(f"doc{i:07d}", encode_text_sample(toks, {"id": i}), tokens=int(n))
    Manifest(shards=w.close(), vocab_size=32000).save(directory)
    return int(lengths.sum())


def _decode_tokens(sample: dict) -> np.ndarray:
    raw = zstandard.ZstdDecompressor().decompressobj().decompress(sample["tokens.npy.zst"])
    return np.load(io.BytesIO(raw), allow_pickle=False).astype(np.int64)


class _PaddedRows(torch.utils.data.IterableDataset):
    """Baseline: WebDataset samples -> seq_len chunks, one per row, padded, ``batch`` rows per batch.

    Yields ``(input_ids, labels, samples finished in the batch, document tokens)``.
    """

    def __init__(self, urls: list[str], seq_len: int, batch: int):
        self.urls, self.seq_len, self.batch = urls, seq_len, batch

    def __iter__(self):
        rows, done = [], 0
        for sample in wds.WebDataset(self.urls, shardshuffle=False, empty_check=False):
            toks = _decode_tokens(sample)
            for i in range(0, len(toks), self.seq_len):
                rows.append(toks[i:i + self.seq_len])
                done += i + self.seq_len >= len(toks)
                if len(rows) == self.batch:
                    yield self._emit(rows, done)
                    rows, done = [], 0
        if rows:
            yield self._emit(rows, done)

    def _emit(self, rows, done):
        ids = np.zeros((len(rows), self.seq_len), np.int64)
        labels = np.full((len(rows), self.seq_len), -100, np.int64)
        for r, chunk in enumerate(rows):
            ids[r, :len(chunk)] = chunk
            labels[r, :len(chunk) - 1] = chunk[1:]
        return torch.from_numpy(ids), torch.from_numpy(labels), done, sum(len(c) for c in rows)


def _measure(batches) -> dict:
    """Consume ``(samples, real tokens, document tokens, slots)`` per batch; times in seconds."""
    t0 = time.perf_counter()
    first = None
    total = [0, 0, 0, 0]
    after = [0, 0]
    for counts in batches:
        if first is None:
            first = time.perf_counter() - t0
        else:
            after[0] += counts[0]
            after[1] += counts[1]
        total = [a + b for a, b in zip(total, counts)]
    dt = time.perf_counter() - t0
    steady = max(dt - first, 1e-9)
    return {"startup": first, "seconds": dt, "samples": total[0], "real": total[1], "tokens": total[2],
            "efficiency": total[2] / total[3], "steady_sps": after[0] / steady, "steady_rtps": after[1] / steady}


def run_colaflow(shards: str, args, batching: str) -> dict:
    """One pass of colaflow's text loader over ``shards`` in ``batching`` mode; throughput numbers."""
    cfg = DataConfig(manifest=shards, seq_len=args.seq_len, micro_batch_size=args.batch, num_workers=args.workers,
                     batching=batching, max_tokens=args.seq_len * args.batch, pack_window=256 * args.seq_len,
                     pin_memory=False, index_dir=os.path.join(shards, "index"))

    def counts():
        for b in build_text_loader(cfg):
            finished = sum(1 for _, c, n in b.consumed if c == n - 1)
            yield finished, b.num_real_tokens, b.num_doc_tokens, b.input_ids.numel()

    return _measure(counts())


def run_baseline(shards: str, args) -> dict:
    """One pass of the padded-rows baseline (WebDataset samples, one chunk per row, torch DataLoader)."""
    manifest = Manifest.load(shards)
    urls = [os.path.join(shards, s.name) for s in manifest.shards]
    dl = DataLoader(_PaddedRows(urls, args.seq_len, args.batch), batch_size=None, num_workers=args.workers,
                    multiprocessing_context=args.start if args.workers else None)

    def counts():
        for ids, labels, done, doc_tokens in dl:
            yield done, int((labels != -100).sum()), doc_tokens, ids.numel()

    return _measure(counts())


def _best(run, repeats: int) -> dict:
    run()  # warm-up: forkserver started, page cache and shard index warm
    return min((run() for _ in range(repeats)), key=lambda r: r["seconds"])


def main(argv=None) -> None:
    """Run colaflow and the baseline on the same shards and print the ratios."""
    ap = argparse.ArgumentParser(description=help_text(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=6000)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--start", default="forkserver", help="worker start method for both loaders")
    ap.add_argument("--repeats", type=int, default=2, help="measured runs per loader; the best is reported")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as shards:
        total = write_shards(shards, args.docs)
        print(f"{args.docs} docs, {total} tokens, seq_len {args.seq_len}, batch {args.batch}, "
              f"{args.workers} workers ({args.start})")
        results = {
            "colaflow packed": _best(lambda: run_colaflow(shards, args, "packed"), args.repeats),
            "colaflow token_budget": _best(lambda: run_colaflow(shards, args, "token_budget"), args.repeats),
            "webdataset padded": _best(lambda: run_baseline(shards, args), args.repeats),
        }
    base = results["webdataset padded"]
    print(f"{'loader':22s} {'start s':>7s} {'steady samples/s':>16s} {'steady real tok/s':>17s} "
          f"{'e2e samples/s':>13s} {'e2e real tok/s':>14s} {'doc tok/slot':>12s}")
    for name, r in results.items():
        assert r["tokens"] == total and r["samples"] == args.docs, f"{name}: {r['samples']} samples, {r['tokens']} tokens"
        print(f"{name:22s} {r['startup']:7.2f} {r['steady_sps']:16.0f} {r['steady_rtps']:17.0f} "
              f"{r['samples'] / r['seconds']:13.0f} {r['real'] / r['seconds']:14.0f} {r['efficiency']:12.2%}")
    print("ratios colaflow / webdataset (samples/s; real tokens/s is the same ratio: same documents):")
    for name in ("colaflow packed", "colaflow token_budget"):
        r = results[name]
        print(f"  {name:22s} steady {r['steady_sps'] / base['steady_sps']:5.2f}x   "
              f"end to end {base['seconds'] / r['seconds']:5.2f}x   start-up {r['startup'] - base['startup']:+.2f} s")
    packed = results["colaflow packed"]
    print(f"padding efficiency: packed {packed['efficiency']:.2%} vs fixed-length padding {base['efficiency']:.2%} "
          f"-> {packed['efficiency'] / base['efficiency']:.2f}x real tokens per batch "
          f"(= {packed['efficiency'] / base['efficiency']:.2f}x fewer steps per epoch)")


if __name__ == "__main__":
    main()
