"""Loader configuration (the ``data:`` section of a YAML config)."""
from __future__ import annotations

from dataclasses import dataclass, field

from loaders.formats import FORMATS
from loaders.pack.batching import BATCHING

REMAINDER_POLICIES = ("uneven", "drop", "pad")
STEP_POLICIES = ("pad", "drop", "uneven")
WORKER_STARTS = ("fork", "spawn")


@dataclass
class DataConfig:
    """Text loader settings.

    Attributes:
        manifest: URL or path of ``manifest.json`` (or its folder): local, ``http(s)://``, fsspec.
        mixture: train on a weighted mixture of datasets instead of ``manifest``: a list of
            sources ``{manifest, name, weight}`` or ``{manifest, name, epochs | max_tokens}``
            (see :mod:`loaders.mixture.mixture`); empty = one dataset.
        seq_len: tokens per packed row (T); documents longer than this are split into chunks.
        micro_batch_size: rows per micro-batch (B) in ``packed`` mode.
        num_workers: worker processes per rank (:mod:`loaders.worker.pool`; 0 = load in the main
            process). A background thread prefetches batches either way.
        worker_start: ``fork`` (default: a worker starts in milliseconds with every module loaded;
            it runs numpy code only) or ``spawn`` (a fresh interpreter without torch, about 0.2 s,
            inheriting nothing of the trainer).
        seed: base seed of the deterministic sample order.
        shuffle: shuffle shard order and samples; ``False`` reads the manifest order.
        shuffle_block: samples per block of the block shuffle (the bound on how far a sample
            moves; larger = more random, more shards open per consumer at once).
        shard_lanes: shard lanes of the order (:mod:`loaders.order.sample_order`): 1 (default) permutes all
            shards each epoch; a multiple of every node count the job runs on (e.g. 64) keeps each node's
            shards the same every epoch, so a node cache that holds its share downloads nothing after the
            first epoch (``shuffle=false`` keeps the manifest order, and so each node's shards, anyway).
            Part of the order: a resume needs the same value.
        remainder: what to do when the samples left in an epoch do not divide by the number of
            consumers (ranks x workers): ``uneven`` (default: every sample exactly once, consumers
            differ by at most one sample), ``drop`` (drop the last ones, reported) or ``pad``
            (repeat the first ones, reported).
        step_policy: how ranks end an epoch after the same number of steps (packing gives them
            different batch counts; see :mod:`loaders.rank.steps`): ``pad`` (default: ranks that ran out
            yield fully masked batches until all have; every sample read once), ``drop`` (all
            stop when one runs out; the others' rest is counted as dropped) or ``uneven``. Needs
            ``torch.distributed`` initialised when world size > 1 (one all-reduce per step);
            without it the loader warns and behaves as ``uneven``.
        batching: ``packed`` (B rows of ``seq_len``, best-fit-decreasing packing) or
            ``token_budget`` (one chunk per row, rows padded to the longest in the batch,
            rows x padded length <= ``max_tokens``).
        pack_window: tokens buffered per consumer before a packing (counted after each whole
            document); larger = fewer padding tokens and more batches per packing, at about 20
            bytes of work memory per token (demo corpus, rows of 512, batch 16: 99.86 % real
            tokens at the default 262,144 = 512 rows of 512).
        max_tokens: token budget per micro-batch in ``token_budget`` mode (>= ``seq_len``).
        prefetch_batches: batches the background thread keeps ready ahead of the trainer, per worker
            (or in all when ``num_workers`` is 0); at most that many, whatever a packing makes at once.
            They are compact (about ``2 B T`` bytes each); fewer than about 8 costs a fast reader a
            thread switch every few batches.
        pin_memory: pin batches in page-locked memory when CUDA is present.
        ranks_per_node: ranks that share one node's cache folder, numbered node by node (rank
            ``r`` is on node ``r // ranks_per_node``); each node then downloads only its own shards,
            about ``1/nodes`` of the dataset per epoch (:mod:`loaders.order.split`). 0 (default):
            torchrun's ``LOCAL_WORLD_SIZE`` when it launched the job, else every rank on one node.
            Must divide the world size.
        format: the batch form :class:`loaders.rank.dataset.TokenDataset` yields to another framework's
            loop (:mod:`loaders.formats`): ``colaflow`` (``TokenBatch``), ``hf`` (a dict for
            ``model(**batch)``: unshifted labels, per-document ``position_ids``) or ``torchtitan``
            (``(input_dict, labels)``). colaflow's own trainer and ``TextLoader`` always take ``TokenBatch``.
    """

    manifest: str = "runs/demo/shards"
    mixture: list = field(default_factory=list)
    seq_len: int = 256
    micro_batch_size: int = 8
    num_workers: int = 1
    worker_start: str = "fork"
    seed: int = 0
    shuffle: bool = True
    shuffle_block: int = 4096
    shard_lanes: int = 1
    remainder: str = "uneven"
    step_policy: str = "pad"
    batching: str = "packed"
    pack_window: int = 262144
    max_tokens: int = 2048
    prefetch_batches: int = 8
    pin_memory: bool = True
    index_dir: str = ""
    ranks_per_node: int = 0
    format: str = "colaflow"

    def validate(self) -> None:
        """Raise ``ValueError`` naming the bad field and its valid range."""
        if self.seq_len < 2:
            raise ValueError(f"data.seq_len={self.seq_len}: must be >= 2")
        for name in ("micro_batch_size", "shuffle_block", "shard_lanes", "pack_window", "prefetch_batches"):
            if getattr(self, name) < 1:
                raise ValueError(f"data.{name}={getattr(self, name)}: must be >= 1")
        if self.ranks_per_node < 0:
            raise ValueError(f"data.ranks_per_node={self.ranks_per_node}: must be >= 0 (0: torchrun's LOCAL_WORLD_SIZE)")
        if self.num_workers < 0:
            raise ValueError(f"data.num_workers={self.num_workers}: must be >= 0")
        if self.remainder not in REMAINDER_POLICIES:
            raise ValueError(f"data.remainder={self.remainder!r}: use one of {REMAINDER_POLICIES}")
        if self.step_policy not in STEP_POLICIES:
            raise ValueError(f"data.step_policy={self.step_policy!r}: use one of {STEP_POLICIES}")
        if self.worker_start not in WORKER_STARTS:
            raise ValueError(f"data.worker_start={self.worker_start!r}: use one of {WORKER_STARTS}")
        if self.batching not in BATCHING:
            raise ValueError(f"data.batching={self.batching!r}: use one of {tuple(BATCHING)}")
        BATCHING[self.batching].check(self)
        if self.format not in FORMATS:
            raise ValueError(f"data.format={self.format!r}: use one of {tuple(FORMATS)}")
