"""A model-based quality filter: a fastText classifier given by path (Joulin et al. 2017, "Bag of
Tricks for Efficient Text Classification"), as DCLM (Li et al. 2024) and FineWeb-Edu filter with
one. The document's probability of ``classifier.label`` is its score; a score below
``classifier.threshold`` rejects it as ``quality_classifier``, a kept one counts in the score
histogram (``quality_score:<bin>`` events, ``stats.json``'s ``quality_scores``). Needs
``pip install 'colaflow[curation]'``.
"""
from __future__ import annotations

import fsspec

from colaflow.config import ConfigError
from pipelines.config import ClassifierConfig
from pipelines.records import Doc
from pipelines.stages.step import DocumentStep, StepResult

SCORE_BINS = 10  # histogram bins of width 0.1 over [0, 1]
REASON = "quality_classifier"


def score_bin(score: float) -> str:
    """The histogram bin of a score in [0, 1]: its lower edge, ``"0.0"`` .. ``"0.9"``."""
    return f"{min(int(score * SCORE_BINS), SCORE_BINS - 1) / SCORE_BINS:.1f}"


def check_model(cfg: ClassifierConfig) -> None:
    """Refuse a run whose ``classifier.path`` does not exist, before it starts.

    Raises:
        colaflow.config.ConfigError: one line naming the path and what to do.
    """
    if cfg.path:
        fs, path = fsspec.core.url_to_fs(cfg.path)
        if not fs.isfile(path):
            raise ConfigError(f"classifier.path={cfg.path}: no such file; give a fastText .bin model "
                                    "(fasttext.train_supervised(...).save_model) or classifier.path=null")


class ClassifierStep(DocumentStep):
    """Rejects a document whose fastText score (the probability of ``cfg.label``) is below
    ``cfg.threshold`` as ``quality_classifier``; keeps one scored at or above it with a
    ``quality_score:<bin>`` event. Keeps every document unchanged when ``cfg.path`` is not set.
    The model loads in :meth:`setup` (a local copy of a remote path)."""

    def __init__(self, cfg: ClassifierConfig):
        self.cfg = cfg
        self._model = None

    def setup(self) -> None:
        """Load the model when ``cfg.path`` is set.

        Raises:
            ImportError: fastText is not installed (one line saying what to install).
        """
        if not self.cfg.path:
            return
        try:
            import fasttext
        except ImportError as e:
            raise ImportError("classifier.path needs fastText: pip install 'colaflow[curation]'") from e
        path = self.cfg.path
        self._model = fasttext.load_model(fsspec.open_local(f"simplecache::{path}") if "://" in path else path)

    def score(self, text: str) -> float:
        """The probability of ``cfg.label`` for ``text`` (newlines read as spaces: fastText
        classifies one line), 0 when the model does not give it.

        Raises:
            RuntimeError: :meth:`setup` has not loaded a model.
        """
        if self._model is None:
            raise RuntimeError("ClassifierStep.score before setup() loaded classifier.path")
        # the model's own predict, not FastText.predict: its np.array(copy=False) fails under numpy 2
        probs = self._model.f.predict(text.replace("\n", " ") + "\n", -1, 0.0, "strict")
        return min(next((p for p, label in probs if label == self.cfg.label), 0.0), 1.0)

    def apply(self, doc: Doc) -> StepResult:
        """Reject below the threshold, else keep unchanged with the score's histogram event."""
        if not self.cfg.path:
            return StepResult.keep(doc)
        score = self.score(doc.text)
        if score < self.cfg.threshold:
            return StepResult.reject(REASON)
        return StepResult.keep(doc, {f"quality_score:{score_bin(score)}": 1})

