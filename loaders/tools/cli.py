"""``python -m loaders keys``: which sample keys each rank (and worker) reads, in order;
``python -m loaders bench``: one timed pass through the loader (JSON; ``--baseline memmap`` adds the
flat-file floor), to size workers per node (see :mod:`loaders.tools.bench`).

    python -m loaders keys --shards DIR_OR_MANIFEST --world-size N --workers W [--epoch E]
        [--resume-at STEP] [--config run.yaml] [data.seed=3 data.seq_len=512 ...]
    python -m loaders keys --config mixture.yaml --world-size N --workers W ...
    python -m loaders bench --shards DIR_OR_URL [--seq-len 512 --batch-size 16 --workers W]
        [--baseline memmap] [data.pack_window=65536 data.batching=token_budget ...]

One line per sample: ``rank=R worker=W pos=P [partial=CHUNKS] SHARD/KEY`` (``pos`` = global
position in the epoch's order; ``partial`` = chunks delivered before the resume point). With a
``data.mixture`` in the config (and no ``--shards``), each line also names the key's source and
that source's epoch: ``... pos=P source=NAME source_epoch=E SOURCE/SHARD/KEY``.
``--resume-at STEP`` runs every rank's loader (in this process) for STEP steps, merges their
states as a checkpoint would, and lists what is left of the epoch. ``--config`` reads the
``data:`` section of a YAML run config; ``data.*`` overrides apply on top.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

import yaml

from colaflow.config import apply_overrides, from_dict
from colaflow.errors import exit_status, explain
from colaflow.wording import help_text
from loaders.config import DataConfig
from loaders.read.shard_reader import LocalShards

if TYPE_CHECKING:
    from loaders.rank.loader import TextLoader


def _data_config(path: str | None, overrides: list[str], manifest: str | None) -> DataConfig:
    data: dict = {}
    if path:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f) or {}
    data = apply_overrides({"data": data.get("data", {})}, overrides)
    cfg = from_dict(DataConfig, data["data"], "data.")
    if manifest:  # --shards reads one dataset, even when the config holds a mixture
        cfg.manifest, cfg.mixture = manifest, []
    elif not cfg.mixture:
        raise ValueError("give --shards DIR_OR_MANIFEST, or --config with a data.mixture")
    return cfg


def _loaders(cfg: DataConfig, cache, world: int) -> list[TextLoader]:
    from loaders.rank.loader import build_text_loader  # torch: --help and a config error need none
    return [build_text_loader(cfg, cache, r, world, in_process=True) for r in range(world)]


def _source(ld: TextLoader, pos: int) -> str:
    """`` source=NAME source_epoch=E`` of a mixture position ('' for one dataset)."""
    origin = ld.sources.origin(ld.epoch, pos)
    return f" source={origin[0]} source_epoch={origin[1]}" if origin else ""


def keys_command(args) -> int:
    """``keys``: print the sample keys each rank and worker reads (with each key's source for a mixture),
    in delivery order, optionally from a resume point. Returns the exit code.

    The ranks run in this process, so ``data.step_policy`` acts as ``uneven`` (no torch.distributed
    agreement). Raises ValueError (exit 2) when ``--resume-at`` is past the end of the epoch."""
    cfg = _data_config(args.config, args.overrides, args.shards)
    cfg.num_workers = args.workers
    # the ranks are simulated in this process, one after another: no step agreement across them is
    # possible (nor needed: padded or dropped steps deliver no keys beyond the data each rank reads)
    cfg.step_policy = "uneven"
    cache = LocalShards()
    if args.cache_dir:
        from cache import CacheConfig, ShardCache
        cache = ShardCache(CacheConfig(dir=args.cache_dir))
    loaders = _loaders(cfg, cache, args.world_size)
    manifest = loaders[0].sources.manifest
    for ld in loaders:
        ld.set_epoch(args.epoch)
    if args.resume_at:
        its = [iter(ld) for ld in loaders]
        try:
            for step in range(args.resume_at):
                if all(batch is None for batch in [next(it, None) for it in its]):  # every rank ran out
                    raise ValueError(
                        f"--resume-at {args.resume_at} is past the end of epoch {args.epoch}: its "
                        f"{loaders[0].progress.num_samples} documents last {step} steps "
                        f"at world size {args.world_size}; give --resume-at {step} or less")
            state = loaders[0].sources.merge([ld.state_dict() for ld in loaders])
        finally:
            for it in its:
                it.close()  # unpins the shards these loaders hold open in the cache
        loaders = _loaders(cfg, cache, args.world_size)
        for ld in loaders:
            ld.load_state_dict(state)
    progress = loaders[0].progress
    split = loaders[0].split()
    print(f"# epoch {progress.epoch}: {progress.num_samples} samples, {progress.consumed} consumed before; "
          f"world size {args.world_size} x {max(args.workers, 1)} workers; remainder={cfg.remainder}: "
          f"{split.assigned} assigned, {split.dropped} dropped, {split.padded} repeated")
    reader = loaders[0].stream.open_reader()
    try:
        for ld in loaders:
            ld.stream.start(ld.progress)
            partial = ld.progress.partial
            for w in range(max(args.workers, 1)):
                for pos, shard, local in ld.stream.consumer_positions(w, max(args.workers, 1)):
                    reader.retain({shard})  # one shard pinned at a time: the cache may hold less than the data
                    done = partial.get(pos, (0, set()))[1]
                    mark = f" partial={','.join(map(str, sorted(done)))}" if done else ""
                    print(f"rank={ld.rank} worker={w} pos={pos}{_source(ld, pos)}{mark} "
                          f"{manifest.shards[shard].name}/{reader.key(shard, local)}")
    finally:
        reader.close()
        cache.close()
    return 0


def bench_command(args) -> int:
    """``bench``: one pass through the real loader; prints JSON (tokens/s, first batch seconds, peak RSS,
    real-token fraction, bytes per batch; with ``--baseline memmap`` the flat uint16 floor). Returns 0."""
    from loaders.tools.bench import bench

    report = bench(args.shards, args.seq_len, args.batch_size, args.workers, args.baseline, args.cache_dir, args.seed,
                   args.worker_start, args.overrides)
    print(json.dumps(report, indent=2))
    return 0


def main(argv: list[str] | None = None, prog: str = "python -m loaders") -> int:
    """Entry point of ``python -m loaders`` and ``colaflow loaders`` (``prog``, shown in its usage and
    errors); returns the exit code (2 usage/config, 1 runtime/data, 130 Ctrl-C)."""
    ap = argparse.ArgumentParser(prog=prog, description=help_text(__doc__),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    k = sub.add_parser("keys", help="list the sample keys each rank reads, in order")
    k.add_argument("--shards", help="shard folder, manifest.json path or URL (or a data.mixture in --config)")
    k.add_argument("--world-size", type=int, default=1)
    k.add_argument("--workers", type=int, default=0, help="loader worker processes per rank (0 = main process)")
    k.add_argument("--epoch", type=int, default=0)
    k.add_argument("--resume-at", type=int, default=0, metavar="STEP",
                   help="list what is left after STEP steps (0 or more; past the end of the epoch is an error)")
    k.add_argument("--config", help="YAML run config (its data: section is used)")
    k.add_argument("--cache-dir", help="read remote shards through a cache.ShardCache in this folder")
    k.add_argument("overrides", nargs="*", help="data.KEY=VALUE overrides")
    b = sub.add_parser("bench", help="one timed pass through the loader; prints JSON (tokens/s, first batch, RSS)")
    b.add_argument("--shards", required=True, help="shard folder, manifest.json path or URL")
    b.add_argument("--seq-len", type=int, default=512)
    b.add_argument("--batch-size", type=int, default=16)
    b.add_argument("--workers", type=int, default=0, help="worker processes (0 = main process)")
    b.add_argument("--worker-start", choices=["fork", "spawn"], default="fork", help="how workers start (data.worker_start)")
    b.add_argument("--baseline", choices=["memmap"], help="also time a flat uint16 memmap copy (the floor)")
    b.add_argument("--cache-dir", help="read remote shards through a cache.ShardCache in this folder")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("overrides", nargs="*", help="data.KEY=VALUE loader settings (e.g. data.pack_window=65536)")
    args = ap.parse_args(argv)
    if args.command == "bench":
        if args.workers < 0 or args.seq_len < 2 or args.batch_size < 1:
            ap.error("--workers must be >= 0, --seq-len >= 2 and --batch-size >= 1")
    elif args.world_size < 1 or args.workers < 0 or args.resume_at < 0:
        ap.error("--world-size must be >= 1, --workers >= 0 and --resume-at >= 0")
    try:
        return bench_command(args) if args.command == "bench" else keys_command(args)
    except (FileNotFoundError, ValueError, RuntimeError) as e:  # ConfigError is a ValueError; a bench pass failed
        print(f"{prog} {args.command}: {explain(e)}", file=sys.stderr)
        return exit_status(e)

