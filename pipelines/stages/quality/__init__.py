"""Heuristic quality rules of Gopher, C4 and FineWeb, one document step per paper's rule set.

Each step runs a list of small rules, each with its own rejection reason (``quality_<rule>`` in
``stats.json``); the first failed rule rejects the document. The C4 step also removes lines and
keeps the rest of the document (counted as ``lines_removed:<rule>``). Which rules exist, their
thresholds and sources: ``pipelines.config.QualityConfig``; where they differ from datatrove:
``docs/preprocessing.md``.
"""
from __future__ import annotations

from pipelines.config import QualityConfig
from pipelines.stages.quality.c4 import C4Step
from pipelines.stages.quality.fineweb import FineWebStep
from pipelines.stages.quality.gopher import GopherQualityStep
from pipelines.stages.quality.repetition import RepetitionStep
from pipelines.stages.step import DocumentStep


def quality_steps(cfg: QualityConfig) -> list[DocumentStep]:
    """The quality steps in the order they run: Gopher quality (cheap counts), Gopher repetition
    (n-grams), C4 (removes lines), FineWeb (on the lines C4 kept, as in FineWeb's pipeline). A step
    is inactive (keeps every document) unless ``cfg.enabled`` and its own section's ``enabled``."""
    return [GopherQualityStep(cfg.gopher, cfg.enabled), RepetitionStep(cfg.repetition, cfg.enabled),
            C4Step(cfg.c4, cfg.enabled), FineWebStep(cfg.fineweb, cfg.enabled)]
