"""Pipeline settings for tests whose corpora are a few short synthetic texts."""
from __future__ import annotations

from colaflow.config import load_config
from pipelines.config import PipelineConfig

# The web-text quality rules (on by default) would filter short synthetic texts (Gopher wants 50
# words), and near dedup (on by default) would merge templated ones ("doc 1 ...", "doc 2 ..."):
# tests of the other stages turn both off here; the quality and near-dedup tests turn them on.
SYNTHETIC = ("quality.enabled=false", "dedup.near=false")


def synthetic_config() -> PipelineConfig:
    """The default pipeline config with :data:`SYNTHETIC` applied.

    Returns:
        A fresh :class:`pipelines.config.PipelineConfig` the caller may change.
    """
    return load_config(PipelineConfig, None, list(SYNTHETIC))
