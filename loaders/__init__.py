"""Resumable loaders: the text loader (a global order independent of the world size, exact resume,
document-aware packing) over one dataset or a weighted mixture, and the image loaders; see
``loaders/README.md``.

Text::

    from loaders import DataConfig, build_text_loader
    loader = build_text_loader(DataConfig(manifest="runs/demo/shards"), cache, rank, world_size)
    loader.set_epoch(epoch)
    for batch in loader:          # loaders.rank.batch.TokenBatch
        ...
    state = loader.global_state_dict()   # every rank calls it; save it with the checkpoint
    loader.load_state_dict(state)        # any world size / worker count

In another framework's loop (torch ``DataLoader``, torchdata ``StatefulDataLoader``, HF ``Trainer``,
Lightning, torchtitan; ``docs/frameworks.md``)::

    from loaders import DataConfig, TokenDataset
    dataset = TokenDataset(DataConfig(manifest="runs/demo/shards", format="hf"))  # rank from torch.distributed
    dataloader = StatefulDataLoader(dataset, batch_size=None, num_workers=2)
"""
import importlib

# Imported on first use: loader worker processes import ``loaders.worker.pool`` and must not pay for
# torch, which ``loaders.rank.loader`` and ``loaders.rank.batch`` import.
_EXPORTS = {"DataConfig": ".config", "TextLoader": ".rank.loader", "TokenBatch": ".rank.batch",
            "TokenDataset": ".rank.dataset", "build_text_loader": ".rank.loader", "merge_states": ".order.progress"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    """Lazy access to the package's public names (PEP 562)."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'loaders' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
