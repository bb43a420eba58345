"""Text loader throughput and packing efficiency vs a plain ``webdataset.WebDataset`` + DataLoader.

Both read the same local shards (random token documents with a long-tailed, log-normal length
distribution) with the same number of DataLoader workers and the same worker start method, and
produce ``[B, seq_len]`` int64 batches:

* colaflow: global sample-level order, exact resume state, best-fit-decreasing packing
  (and token-budget batching);
* baseline: ``WebDataset`` (shard-level split over workers, no global order, no exact resume),
  each document cut into ``seq_len`` chunks, one chunk per row, padded to ``seq_len``.

Prints samples/s, tokens/s (document tokens delivered), the share of real tokens per batch
(padding efficiency) and the ratios colaflow / baseline. Timings include worker start-up.

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
from loaders.dataset import build_text_loader  # noqa: E402
from shards import Manifest, ShardSequenceWriter, encode_text_sample  # noqa: E402


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
    """Baseline: WebDataset samples -> seq_len chunks, one per row, padded, ``batch`` rows per batch."""

    def __init__(self, urls: list[str], seq_len: int, batch: int):
        self.urls, self.seq_len, self.batch = urls, seq_len, batch

    def __iter__(self):
        rows = []
        for sample in wds.WebDataset(self.urls, shardshuffle=False, empty_check=False):
            toks = _decode_tokens(sample)
            for i in range(0, len(toks), self.seq_len):
                row = np.zeros(self.seq_len, np.int64)
                chunk = toks[i:i + self.seq_len]
                row[:len(chunk)] = chunk
                rows.append((row, len(chunk)))
                if len(rows) == self.batch:
                    yield self._emit(rows)
                    rows = []
        if rows:
            yield self._emit(rows)

    @staticmethod
    def _emit(rows):
        ids = torch.from_numpy(np.stack([r for r, _ in rows]))
        return ids, sum(n for _, n in rows)


def run_colaflow(shards: str, args, batching: str) -> dict:
    cfg = DataConfig(manifest=shards, seq_len=args.seq_len, micro_batch_size=args.batch, num_workers=args.workers,
                     batching=batching, max_tokens=args.seq_len * args.batch, pack_window=256,
                     worker_start=args.start, pin_memory=False)
    loader = build_text_loader(cfg)
    t0 = time.perf_counter()
    for _ in loader:
        pass
    dt = time.perf_counter() - t0
    m = loader.metrics()
    return {"seconds": dt, "samples": m["consumed"], "tokens": m["doc_tokens"],
            "efficiency": m["padding_efficiency"], "wait": m["data_wait_seconds"]}


def run_baseline(shards: str, args) -> dict:
    manifest = Manifest.load(shards)
    urls = [os.path.join(shards, s.name) for s in manifest.shards]
    dl = DataLoader(_PaddedRows(urls, args.seq_len, args.batch), batch_size=None, num_workers=args.workers,
                    multiprocessing_context=args.start if args.workers else None)
    t0 = time.perf_counter()
    tokens = slots = 0
    for ids, n in dl:
        tokens += n
        slots += ids.numel()
    dt = time.perf_counter() - t0
    return {"seconds": dt, "samples": manifest.total_samples, "tokens": tokens, "efficiency": tokens / slots}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=6000)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--start", default="forkserver", help="worker start method for both loaders")
    ap.add_argument("--repeats", type=int, default=2, help="runs per loader; the best is reported")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as shards:
        total = write_shards(shards, args.docs)
        print(f"{args.docs} docs, {total} tokens, seq_len {args.seq_len}, batch {args.batch}, "
              f"{args.workers} workers ({args.start})")
        results = {
            "colaflow packed": min((run_colaflow(shards, args, "packed") for _ in range(args.repeats)),
                                   key=lambda r: r["seconds"]),
            "colaflow token_budget": min((run_colaflow(shards, args, "token_budget") for _ in range(args.repeats)),
                                         key=lambda r: r["seconds"]),
            "webdataset padded": min((run_baseline(shards, args) for _ in range(args.repeats)),
                                     key=lambda r: r["seconds"]),
        }
    base = results["webdataset padded"]
    print(f"{'loader':24s} {'samples/s':>10s} {'tokens/s':>11s} {'real tokens':>11s} {'ratio tok/s':>11s}")
    for name, r in results.items():
        assert r["tokens"] == total, f"{name} delivered {r['tokens']} of {total} tokens"
        sps, tps = r["samples"] / r["seconds"], r["tokens"] / r["seconds"]
        print(f"{name:24s} {sps:10.0f} {tps:11.0f} {r['efficiency']:11.2%} "
              f"{tps / (base['tokens'] / base['seconds']):10.2f}x")
    packed = results["colaflow packed"]
    print(f"padding efficiency: packed {packed['efficiency']:.2%} vs fixed-length padding {base['efficiency']:.2%} "
          f"-> {packed['efficiency'] / base['efficiency']:.2f}x real tokens per batch "
          f"(= {base['efficiency'] and packed['efficiency'] / base['efficiency']:.2f}x fewer steps per epoch)")


if __name__ == "__main__":
    main()
