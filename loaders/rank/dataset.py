"""colaflow's loader as a torch ``IterableDataset``, for training loops that are not colaflow's: torch's
``DataLoader``, torchdata's ``StatefulDataLoader``, the Hugging Face ``Trainer``, Lightning, torchtitan.

It is composed of colaflow's own parts, not a second loader. A ``DataLoader`` worker is one more
consumer of colaflow's split: worker ``w`` of ``W`` on rank ``r`` of ``R`` reads as the one-consumer
:class:`loaders.rank.loader.TextLoader` of consumer ``r * W + w`` of ``R * W``, the very consumer that
colaflow's own worker ``w`` of rank ``r`` is (:func:`loaders.order.split.consumer_arrays`). So each
document is read once per epoch across ranks and workers, the order does not depend on either count,
and the resume state is colaflow's, in global positions of the epoch's order.

State in torchdata's ``StatefulDataLoader`` protocol: :meth:`TokenDataset.state_dict` is called where the
dataset iterates (in each worker when ``num_workers > 0``) and holds the documents delivered through it
plus the state it started from; :meth:`TokenDataset.load_state_dict` takes one such state, or anything
holding several (a ``StatefulDataLoader.state_dict()``, a list of every rank's) and merges them:

* same world size and worker count: ``dataloader.load_state_dict(saved)`` gives every worker its own
  state back and the next batch is the one an uninterrupted run would have given (with
  ``data.pack_window=1``, bit for bit);
* another world size or worker count: ``dataset.load_state_dict([every rank's saved state])`` before
  the new ``DataLoader`` starts; the documents left are dealt anew, each still read once.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterator

from torch.utils.data import IterableDataset, get_worker_info
from torch.utils.data._utils.collate import default_collate_fn_map

from loaders.config import DataConfig
from loaders.formats import FORMATS, HFBatch, TitanBatch
from loaders.protocols import ShardSource
from loaders.rank.batch import TokenBatch
from loaders.rank.loader import TextLoader
from loaders.rank.world import resolve_ranks_per_node, resolve_world
from loaders.sources import build_sources, require_shard_source

STATE_KEY = "colaflow_loader"  # a TokenDataset state is {STATE_KEY: the TextLoader state}


def _refuse_collate(batch, *, collate_fn_map=None):
    """``default_collate`` of several colaflow batches: refused (they are whole batches already)."""
    raise TypeError(f"loaders.TokenDataset yields whole batches ({type(batch[0]).__name__}); create the "
                    "DataLoader with batch_size=None (its rows and tokens per batch are data.micro_batch_size and "
                    "data.seq_len)")


# torch's documented way to extend default_collate: by type, checked before Mapping and tuple
for _type in (TokenBatch, HFBatch, TitanBatch):
    default_collate_fn_map[_type] = _refuse_collate


def find_states(saved: Any) -> list[dict]:
    """Every :meth:`TokenDataset.state_dict` inside ``saved`` (itself, a ``StatefulDataLoader`` state,
    a Lightning checkpoint, or lists/dicts of them), in the order met."""
    if isinstance(saved, dict):
        if STATE_KEY in saved:
            return [saved[STATE_KEY]]
        return [s for v in saved.values() for s in find_states(v)]
    if isinstance(saved, (list, tuple)):
        return [s for v in saved for s in find_states(v)]
    return []


class TokenDataset(IterableDataset):
    """colaflow's text loader of one rank as a torch ``IterableDataset`` of whole batches (see the module
    docstring): use it with ``DataLoader(dataset, batch_size=None, num_workers=...)``.

    ``data.num_workers`` and ``data.step_policy`` do not apply: the ``DataLoader``'s workers read, and
    ranks end an epoch after their own number of batches (as with any ``IterableDataset``). Call
    :meth:`set_epoch` before each epoch, as with torch's ``DistributedSampler``: a ``DataLoader``'s
    workers start from the dataset as it is in the main process.

    Args:
        cfg: ``data:`` settings (``data.format`` picks the batch form, :mod:`loaders.formats`).
        cache: ``cache.ShardCache`` for remote shards; ``None`` reads local shards in place.
        rank, world_size: this process's place in the job; ``None`` (both): ``torch.distributed``'s when
            initialised, else rank 0 of 1 (:func:`loaders.rank.world.resolve_world`).
        format: overrides ``data.format``.

    Raises:
        ValueError: an invalid config (names the field), remote data without a cache, ``WORLD_SIZE`` > 1
            in the environment with no process group and no explicit rank, or ranks per node that do not
            divide the world size (:func:`loaders.rank.world.resolve_ranks_per_node`).
        FileNotFoundError: no manifest.
    """

    def __init__(self, cfg: DataConfig, cache: ShardSource | None = None, rank: int | None = None,
                 world_size: int | None = None, format: str | None = None):
        cfg = dataclasses.replace(cfg, format=format or cfg.format)
        cfg.validate()
        self.rank, self.world_size = resolve_world(rank, world_size)
        self.ranks_per_node = resolve_ranks_per_node(cfg.ranks_per_node, self.rank, self.world_size)
        self.format = FORMATS[cfg.format]
        # one in-process consumer per DataLoader worker; no collective inside a worker process
        self.cfg = dataclasses.replace(cfg, num_workers=0, step_policy="uneven")
        self.cache = require_shard_source(cfg, cache)
        self.sources = build_sources(cfg)
        self._state: dict | None = None  # the TextLoader state to start from
        self._epoch: int | None = None
        self._loader: TextLoader | None = None
        self._consumer: tuple[int, int] | None = None  # (worker, workers) self._loader reads as

    def text_loader(self) -> TextLoader:
        """The :class:`TextLoader` of this process's consumer: DataLoader worker ``w`` of ``W``
        (``get_worker_info``; the main process is worker 0 of 1) reads as consumer ``rank * W + w`` of
        ``world_size * W``, from the loaded state and epoch."""
        info = get_worker_info()
        consumer = (info.id, info.num_workers) if info is not None else (0, 1)
        if self._loader is None or self._consumer != consumer:
            if self._loader is not None:  # another layout (the main process's loader, forked): carry its state
                self._state = self._loader.state_dict()
            w, n = consumer
            loader = TextLoader(self.cfg, self.sources, self.cache, self.rank * n + w, self.world_size * n,
                                in_process=True, ranks_per_node=self.ranks_per_node * n)
            if self._state is not None:
                loader.load_state_dict(self._state)
            if self._epoch is not None:
                loader.set_epoch(self._epoch)
            self._loader, self._consumer = loader, consumer
        return self._loader

    def __iter__(self) -> Iterator:
        """The rest of the current epoch's batches of this consumer, in ``data.format``."""
        convert = self.format.convert
        for batch in self.text_loader():
            yield convert(batch)

    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch`` next (from its start, unless the loaded state points into it)."""
        self._epoch = epoch
        if self._loader is not None:
            self._loader.set_epoch(epoch)

    def state_dict(self) -> dict:
        """This consumer's resume state: ``{"colaflow_loader": TextLoader state}`` (JSON-able; the
        documents delivered through this process plus the state it started from)."""
        return {STATE_KEY: self.text_loader().state_dict()}

    def load_state_dict(self, saved: Any) -> None:
        """Continue from ``saved``: a :meth:`state_dict`, a ``StatefulDataLoader.state_dict()``, or a list of
        them (every rank's); the states found in it are merged, so it loads at any world size and
        worker count.

        Raises:
            ValueError: no state of this dataset in ``saved``, or one of other data or order settings.
        """
        states = find_states(saved)
        if not states:
            raise ValueError(f"no loaders.TokenDataset state in the given {type(saved).__name__} (expected "
                             f"'{STATE_KEY}' entries, as TokenDataset.state_dict() and StatefulDataLoader.state_dict() "
                             "write them)")
        self._state = states[0] if len(states) == 1 else self.sources.merge(states)
        self._loader = self._consumer = None
        self.text_loader()  # checks the state now, in the caller's process

    def __getstate__(self) -> dict:
        # a worker process gets the state, not this process's loader
        d = dict(self.__dict__)
        if self._loader is not None:
            d["_state"] = self._loader.state_dict()
        d["_loader"] = d["_consumer"] = None
        return d
