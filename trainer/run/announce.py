"""The one line a run prints before it trains (and all that ``--dry-run`` prints): dataset, how many
epochs the planned steps cover, world size, ZeRO stage, and where it resumes from."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from colaflow.wording import count
from loaders.config import DataConfig
from loaders.pack.batching import batching
from trainer.config import TrainConfig
from trainer.run.folder import RunPlan

if TYPE_CHECKING:
    from trainer.pretrained import Pretrained  # torch; a start line only reads its fields


@dataclass
class DataSummary:
    """What the manifest (or every ``data.mixture`` source's, added up) says: shards, documents
    (:meth:`shards.format.manifest.Manifest.document_counts`: documents, not tar samples, for token blocks),
    tokens, and the largest shard's size in bytes (the cache must hold it)."""

    shards: int
    documents: int
    tokens: int
    largest_shard_bytes: int = 0


def data_summary(data: DataConfig) -> DataSummary:
    """Read the manifest of ``data.manifest``, or of every ``data.mixture`` source (added up: the
    planned epochs are then mixture epochs of weighted sources).

    Raises:
        FileNotFoundError: a manifest is missing or unreachable.
        colaflow.config.ConfigError: a bad ``data.mixture`` entry (names the entry and field).
    """
    from loaders.mixture.sources import parse_sources
    from shards.format.manifest import Manifest
    urls = [s.manifest for s in parse_sources(data.mixture)] if data.mixture else [data.manifest]
    manifests = [Manifest.load(u) for u in urls]
    return DataSummary(sum(len(m.shards) for m in manifests), sum(m.total_documents for m in manifests),
                       sum(m.total_tokens for m in manifests),
                       max((s.bytes for m in manifests for s in m.shards), default=0))


def check_runnable(cfg: TrainConfig, data: DataSummary) -> None:
    """What a dry run checks beyond the config's own validation, so the real run cannot fail on it:
    ``cache.max_bytes`` holds the largest shard (else the loader yields no batch) and an explicit
    ``eval.manifest`` exists.

    Raises:
        colaflow.config.ConfigError: one of them does not hold (exit 2; the message names the fix).
    """
    import fsspec

    from colaflow.config import ConfigError
    limit = cfg.cache.max_bytes_int
    if data.largest_shard_bytes > limit:
        raise ConfigError(f"cache.max_bytes={cfg.cache.max_bytes} ({limit:,} bytes) is smaller than the largest "
                          f"shard ({data.largest_shard_bytes:,} bytes): raise cache.max_bytes")
    url = cfg.eval.manifest
    if cfg.eval.enabled and url:
        fs, path = fsspec.core.url_to_fs(url)
        if not fs.exists(path):
            raise ConfigError(f"eval.manifest={url}: no such manifest; fix the path, or set eval.manifest='' "
                              "(the val split of data.manifest) or eval.enabled=false")


def planned_epochs(cfg: TrainConfig, data: DataSummary, world_size: int) -> float:
    """Epochs the planned steps cover: token positions the steps read (``steps x grad_accum x rows
    x seq_len x world_size`` in ``packed`` mode, ``max_tokens`` per micro-batch in
    ``token_budget`` mode) over the dataset's tokens. An upper bound on data read: padding
    positions of packed rows hold no document tokens, so real epochs can be slightly more."""
    per_micro = batching(cfg.data).micro_batch_tokens
    positions = cfg.steps * cfg.optim.grad_accum_steps * per_micro * world_size
    return positions / data.tokens if data.tokens else float("inf")


def start_line(cfg: TrainConfig, data: DataSummary, world_size: int, plan: RunPlan, dry_run: bool = False,
               init: Pretrained | None = None) -> str:
    """``data: 4 shards, 1,000 documents, 250,000 tokens; 200 steps ≈ 3.3 epochs; world size 2,
    ZeRO stage 3; resumed from step 50 (PATH)`` (the last part says ``new run`` when not resuming,
    ``new run from hf weights PATH`` with ``init``; ``would resume`` when ``dry_run``)."""
    new = f"new run from {init.kind} weights {init.path}" if init is not None else "new run"
    where = {"resume": f"{'would resume' if dry_run else 'resumed'} from step {plan.step} ({plan.checkpoint})",
             "overwrite": f"{new} (earlier run in run_dir removed: checkpoint.overwrite=true)",
             "fresh": new}[plan.action]
    return (f"data: {count(data.shards, 'shard')}, {count(data.documents, 'document')}, {count(data.tokens, 'token')}; "
            f"{cfg.steps:,} steps ≈ {planned_epochs(cfg, data, world_size):.2f} epochs; world size {world_size}, "
            f"ZeRO stage {cfg.zero.stage}; {where}")
