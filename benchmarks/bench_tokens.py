"""Token shards on disk and through the loader: colaflow token blocks vs LitData vs the flat floor.

Corpora (real text, identical tokens in every layout): the demo corpus (Shakespeare paragraphs
and KJV chapters from ``examples.demo.corpus``, tokenised with a 4096-piece sentencepiece model
trained on it) and a long-document corpus made by concatenating each source's documents, in
order, to about 2,000 tokens.

Bytes per token (every file a reader needs, indexes included):

* colaflow ``token_blocks`` raw and zstd (``TokenBlockWriter``; plus DALI ``.idx`` files,
  ``shardindex.json`` and ``manifest.json``);
* LitData ``optimize()`` in the ``TokensLoader`` layout, plain and ``compression="zstd"``;
* the flat floor: one ``uint16`` file plus ``int64`` document offsets (Megatron indexed dataset).

Loader passes (rows of ``--seq-len`` tokens, ``--batch`` rows, shuffle on; 0 and 2 workers;
``--rounds`` interleaved rounds, median reported; each pass in its own process): colaflow's
loader (document-aware packing, exact resume) on raw and zstd blocks, LitData
``StreamingDataset(item_loader=TokensLoader(block_size=T + 1))`` + ``StreamingDataLoader`` on
its plain and zstd layouts (zstd: LitData decompresses each chunk to a second file on disk, kept
for later epochs; each pass reads a fresh copy of the layout, so it decompresses as a first
epoch does), and the ``numpy.memmap`` floor (in-process). Tokens/s counts document tokens
delivered (LitData and memmap: B x T per batch). ``--repeat N`` repeats each corpus N times (the
default makes a demo pass about 100 M tokens, long enough for a stable ratio).

Write time (``--rounds`` interleaved writes of the corpus ``--write-repeat`` times over, median and fastest; the default
makes the flat file's write about 0.1 s, long enough for a stable ratio): colaflow raw and zstd
token blocks (``TokenBlockWriter.add_many`` + manifest: tokens, per-block metadata of ids, sources and
lengths, tar headers, sha256, fsync), their ``shards index`` step apart (``*_index``: DALI ``.idx`` and
``shardindex.json`` for other readers), LitData's ``optimize()``, the flat file (``flat``: tokens and
int64 offsets, fsynced as every shard is) and the flat file with the documents' ids and sources as JSON,
fsynced (``flat_meta``: the information a shard holds). Before each timed write the page cache is synced,
so no writer's time holds the previous one's writeback. ``--write-only`` times only the writes (no LitData).

    python benchmarks/bench_tokens.py [--work /tmp/colaflow-bench-tokens] [--rounds 5] [--repeat 26] [--write-repeat 8]
                                      [--write-only]
                                      [--no-litdata]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from loaders.tools.bench import memmap_pass, run_pass  # noqa: E402
from shards import Manifest, TokenBlockWriter  # noqa: E402
from shards.tools.cli import main as shards_cli  # noqa: E402

LONG_TOKENS = 2000


def demo_corpus(work: str) -> tuple[list[str], list[str], list[np.ndarray]]:
    """``(ids, sources, tokens)`` of the demo corpus, tokenised once and cached in ``work``."""
    cache = os.path.join(work, "demo-tokens.npz")
    if os.path.exists(cache):
        z = np.load(cache, allow_pickle=False)
        lens = z["lengths"]
        return z["ids"].tolist(), z["sources"].tolist(), np.split(z["tokens"], np.cumsum(lens)[:-1])
    from pipelines.config import TokenizerConfig
    from examples.demo.corpus import kjv_records, shakespeare_records
    from pipelines.stages.tokenize import trained_file
    from shards.tokenizers import build

    records = [r for r in list(shakespeare_records()) + list(kjv_records()) if r["text"].strip()]
    tok = build(trained_file([r["text"] for r in records[::2]], TokenizerConfig(vocab_size=4096)))
    tokens = [np.asarray(t, np.uint16) for t in tok.encode_batch([r["text"] for r in records])]
    keep = [i for i, t in enumerate(tokens) if len(t)]
    ids, sources, tokens = [records[i]["id"] for i in keep], [records[i]["source"] for i in keep], [tokens[i] for i in keep]
    np.savez(cache, ids=np.array(ids), sources=np.array(sources), lengths=np.array([len(t) for t in tokens]),
             tokens=np.concatenate(tokens))
    return ids, sources, tokens


def long_corpus(ids, sources, tokens) -> tuple[list[str], list[str], list[np.ndarray]]:
    """Each source's documents concatenated in order into documents of about ``LONG_TOKENS`` tokens."""
    out_ids, out_src, out_tok, buf, n, out_src_pending = [], [], [], [], 0, None
    for s, t in zip(sources, tokens):
        if buf and (n + len(t) > LONG_TOKENS or s != out_src_pending):
            out_ids.append(f"{out_src_pending}/long/{len(out_ids):06d}")
            out_src.append(out_src_pending)
            out_tok.append(np.concatenate(buf))
            buf, n = [], 0
        out_src_pending = s
        buf.append(t)
        n += len(t)
    if buf:
        out_ids.append(f"{out_src_pending}/long/{len(out_ids):06d}")
        out_src.append(out_src_pending)
        out_tok.append(np.concatenate(buf))
    return out_ids, out_src, out_tok


def repeated(ids, sources, tokens, n: int) -> tuple[list[str], list[str], list[np.ndarray]]:
    """The corpus ``n`` times over, each copy's ids suffixed ``/rK`` so they stay unique."""
    if n == 1:
        return ids, sources, tokens
    return ([f"{i}/r{k}" for k in range(n) for i in ids], [s for _ in range(n) for s in sources],
            [t for _ in range(n) for t in tokens])


def write_seconds(writers: dict, rounds: int, work: str) -> dict[str, list[float]]:
    """Wall seconds of each writer's ``rounds`` interleaved writes into fresh folders (order rotated).

    A writer may return ``{step: seconds}`` of steps it timed itself after its write (``index``):
    they are reported as ``KIND_STEP`` and left out of ``KIND``'s time.
    """
    times: dict[str, list[float]] = {}
    kinds = list(writers)
    for r in range(rounds):
        # each round starts one writer later: the writer after another pays for the memory it freed (the
        # kernel compacts it into the huge pages numpy asks for), so no writer always follows the same one
        for kind in kinds[r % len(kinds):] + kinds[:r % len(kinds)]:
            write = writers[kind]
            out = os.path.join(work, f"write-{kind}-{r}")
            shutil.rmtree(out, ignore_errors=True)
            os.sync()  # the last writer's dirty pages are flushed here, not inside the next writer's time
            t0 = time.perf_counter()
            steps = write(out) or {}
            times.setdefault(kind, []).append(time.perf_counter() - t0 - sum(steps.values()))
            for step, seconds in steps.items():
                times.setdefault(f"{kind}_{step}", []).append(seconds)
            shutil.rmtree(out, ignore_errors=True)
    return times


def median_and_fastest(times: dict[str, list[float]]) -> tuple[dict[str, float], dict[str, float]]:
    """``({kind: median seconds}, {kind: fastest seconds})`` of :func:`write_seconds`' times."""
    return {k: statistics.median(v) for k, v in times.items()}, {k: min(v) for k, v in times.items()}


def dir_bytes(path: str) -> int:
    """Bytes of every file under ``path`` (shards plus every index)."""
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)


def write_colaflow(out: str, ids, sources, tokens, compression: str) -> dict[str, float]:
    """Write ``tokens`` as colaflow token-block shards (``compression`` none|zstd) and their manifest, then
    their indexes (``shards index``: DALI ``.idx`` and ``shardindex.json``, for other readers; colaflow's
    loader lists a shard's tar headers itself without them). Returns ``{"index": seconds}``."""
    w = TokenBlockWriter(out, max_bytes=256 << 20, compression=compression)
    w.add_many(ids, sources, tokens)
    Manifest(shards=w.close(), layout="token_blocks", vocab_size=4096).save(out)
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        assert shards_cli(["index", out]) == 0
    return {"index": time.perf_counter() - t0}


def _litdata_item(t):
    yield t


def write_litdata(out: str, tokens, compression: str | None) -> None:
    """Write ``tokens`` with LitData's ``optimize()`` in the ``TokensLoader`` layout (optionally zstd)."""
    from litdata import TokensLoader, optimize

    optimize(fn=_litdata_item, inputs=tokens, output_dir=out, chunk_bytes="64MB", item_loader=TokensLoader(),
             num_workers=1, compression=compression, mode="overwrite",
             **({"compression_level": "chunk"} if compression else {}))  # zstd per chunk (whole-file)


def write_flat(out: str, tokens, fsync: bool = False) -> None:
    """Write the flat floor: one uint16 ``tokens.bin`` plus int64 document offsets ``tokens.idx``
    (``fsync``: then flushed to disk, as the shard writer does with each shard)."""
    os.makedirs(out, exist_ok=True)
    np.concatenate(tokens).astype(np.uint16).tofile(os.path.join(out, "tokens.bin"))
    np.concatenate([[0], np.cumsum([len(t) for t in tokens])]).astype(np.int64).tofile(os.path.join(out, "tokens.idx"))
    if fsync:
        _fsync(out, "tokens.bin", "tokens.idx")


def write_flat_meta(out: str, ids, sources, tokens) -> None:
    """The flat floor plus what a shard holds beyond tokens and offsets: the documents' ids and sources
    (``docs.json``, uncompressed JSON), every file fsynced as the shard writer does (no checksum, no
    compression, no tar headers)."""
    write_flat(out, tokens)
    with open(os.path.join(out, "docs.json"), "w", encoding="utf-8") as f:
        json.dump({"ids": ids, "sources": sources}, f, ensure_ascii=False, separators=(",", ":"))
    _fsync(out, "tokens.bin", "tokens.idx", "docs.json")


def _fsync(folder: str, *names: str) -> None:
    for name in names:
        with open(os.path.join(folder, name), "rb+") as f:
            os.fsync(f.fileno())


def timed_writers(corpus, with_litdata: bool) -> dict:
    """The writers timed on ``corpus`` (``(ids, sources, tokens)``): colaflow raw and zstd (each
    with its ``shards index`` step timed apart), the flat file (also fsynced), the flat file with ids and
    sources, and LitData's ``optimize()`` when ``with_litdata``."""
    ids, sources, tokens = corpus
    writers = {"colaflow_raw": lambda d: write_colaflow(d, ids, sources, tokens, "none"),
               "colaflow_zstd": lambda d: write_colaflow(d, ids, sources, tokens, "zstd"),
               "flat": lambda d: write_flat(d, tokens, fsync=True),
               "flat_meta": lambda d: write_flat_meta(d, ids, sources, tokens)}
    if with_litdata:
        writers["litdata"] = lambda d: write_litdata(d, tokens, None)
    return writers


def print_writes(name: str, corpus, write_s: dict[str, float], write_min_s: dict[str, float]) -> None:
    """Print median and fastest write seconds with their ratios to the flat file and to the flat file with
    ids and sources (all fsynced). The fastest is printed too because this kernel's stalls (compacting memory
    into the huge pages numpy asks for, reclaim) add up to a second to a random share of writes."""
    if corpus is not None:
        print(f"== {name}: {len(corpus[2]):,} documents, {sum(map(len, corpus[2])):,} tokens written")
    for k, v in write_s.items():
        m = write_min_s[k]
        print(f"  write {k:20s} median {v:7.3f} s  {v / write_s['flat']:6.2f}x flat  {v / write_s['flat_meta']:5.2f}x "
              f"flat_meta   fastest {m:7.3f} s  {m / write_min_s['flat']:6.2f}x flat  "
              f"{m / write_min_s['flat_meta']:5.2f}x flat_meta")


def litdata_pass(spec: dict) -> dict:
    """One pass of LitData's TokensLoader over ``spec["dir"]`` (run in its own process)."""
    import resource

    from litdata import StreamingDataLoader, StreamingDataset, TokensLoader

    from loaders.worker.pool import peak_rss_mb

    # LitData decompresses a local zstd chunk beside it and deletes the compressed file: each pass
    # reads a copy (made before the clock starts), so every pass decompresses, as a first epoch does
    work = tempfile.mkdtemp(prefix="litdata-pass-")
    data = shutil.copytree(spec["dir"], os.path.join(work, "data"))
    cache_dir = os.path.join(work, "cache")
    t0 = time.perf_counter()
    T, B = spec["seq_len"], spec["batch_size"]
    ds = StreamingDataset(data, cache_dir=cache_dir, item_loader=TokensLoader(block_size=T + 1), shuffle=True,
                          seed=spec["seed"])
    dl = StreamingDataLoader(ds, batch_size=B, num_workers=spec["workers"])
    first, tokens, batches = None, 0, 0
    for batch in dl:
        if first is None:
            first = time.perf_counter() - t0
        tokens += batch.shape[0] * T
        batches += 1
    dt = time.perf_counter() - t0
    shutil.rmtree(work, ignore_errors=True)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # spawned workers: their own peak
    return {"tokens_per_s": tokens / dt, "first_batch_s": first, "seconds": dt, "batches": batches, "tokens": tokens,
            "peak_rss_mb": peak_rss_mb(), "workers_peak_rss_mb": kids}


def _subprocess_pass(spec: dict) -> dict:
    import subprocess

    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--pass", json.dumps(spec)],
                          capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"{spec['kind']} pass failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    """Compare bytes per token and loader tokens/s, first batch and peak RSS of colaflow, LitData and
    the memmap floor on the demo and long-document corpora; prints the ratios."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", default="/tmp/colaflow-bench-tokens")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds per comparison (5 or more for a stable median)")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--workers", default="0,2")
    ap.add_argument("--repeat", type=int, default=26, help="corpus copies per pass (26: about 100 M demo tokens)")
    ap.add_argument("--write-repeat", type=int, default=8,
                    help="corpus copies per timed write (8: the flat file takes about 0.1 s)")
    ap.add_argument("--write-only", action="store_true",
                    help="only the write times (--rounds interleaved rounds; no LitData)")
    ap.add_argument("--no-litdata", action="store_true",
                    help="skip LitData's writes and passes (colaflow and the floor only)")
    ap.add_argument("--pass", dest="one_pass", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one_pass:
        spec = json.loads(args.one_pass)
        print(json.dumps(litdata_pass(spec) if spec["kind"] == "litdata" else memmap_pass(spec)))
        return 0
    os.makedirs(args.work, exist_ok=True)
    try:
        import litdata  # noqa: F401
    except ImportError:
        print("litdata is not installed (pip install 'colaflow[bench]'): LitData rows are skipped", file=sys.stderr)
        have_litdata = False
    else:
        have_litdata = not args.no_litdata
    ids, sources, tokens = demo_corpus(args.work)
    corpora = {"demo": (ids, sources, tokens), "long": long_corpus(ids, sources, tokens)}
    if args.write_only:
        for name, once in corpora.items():
            written = repeated(*once, args.write_repeat)
            print_writes(name, written, *median_and_fastest(write_seconds(timed_writers(written, False), args.rounds,
                                                                          args.work)))
        return 0
    results: dict = {}
    for name, once in corpora.items():
        write_s, write_min_s = median_and_fastest(write_seconds(
            timed_writers(repeated(*once, args.write_repeat), have_litdata), args.rounds, args.work))
        c_ids, c_src, c_tok = repeated(*once, args.repeat)
        n_tok = sum(len(t) for t in c_tok)
        base = os.path.join(args.work, f"{name}-x{args.repeat}")
        dirs = {"colaflow_raw": f"{base}/colaflow-raw", "colaflow_zstd": f"{base}/colaflow-zstd",
                "litdata": f"{base}/litdata", "litdata_zstd": f"{base}/litdata-zstd", "flat": f"{base}/flat"}
        if not have_litdata:
            del dirs["litdata"], dirs["litdata_zstd"]
        writers = {"colaflow_raw": lambda d: write_colaflow(d, c_ids, c_src, c_tok, "none"),
                   "colaflow_zstd": lambda d: write_colaflow(d, c_ids, c_src, c_tok, "zstd"),
                   "litdata": lambda d: write_litdata(d, c_tok, None),
                   "litdata_zstd": lambda d: write_litdata(d, c_tok, "zstd"), "flat": lambda d: write_flat(d, c_tok)}
        for kind, d in dirs.items():  # each layout written once, kept in --work for later runs
            if not os.path.exists(d):
                writers[kind](d)
        bpt = {k: dir_bytes(d) / n_tok for k, d in dirs.items()}
        res = results[name] = {"documents": len(c_tok), "tokens": n_tok, "mean_doc_tokens": n_tok / len(c_tok),
                               "write_s": write_s, "write_min_s": write_min_s, "write_repeat": args.write_repeat,
                               "write_vs_flat": {k: v / write_s["flat"] for k, v in write_s.items()},
                               "write_vs_flat_meta": {k: v / write_s["flat_meta"] for k, v in write_s.items()},
                               "bytes_per_token": bpt, "vs_flat": {k: v / bpt["flat"] for k, v in bpt.items()},
                               "loader": {}}
        for workers in (int(w) for w in args.workers.split(",")):
            runs: dict = {}
            for r in range(args.rounds):  # interleaved: every contender once per round
                spec = {"seq_len": args.seq_len, "batch_size": args.batch, "workers": workers, "seed": r}
                for kind, d in (("colaflow_raw", dirs["colaflow_raw"]), ("colaflow_zstd", dirs["colaflow_zstd"])):
                    runs.setdefault(kind, []).append(run_pass({**spec, "kind": "loader", "shards": d}))
                if have_litdata:
                    for kind in ("litdata", "litdata_zstd"):
                        runs.setdefault(kind, []).append(_subprocess_pass({**spec, "kind": "litdata", "dir": dirs[kind]}))
                if workers == 0:
                    runs.setdefault("memmap", []).append(_subprocess_pass(
                        {**spec, "kind": "memmap", "flat": os.path.join(dirs["flat"], "tokens.bin")}))
            res["loader"][f"workers={workers}"] = {
                k: {m: statistics.median(x[m] for x in v) for m in ("tokens_per_s", "first_batch_s", "peak_rss_mb",
                                                                    "workers_peak_rss_mb")}
                for k, v in runs.items()}
    print(json.dumps(results, indent=2))
    for name, res in results.items():
        print(f"\n== {name}: {res['documents']:,} documents, {res['tokens']:,} tokens "
              f"({res['mean_doc_tokens']:.1f} per document)")
        for k, v in res["bytes_per_token"].items():
            print(f"  {k:14s} {v:6.3f} bytes/token  {res['vs_flat'][k]:5.2f}x flat")
        print_writes(name, None, res["write_s"], res["write_min_s"])
        in_process = res["loader"].get("workers=0", {})
        for w, runs in res["loader"].items():
            ref_name = next(k for k in ("litdata", "memmap", "colaflow_raw") if k in runs)
            ref = runs[ref_name]
            floor = in_process.get("memmap")
            for k, v in runs.items():
                same = runs.get("litdata_zstd") if k == "colaflow_zstd" else None  # zstd against zstd too
                alone = in_process.get(k) if w != "workers=0" else None  # workers against the in-process pass
                ratios = [(ref, ref_name if ref_name != "memmap" else None), (floor, "memmap"),
                          (same, "litdata_zstd"), (alone, "in-process")]
                vs = ", ".join(f"{v['tokens_per_s'] / r['tokens_per_s']:5.2f}x {name}"
                               for r, name in ratios if r and name)
                print(f"  {w} {k:14s} {v['tokens_per_s'] / 1e6:7.2f} M tok/s ({vs})  first batch "
                      f"{v['first_batch_s']:.3f} s  peak RSS {v['peak_rss_mb']:.0f} MB"
                      f" (+ workers {v['workers_peak_rss_mb']:.0f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
