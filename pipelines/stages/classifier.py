"""A model-based quality filter, as DCLM (Li et al. 2024) and FineWeb-Edu filter with one: a
fastText classifier or a Hugging Face sequence-classification model, chosen by ``classifier.kind``
(:data:`pipelines.stages.scorers.SCORERS`). The document's probability of ``classifier.label`` is
its score; a score below ``classifier.threshold`` rejects it as ``quality_classifier``; a kept one
keeps its score in its metadata (``quality_score``, written into its sample) and counts in the
score histogram (``quality_score:<bin>`` events, ``stats.json``'s ``quality_scores``).
"""
from __future__ import annotations

from typing import Sequence

from pipelines.config import ClassifierConfig
from pipelines.records import Doc, DocMeta
from pipelines.stages.scorers import SCORERS, Scorer
from pipelines.stages.step import DocumentStep, StepResult

SCORE_BINS = 10  # histogram bins of width 0.1 over [0, 1]
REASON = "quality_classifier"


def score_bin(score: float) -> str:
    """The histogram bin of a score in [0, 1]: its lower edge, ``"0.0"`` .. ``"0.9"``."""
    return f"{min(int(score * SCORE_BINS), SCORE_BINS - 1) / SCORE_BINS:.1f}"


def check_model(cfg: ClassifierConfig) -> None:
    """Refuse a run whose ``classifier`` section names no usable model, before it starts
    (the check of ``cfg.kind``; nothing to check without ``cfg.path``).

    Raises:
        ImportError: the kind's package is not installed (one line saying what to install).
        colaflow.config.ConfigError: one line naming the path or label and what to do.
    """
    if cfg.path:
        SCORERS[cfg.kind].check(cfg)


class ClassifierStep(DocumentStep):
    """Rejects a document whose score (the probability of ``cfg.label``) is below ``cfg.threshold``
    as ``quality_classifier``; keeps one scored at or above it with its score in its metadata and a
    ``quality_score:<bin>`` event. Keeps every document unchanged when ``cfg.path`` is not set. The
    model loads in :meth:`setup`; a batch of documents is scored together (:meth:`apply_batch`).

    Args:
        cfg: the classifier settings.
    """

    def __init__(self, cfg: ClassifierConfig):
        self.cfg = cfg
        self._scorer: Scorer | None = None

    def setup(self) -> None:
        """Load the model of ``cfg.kind`` when ``cfg.path`` is set.

        Raises:
            ImportError: the kind's package is not installed (one line saying what to install).
            colaflow.config.ConfigError: not a model of that kind, or one without ``cfg.label``.
        """
        if self.cfg.path:
            self._scorer = SCORERS[self.cfg.kind].load(self.cfg)

    def scores(self, texts: Sequence[str]) -> list[float]:
        """The probability of ``cfg.label`` for each of ``texts``, in order.

        Raises:
            RuntimeError: :meth:`setup` has not loaded a model.
        """
        if self._scorer is None:
            raise RuntimeError("ClassifierStep.scores before setup() loaded classifier.path")
        return self._scorer.scores(texts)

    def apply(self, doc: Doc) -> StepResult:
        """:meth:`apply_batch` of one document."""
        return self.apply_batch([doc])[0]

    def apply_batch(self, docs: Sequence[Doc]) -> list[StepResult]:
        """Reject each document scored below the threshold; keep the others with their score
        (rounded to 4 places) in their metadata and the score's histogram event.

        Args:
            docs: the documents, scored together.
        Returns:
            one result per document, in order.
        """
        if not self.cfg.path:
            return [StepResult.keep(doc) for doc in docs]
        results = []
        for doc, score in zip(docs, self.scores([doc.text for doc in docs])):
            if score < self.cfg.threshold:
                results.append(StepResult.reject(REASON))
                continue
            meta = (doc.meta or DocMeta())._replace(quality_score=round(score, 4))
            results.append(StepResult.keep(doc._replace(meta=meta), {f"quality_score:{score_bin(score)}": 1}))
        return results
