"""The sources a loader reads (:class:`loaders.protocols.Sources`): one dataset here, a mixture in
:mod:`loaders.mixture`; :func:`build_sources` picks by the ``data:`` config."""
from __future__ import annotations

from typing import Callable

import numpy as np

from loaders.config import DataConfig
from loaders.mixture.mixture import Mixture
from loaders.order.progress import Progress, merge_states
from loaders.order.sample_order import SampleOrder
from loaders.protocols import ShardSource, Sources
from loaders.read.shard_reader import LocalShards, ShardReader
from shards import Manifest


class OneDataset:
    """The :class:`loaders.protocols.Sources` of one prebuilt dataset (``data.manifest``).

    Its order is :class:`loaders.order.sample_order.SampleOrder` with ``data.seed``; its resume state is
    :meth:`loaders.order.progress.Progress.state_dict`.

    Args:
        manifest: the dataset's manifest.
        url: where it lives (path, folder or URL of ``manifest.json``): shard URLs are resolved beside it.
    """

    def __init__(self, manifest: Manifest, url: str):
        self.manifest, self.url = manifest, url

    def order(self, epoch: int, seed: int, shuffle: bool, block: int, lanes: int = 1) -> SampleOrder:
        """The epoch's document order (documents per shard from the manifest)."""
        return SampleOrder(self.manifest.document_counts(), seed, epoch, shuffle, block, lanes)

    def reader(self, cache: ShardSource, index_dir: str | None) -> ShardReader:
        """A :class:`loaders.read.shard_reader.ShardReader` of the dataset's shards."""
        return ShardReader(self.manifest, self.url, cache, index_dir)

    def new_progress(self, epoch: int, order_key: dict, world_size: int) -> Progress:
        """A fresh :class:`Progress` over every document of the dataset."""
        return Progress(epoch, order_key, self.manifest.total_documents, world_size)

    def state_dict(self, progress: Progress) -> dict:
        """:meth:`Progress.state_dict`."""
        return progress.state_dict()

    def merge(self, states: list[dict]) -> dict:
        """:func:`loaders.order.progress.merge_states`."""
        return merge_states(states)

    def restore(self, state: dict, order_key: dict, world_size: int,
                nothing_left: Callable[[Progress], bool]) -> Progress:
        """The :class:`Progress` to continue from ``state`` (see :meth:`loaders.protocols.Sources.restore`).

        Raises:
            ValueError: the state comes from another dataset, seed, shuffle or ``seq_len``, or is malformed.
        """
        p = Progress.from_state(state)
        if p.order_key != order_key:
            raise ValueError(f"loader state was written for {p.order_key}, this loader has {order_key};"
                             " resume with the same data and data.seed/shuffle/shuffle_block/shard_lanes/seq_len")
        if p.num_samples != self.manifest.total_documents:
            raise ValueError(f"loader state counts {p.num_samples} documents in an epoch, the data has "
                             f"{self.manifest.total_documents}; resume from the checkpoint as saved")
        over = len(p.complete_ranks) >= int(state["world_size"]) or nothing_left(p)
        p.world_size = world_size
        return self.new_progress(p.epoch + 1, order_key, world_size) if over else p

    def delivered(self, epoch: int, consumed: np.ndarray, chunk_tokens: np.ndarray) -> None:
        """Nothing to count per source."""

    def counted(self, bad: int, empty: int) -> None:
        """Nothing to add: the resume state counts bad and empty documents itself."""

    def metrics(self, metrics: dict) -> dict:
        """``metrics`` as they are."""
        return metrics

    def counts(self) -> None:
        """``None``: one dataset has no sources to count."""
        return None

    def origin(self, epoch: int, position: int) -> None:
        """``None``: every position is the one dataset's."""
        return None


def is_remote(url: str) -> bool:
    """Whether ``url`` names remote storage (``http(s)://``, ``s3://``, any fsspec scheme but ``file://``)."""
    return "://" in url and not url.startswith("file://")


def require_shard_source(cfg: DataConfig, cache: ShardSource | None) -> ShardSource:
    """The shard source to read ``cfg``'s data through: ``cache``, or :class:`LocalShards` when the data is local.

    Raises:
        ValueError: ``data.manifest`` (or a ``data.mixture`` source) is remote and no cache was given;
            without one every shard would fail to open and the epoch would be empty.
    """
    if cache is not None:
        return cache
    urls = [e.get("manifest", "") for e in cfg.mixture if isinstance(e, dict)] if cfg.mixture else [cfg.manifest]
    remote = [u for u in urls if is_remote(str(u))]
    if remote:
        key = "data.mixture" if cfg.mixture else "data.manifest"
        raise ValueError(f"{key}={remote[0]} is remote and no cache was given: pass cache=cache.ShardCache("
                         "cache.CacheConfig(dir=...)) (remote shards are read through the node cache)")
    return LocalShards()


def build_sources(cfg: DataConfig) -> Sources:
    """The sources of ``cfg``: a :class:`loaders.mixture.mixture.Mixture` when ``data.mixture`` lists
    datasets, else :class:`OneDataset` of ``data.manifest`` (manifests loaded through fsspec).

    Raises:
        FileNotFoundError / ValueError: a manifest is missing or invalid (names it);
            ``colaflow.config.ConfigError`` for a bad ``data.mixture`` entry.
    """
    if cfg.mixture:
        return Mixture.from_config(cfg)
    return OneDataset(Manifest.load(cfg.manifest), cfg.manifest)
