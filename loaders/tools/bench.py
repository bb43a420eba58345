"""``python -m loaders bench``: one timed pass through the real text loader (and a flat memmap floor).

Each pass runs in its own process (``python -m loaders.tools.bench SPEC``, JSON in, one JSON line out),
so its peak RSS is its own; workers' peak RSS is reported apart (the largest worker). Results:

* ``tokens_per_s``: document tokens delivered per second of wall time, first batch included;
* ``first_batch_s``: seconds from creating the loader to the first batch (worker start, shard open);
* ``peak_rss_mb`` / ``workers_peak_rss_mb``: peak resident memory (``VmHWM``) of the pass / of its
  largest worker, MiB;
* ``real_token_fraction``: document tokens / batch slots (B x T);
* ``documents``: documents whose tokens the pass delivered (every chunk of them), one epoch;
* ``bad_documents`` / ``empty_documents``: documents skipped as unreadable (logged) / without tokens;
* ``transfer_bytes_per_batch``: pickled size of a batch (the arrays a worker writes into its ring,
  plus framing), and its ratio to a ``uint16 [rows, T + 1]`` tensor of the same batches
  (``transfer_vs_uint16``).

``--baseline memmap`` also times the physical floor in the same run: the same tokens copied
into one flat ``uint16`` file (as Megatron's indexed dataset or nanoGPT store them) read as
shuffled windows of ``T + 1`` tokens with ``numpy.memmap``, ``B`` windows per batch, in-process.
"""
from __future__ import annotations

import importlib
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time

import numpy as np

TRANSFER_SAMPLE = 32  # batches whose pickled size is measured



def loader_pass(spec: dict) -> dict:
    """One pass (one epoch) of ``build_text_loader`` with the settings in ``spec`` (``shards``,
    ``seq_len``, ``batch_size``, ``workers``; optional ``seed``, ``worker_start``, ``cache_dir`` and
    ``overrides``, as :func:`bench_config` takes them)."""
    importlib.import_module("fsspec")  # the manifest's reader: imported before the clock starts, as every contender's is

    from loaders.rank.loader import build_text_loader
    from loaders.worker.pool import peak_rss_mb

    cfg = bench_config(spec["shards"], spec["seq_len"], spec["batch_size"], spec["workers"], spec.get("seed", 0),
                       spec.get("worker_start", "fork"), spec.get("overrides"))
    cache = None
    if spec.get("cache_dir"):
        from cache import CacheConfig, ShardCache
        cache = ShardCache(CacheConfig(dir=spec["cache_dir"]))
    t0 = time.perf_counter()
    loader = build_text_loader(cfg, cache)
    first, tokens, slots, batches, kept = None, 0, 0, 0, []
    for b in loader:
        if first is None:
            first = time.perf_counter() - t0
        tokens += b.num_doc_tokens
        slots += b.num_slots
        batches += 1
        if len(kept) < TRANSFER_SAMPLE:
            kept.append(b)
    dt = time.perf_counter() - t0
    sizes = [len(pickle.dumps(b, protocol=pickle.HIGHEST_PROTOCOL)) for b in kept]  # outside the timed pass
    if cache is not None:
        cache.close()
    per_batch = float(np.mean(sizes)) if sizes else 0.0
    # against the batches' own uint16 [rows, T + 1] tensors (token-budget batches vary in rows)
    tensor_bytes = float(np.mean([2 * b.shape[0] * (b.shape[1] + 1) for b in kept])) if kept else 0.0
    metrics = loader.metrics()
    return {"tokens_per_s": tokens / dt, "first_batch_s": first, "seconds": dt, "batches": batches, "tokens": tokens,
            "real_token_fraction": tokens / slots if slots else 0.0, "transfer_bytes_per_batch": per_batch,
            "transfer_vs_uint16": per_batch / tensor_bytes if kept else 0.0,
            "peak_rss_mb": peak_rss_mb(), "workers_peak_rss_mb": metrics["workers_peak_rss_mb"],
            "documents": metrics["consumed"] - metrics["bad"] - metrics["empty"],  # consumed counts skipped ones
            "bad_documents": metrics["bad"], "empty_documents": metrics["empty"]}


def memmap_pass(spec: dict) -> dict:
    """One pass over the flat ``uint16`` file ``spec["flat"]``: shuffled windows of T + 1 tokens."""
    import torch

    from loaders.worker.pool import peak_rss_mb

    t0 = time.perf_counter()
    T, B = spec["seq_len"], spec["batch_size"]
    mm = np.memmap(spec["flat"], dtype=np.dtype(spec.get("dtype", "uint16")), mode="r")
    starts = np.random.default_rng(spec.get("seed", 0)).permutation(len(mm) // (T + 1)) * (T + 1)
    first, tokens, batches = None, 0, 0
    for i in range(0, len(starts), B):
        batch = torch.from_numpy(np.stack([mm[s:s + T + 1] for s in starts[i:i + B].tolist()]))
        if first is None:
            first = time.perf_counter() - t0
        tokens += batch.shape[0] * T
        batches += 1
    dt = time.perf_counter() - t0
    return {"tokens_per_s": tokens / dt, "first_batch_s": first, "seconds": dt, "batches": batches, "tokens": tokens,
            "real_token_fraction": 1.0, "transfer_bytes_per_batch": 2.0 * B * (T + 1), "transfer_vs_uint16": 1.0,
            "peak_rss_mb": peak_rss_mb(), "workers_peak_rss_mb": 0.0}


def write_flat(manifest_url: str, out_path: str) -> tuple[str, int]:
    """Copy every document's tokens, in manifest order, into one flat file (plus ``.idx`` int64 offsets,
    the Megatron indexed-dataset layout). Returns ``(dtype name, tokens)``."""
    from shards import Manifest, iter_samples, shard_url
    from shards.format.blocks import BLOCK_LAYOUT, block_documents

    manifest = Manifest.load(manifest_url)
    lengths = []
    with open(out_path, "wb") as f:
        for info in manifest.shards:
            for sample in iter_samples(shard_url(manifest_url, info.name), schema="text"):
                meta = sample.get("json")
                docs = block_documents(sample) if isinstance(meta, dict) and meta.get("layout") == BLOCK_LAYOUT \
                    else [sample]
                for doc in docs:
                    f.write(np.ascontiguousarray(doc["tokens"], dtype=manifest.token_dtype).tobytes())
                    lengths.append(len(doc["tokens"]))
    np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64).tofile(out_path + ".idx")
    return manifest.token_dtype, int(sum(lengths))


def run_pass(spec: dict) -> dict:
    """Run one pass in a fresh process; returns its JSON result (the pass's log goes to stderr).

    Raises:
        RuntimeError: the pass failed (its stderr is in the message).
    """
    proc = subprocess.run([sys.executable, "-m", "loaders.tools.bench", json.dumps(spec)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"bench pass {spec['kind']} failed: {proc.stderr.strip()[-2000:]}")
    sys.stderr.write(proc.stderr)  # the loader's log (unreadable shards, bad documents) reaches the user
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bench_config(shards: str, seq_len: int = 512, batch_size: int = 16, workers: int = 0, seed: int = 0,
                 worker_start: str = "fork", overrides: list[str] | None = None):
    """The :class:`loaders.config.DataConfig` of a bench pass: the options, then ``data.KEY=VALUE``
    ``overrides`` on top (e.g. ``data.pack_window=65536 data.batching=token_budget``).

    Raises:
        colaflow.config.ConfigError: a malformed override, an unknown key, a bad value (names it), or
            ``data.manifest`` / ``data.mixture`` (the data is ``shards``).
    """
    from colaflow.config import ConfigError, apply_overrides, from_dict
    from loaders.config import DataConfig

    base = {"manifest": shards, "seq_len": seq_len, "micro_batch_size": batch_size, "num_workers": workers,
            "pin_memory": False, "seed": seed, "worker_start": worker_start}
    for item in overrides or []:
        if not item.startswith("data."):
            raise ConfigError(f"override {item!r}: bench takes data.KEY=VALUE overrides only")
        if item.split("=", 1)[0] in ("data.manifest", "data.mixture"):  # the floor and the report read --shards
            raise ConfigError(f"override {item!r}: bench reads the shards given by --shards; give them there")
    cfg = from_dict(DataConfig, apply_overrides({"data": base}, list(overrides or []))["data"], "data.")
    cfg.validate()
    return cfg


def bench(shards: str, seq_len: int = 512, batch_size: int = 16, workers: int = 0, baseline: str | None = None,
          cache_dir: str | None = None, seed: int = 0, worker_start: str = "fork",
          overrides: list[str] | None = None) -> dict:
    """Time the loader (and the memmap floor with ``baseline="memmap"``) on ``shards``; returns the JSON
    report. ``overrides``: ``data.KEY=VALUE`` settings of the loader (:func:`bench_config`).

    Raises:
        FileNotFoundError / ValueError: no manifest at ``shards``, or a bad override (ConfigError);
        RuntimeError: a pass failed.
    """
    from shards import Manifest

    cfg = bench_config(shards, seq_len, batch_size, workers, seed, worker_start, overrides)
    Manifest.load(shards)  # a missing or bad manifest is reported here, not as a failed pass
    spec = {"shards": shards, "seq_len": cfg.seq_len, "batch_size": cfg.micro_batch_size,
            "workers": cfg.num_workers, "cache_dir": cache_dir, "seed": cfg.seed, "worker_start": cfg.worker_start,
            "overrides": list(overrides or [])}
    out = {"settings": spec, "loader": run_pass({**spec, "kind": "loader"})}
    if baseline == "memmap":
        with tempfile.TemporaryDirectory(prefix="colaflow-flat-") as tmp:
            dtype, _ = write_flat(shards, os.path.join(tmp, "tokens.bin"))
            out["memmap"] = run_pass({**spec, "kind": "memmap", "flat": os.path.join(tmp, "tokens.bin"), "dtype": dtype})
        out["loader_vs_memmap"] = out["loader"]["tokens_per_s"] / out["memmap"]["tokens_per_s"]
    return out


if __name__ == "__main__":
    from colaflow.errors import explain, run_cli

    def _main() -> int:
        spec = json.loads(sys.argv[1])
        try:
            print(json.dumps((loader_pass if spec["kind"] == "loader" else memmap_pass)(spec)))
        except Exception as e:  # noqa: BLE001 - the parent reports the pass's failure in one line
            print(f"{type(e).__name__}: {explain(e)}", file=sys.stderr)
            return 1
        return 0

    run_cli(_main)
