"""``build_text_loader``: one dataset (:mod:`loaders.rank.loader`) or a mixture (:mod:`loaders.mixture.loader`).

Kept apart from both so that neither imports the other's builder (the mixture loader builds on
the single-dataset loader).
"""
from __future__ import annotations

from loaders.config import DataConfig
from loaders.rank.loader import TextLoader
from loaders.rank.loader import build_text_loader as build_single_loader
from loaders.mixture.loader import build_mixture_loader
from loaders.rank.steps import StepSync


def build_text_loader(cfg: DataConfig, cache=None, rank: int = 0, world_size: int = 1,
                      in_process: bool = False, step_sync: StepSync | None = None) -> TextLoader:
    """The resumable text loader of ``rank`` of ``world_size``: a :class:`loaders.mixture.loader.MixtureLoader`
    when ``cfg.mixture`` lists sources, else a :class:`loaders.rank.loader.TextLoader` of ``cfg.manifest``.

    Arguments as :func:`loaders.rank.loader.build_text_loader`. Raises ``FileNotFoundError``/``ValueError``
    (``colaflow.config.ConfigError`` for a bad ``data.mixture``) naming the source or field.
    """
    if cfg.mixture:
        return build_mixture_loader(cfg, cache, rank, world_size, in_process, step_sync)
    return build_single_loader(cfg, cache, rank, world_size, in_process, step_sync)
