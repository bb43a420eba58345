"""A model-based quality filter: a fastText classifier given by path (Joulin et al. 2017, "Bag of
Tricks for Efficient Text Classification"), as DCLM (Li et al. 2024) and FineWeb-Edu filter with
one. The document's probability of ``classifier.label`` is its score; a score below
``classifier.threshold`` rejects it as ``quality_classifier``; a kept one keeps its score in its
metadata (``quality_score``, written into its sample) and counts in the score histogram (``quality_score:<bin>`` events, ``stats.json``'s ``quality_scores``). Needs
``pip install 'colaflow[curation]'``.
"""
from __future__ import annotations

import fsspec

from colaflow.config import ConfigError
from pipelines.config import ClassifierConfig
from pipelines.records import Doc, DocMeta
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
        if "://" not in cfg.path:  # a local model is loaded once here (a remote one on the workers)
            load_model(cfg)


def load_model(cfg: ClassifierConfig):
    """Load ``cfg.path`` (a local copy of a remote path) and check that it gives ``cfg.label``: a
    model without that label would score every document 0 and filter them all.

    Raises:
        ImportError: fastText is not installed (one line saying what to install).
        colaflow.config.ConfigError: the file is not a fastText model, or lacks ``cfg.label``.
    """
    try:
        import fasttext
    except ImportError as e:
        raise ImportError("classifier.path needs fastText: pip install 'colaflow[curation]'") from e
    path = cfg.path
    try:
        model = fasttext.load_model(fsspec.open_local(f"simplecache::{path}") if "://" in path else path)
    except ValueError as e:  # fastText: "<path> has wrong file format!"
        raise ConfigError(f"classifier.path={path}: not a fastText model ({e}); give a .bin saved by "
                          "fasttext.train_supervised(...).save_model") from None
    labels = list(model.get_labels())
    if cfg.label not in labels:
        shown = ", ".join(labels[:10]) + (", ..." if len(labels) > 10 else "")
        raise ConfigError(f"classifier.label={cfg.label}: the model {path} has no such label (its labels: "
                          f"{shown or 'none'}); set classifier.label to one of them")
    return model


class ClassifierStep(DocumentStep):
    """Rejects a document whose fastText score (the probability of ``cfg.label``) is below
    ``cfg.threshold`` as ``quality_classifier``; keeps one scored at or above it with its score in
    its metadata and a ``quality_score:<bin>`` event. Keeps every document unchanged when ``cfg.path`` is not set.
    The model loads in :meth:`setup` (a local copy of a remote path)."""

    def __init__(self, cfg: ClassifierConfig):
        self.cfg = cfg
        self._model = None

    def setup(self) -> None:
        """Load the model when ``cfg.path`` is set.

        Raises:
            ImportError: fastText is not installed (one line saying what to install).
            colaflow.config.ConfigError: not a fastText model, or one without ``cfg.label``.
        """
        if not self.cfg.path:
            return
        self._model = load_model(self.cfg)

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
        """Reject below the threshold, else keep it with its score (rounded to 4 places) in its
        metadata and the score's histogram event."""
        if not self.cfg.path:
            return StepResult.keep(doc)
        score = self.score(doc.text)
        if score < self.cfg.threshold:
            return StepResult.reject(REASON)
        meta = (doc.meta or DocMeta())._replace(quality_score=round(score, 4))
        return StepResult.keep(doc._replace(meta=meta), {f"quality_score:{score_bin(score)}": 1})

