"""Loader configuration (the ``data:`` section of a YAML config)."""
from __future__ import annotations

from dataclasses import dataclass, field

from colaflow.config import check_fields, setting
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
        pack_slack: the room a packed row may have left, as a fraction of ``seq_len`` (rounded down
            to tokens), and still count as full: a packing emits full rows and keeps back the
            least full others to pack again with later documents. The default 0.005 bounds such a
            row's padding by the 0.5 % that packing promises in all (rows of 512: at most 2 tokens);
            0 emits only rows without padding first, and on short documents the rows of the
            shortest ones (a token or two of room each) were then packed again at every packing.
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
    seq_len: int = setting(256, ge=2)
    micro_batch_size: int = setting(8, ge=1)
    num_workers: int = setting(1, ge=0)
    worker_start: str = setting("fork", choices=WORKER_STARTS)
    seed: int = setting(0, ge=0)
    shuffle: bool = True
    shuffle_block: int = setting(4096, ge=1)
    shard_lanes: int = setting(1, ge=1)
    remainder: str = setting("uneven", choices=REMAINDER_POLICIES)
    step_policy: str = setting("pad", choices=STEP_POLICIES)
    batching: str = setting("packed", choices=tuple(BATCHING))
    pack_window: int = setting(262144, ge=1)
    pack_slack: float = setting(0.005, ge=0, le=1)
    max_tokens: int = setting(2048, ge=1)
    prefetch_batches: int = setting(8, ge=1)
    pin_memory: bool = True
    index_dir: str = ""
    ranks_per_node: int = setting(0, ge=0)
    format: str = setting("colaflow", choices=tuple(FORMATS))

    def validate(self) -> None:
        """Check the declared ranges and choices of ``data.*`` (:func:`colaflow.config.check_fields`),
        then what the batching mode needs; raises ``ValueError`` naming the bad field and its valid range."""
        check_fields(self, "data.")
        BATCHING[self.batching].check(self)
