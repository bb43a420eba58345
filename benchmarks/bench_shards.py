"""Shard write/read throughput: colaflow vs webdataset on the same samples, one run, ratios printed.

    python benchmarks/bench_shards.py [samples=20000] [max_tokens=2000] [repeats=3] [dir=/tmp/bench_shards]

Samples are text documents (random uint16 tokens of random length, zstd-compressed,
plus JSON metadata), encoded once; both writers get identical member bytes, so the
MB/s figures (member bytes per second, best of ``repeats``) compare the tar layers:
``ShardSequenceWriter`` vs ``webdataset.ShardWriter``, ``iter_raw`` vs ``webdataset.WebDataset``
(no decoding), and random access ``read_sample`` (with and without its per-member header
check) vs ``wids.ShardListDataset``.
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import os
import shutil
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from shards import Manifest, ShardSequenceWriter, encode_text_sample, iter_raw, read_sample  # noqa: E402
from colaflow.config import ConfigError, load_config  # noqa: E402
from shards.io.index import build_shard_index, dali_index_path, write_dali_index, write_wids_index  # noqa: E402
from colaflow.wording import help_text  # noqa: E402


@dataclasses.dataclass
class BenchConfig:
    """Benchmark size; ``dir`` is wiped and refilled."""

    samples: int = 20000
    max_tokens: int = 2000
    shard_bytes: int = 64_000_000
    repeats: int = 3
    random_reads: int = 2000
    dir: str = "/tmp/bench_shards"
    seed: int = 0


def make_samples(cfg: BenchConfig) -> list[tuple[str, dict[str, bytes], int]]:
    """``cfg.samples`` random documents as ``(key, encoded fields, tokens)``."""
    rng = np.random.default_rng(cfg.seed)
    out = []
    for i in range(cfg.samples):
        n = int(rng.integers(16, cfg.max_tokens))
        tokens = rng.integers(0, 32000, n).astype(np.uint16)
        out.append((f"doc{i:08d}", encode_text_sample(tokens, {"id": i, "source": "bench"}), n))
    return out


def best(fn, repeats: int) -> float:
    """Fastest wall time in seconds of ``repeats`` calls."""
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main(argv: list[str]) -> None:
    """Write and read the same samples with colaflow and webdataset/wids; print the ratios."""
    import webdataset as wds
    import wids

    ap = argparse.ArgumentParser(description=help_text(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                    help=f"BenchConfig fields: {', '.join(f.name for f in dataclasses.fields(BenchConfig))}")
    try:
        cfg = load_config(BenchConfig, None, ap.parse_args(argv).overrides)
    except ConfigError as e:
        ap.error(str(e))  # exit 2, with the usage line
    samples = make_samples(cfg)
    mb = sum(len(v) for _, f, _ in samples for v in f.values()) / 1e6
    ours, theirs = os.path.join(cfg.dir, "colaflow"), os.path.join(cfg.dir, "webdataset")

    def write_ours():
        shutil.rmtree(ours, ignore_errors=True)
        w = ShardSequenceWriter(ours, max_bytes=cfg.shard_bytes)
        for key, fields, n in samples:
            w.write(key, fields, n)
        Manifest(shards=w.close()).save(ours)

    def write_theirs():
        shutil.rmtree(theirs, ignore_errors=True)
        os.makedirs(theirs)
        with wds.ShardWriter(os.path.join(theirs, "shard-%06d.tar"), maxsize=cfg.shard_bytes, maxcount=10**9,
                             verbose=0) as sw:
            for key, fields, _ in samples:
                sw.write({"__key__": key, **fields})

    rows = [("write", mb / best(write_ours, cfg.repeats), mb / best(write_theirs, cfg.repeats))]
    our_paths = sorted(glob.glob(os.path.join(ours, "*.tar")))
    their_paths = sorted(glob.glob(os.path.join(theirs, "*.tar")))

    def read_ours():
        assert sum(1 for p in our_paths for _ in iter_raw(p)) == cfg.samples

    def read_theirs():
        assert sum(1 for _ in wds.WebDataset(their_paths, shardshuffle=False)) == cfg.samples

    rows.append(("stream read", mb / best(read_ours, cfg.repeats), mb / best(read_theirs, cfg.repeats)))

    indexes = [build_shard_index(p) for p in our_paths]
    for p, ix in zip(our_paths, indexes):
        write_dali_index(ix, dali_index_path(p))
    write_wids_index(indexes, os.path.join(ours, "shardindex.json"))
    order = np.random.default_rng(cfg.seed).integers(0, cfg.samples, cfg.random_reads)
    starts = np.cumsum([0] + [ix.nsamples for ix in indexes])
    ds = wids.ShardListDataset(os.path.join(ours, "shardindex.json"), cache_dir=os.path.join(cfg.dir, "wids"),
                               transformations=[])
    ds[0]  # wids copies shards into its cache on first touch: keep that out of the timing
    picked_mb = sum(len(v) for i in order for v in samples[i][1].values()) / 1e6

    files = [open(p, "rb") for p in our_paths]  # kept open, as wids keeps its shards mapped

    def random_ours(check: bool):
        for i in order:
            s = int(np.searchsorted(starts, i, side="right") - 1)
            read_sample(our_paths[s], indexes[s].samples[i - starts[s]], decode=False, fileobj=files[s], check=check)

    def random_theirs():
        for i in order:
            ds[int(i)]

    theirs_random = picked_mb / best(random_theirs, cfg.repeats)
    rows.append(("random read", picked_mb / best(lambda: random_ours(False), cfg.repeats), theirs_random))
    rows.append(("random+check", picked_mb / best(lambda: random_ours(True), cfg.repeats), theirs_random))
    ds.close()
    for f in files:
        f.close()
    print(f"{cfg.samples} samples, {mb:.1f} MB of member bytes, {len(our_paths)} shards; best of {cfg.repeats}")
    print(f"{'':12} {'colaflow MB/s':>14} {'baseline MB/s':>14} {'ratio':>7}  baseline")
    names = {"write": "webdataset.ShardWriter", "stream read": "webdataset.WebDataset",
             "random read": "wids.ShardListDataset", "random+check": "wids.ShardListDataset"}
    for what, a, b in rows:
        print(f"{what:12} {a:14.1f} {b:14.1f} {a / b:7.2f}  {names[what]}")


if __name__ == "__main__":
    main(sys.argv[1:])
