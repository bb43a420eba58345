"""Loader configuration (the ``data:`` section of a YAML config)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DataConfig:
    """Text loader settings.

    Attributes:
        manifest: URL or path of ``manifest.json`` (or its folder): local, ``http(s)://``, fsspec.
        seq_len: tokens per packed row (T).
        micro_batch_size: rows per micro-batch (B).
        num_workers: DataLoader worker processes per rank (0 = load in the main process).
        seed: base seed of the deterministic sample order.
    """

    manifest: str = "runs/demo/shards"
    seq_len: int = 256
    micro_batch_size: int = 8
    num_workers: int = 1
    seed: int = 0
