"""The one line a run prints before it trains (and all that ``--dry-run`` prints): dataset, how many
epochs the planned steps cover, world size, ZeRO stage, and where it resumes from."""
from __future__ import annotations

from dataclasses import dataclass

from trainer.config import TrainConfig
from trainer.run_folder import RunPlan


@dataclass
class DataSummary:
    """What the manifest says about the dataset: shard count, documents (samples) and tokens."""

    shards: int
    documents: int
    tokens: int


def data_summary(manifest_url: str) -> DataSummary:
    """Read the manifest at ``manifest_url`` (path or URL).

    Raises:
        FileNotFoundError: the manifest is missing or unreachable.
    """
    from shards.manifest import Manifest
    m = Manifest.load(manifest_url)
    return DataSummary(len(m.shards), m.total_samples, m.total_tokens)


def planned_epochs(cfg: TrainConfig, data: DataSummary, world_size: int) -> float:
    """Epochs the planned steps cover: token positions the steps read (``steps x grad_accum x rows
    x seq_len x world_size`` in ``packed`` mode, ``max_tokens`` per micro-batch in
    ``token_budget`` mode) over the dataset's tokens. An upper bound on data read: padding
    positions of packed rows hold no document tokens, so real epochs can be slightly more."""
    per_micro = (cfg.data.max_tokens if cfg.data.batching == "token_budget"
                 else cfg.data.micro_batch_size * cfg.data.seq_len)
    positions = cfg.steps * cfg.optim.grad_accum_steps * per_micro * world_size
    return positions / data.tokens if data.tokens else float("inf")


def start_line(cfg: TrainConfig, data: DataSummary, world_size: int, plan: RunPlan) -> str:
    """``data: 4 shards, 1,000 documents, 250,000 tokens; 200 steps ≈ 3.3 epochs; world size 2,
    ZeRO stage 3; resumed from step 50 (PATH)`` (the last part says ``new run`` when not resuming)."""
    where = {"resume": f"resumed from step {plan.step} ({plan.checkpoint})",
             "overwrite": "new run (earlier run in run_dir removed: checkpoint.overwrite=true)",
             "fresh": "new run"}[plan.action]
    return (f"data: {data.shards:,} shards, {data.documents:,} documents, {data.tokens:,} tokens; "
            f"{cfg.steps:,} steps ≈ {planned_epochs(cfg, data, world_size):.2f} epochs; world size {world_size}, "
            f"ZeRO stage {cfg.zero.stage}; {where}")
