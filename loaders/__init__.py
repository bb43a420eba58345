"""Resumable loaders: the text loader (global deterministic order, exact resume, document-aware
packing) and the image loaders.

Text::

    from loaders import DataConfig, build_text_loader
    loader = build_text_loader(DataConfig(manifest="runs/demo/shards"), cache, rank, world_size)
    loader.set_epoch(epoch)
    for batch in loader:          # loaders.batch.TokenBatch
        ...
    state = loader.global_state_dict()   # every rank calls it; save it with the checkpoint
    loader.load_state_dict(state)        # any world size / worker count

A weighted mixture of datasets (``data.mixture``) gives a ``loaders.mixture.MixtureLoader``
with the same interface. See ``loaders.order`` (sample order and split), ``loaders.packing``, ``loaders.progress``
(resume state), ``loaders.steps`` (equal step counts across ranks: ``data.step_policy``),
``loaders.member_index`` (per-node shard member offsets) and ``python -m loaders keys --help``.
"""
from .batch import TokenBatch
from .config import DataConfig
from .build import build_text_loader
from .dataset import TextLoader
from .mixture import MixtureLoader
from .progress import merge_states

__all__ = ["DataConfig", "MixtureLoader", "TextLoader", "TokenBatch", "build_text_loader", "merge_states"]
