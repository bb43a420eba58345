"""Language identification filter with ``py3langid``.

``py3langid`` is a maintained fork of langid.py (Lui & Baldwin 2012, "langid.py: An
Off-the-shelf Language Identification Tool", ACL demo): a multinomial naive Bayes model over
byte n-grams for 97 languages. Its model (``py3langid/data/model.npz.xz``, 4.6 MB) ships
inside the wheel and is loaded from there, so nothing is downloaded at run time; see
``docs/preprocessing.md`` for the choice over fastText ``lid.176`` and CLD3.
"""
from __future__ import annotations

from pipelines.config import LanguageConfig
from pipelines.records import Doc
from pipelines.stages.step import DocumentStep, StepResult


class LanguageFilter:
    """Classify a cleaned text and say why it is filtered.

    The identifier is built once per instance (about 1 s: the model is decompressed), and
    only when ``cfg.enabled``. Probabilities are normalised over all 97 languages.
    """

    def __init__(self, cfg: LanguageConfig):
        self.cfg = cfg
        self.allowed = frozenset(cfg.allowed or ())
        self._identifier = None
        if cfg.enabled:
            from py3langid.langid import MODEL_FILE, LanguageIdentifier

            self._identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)

    def classify(self, text: str) -> tuple[str, float]:
        """``(ISO 639-1 code, probability in [0, 1])`` of the first ``cfg.max_chars`` characters.

        Raises:
            RuntimeError: the filter is disabled (no model loaded).
        """
        if self._identifier is None:
            raise RuntimeError("language identification is disabled (language.enabled=false)")
        lang, prob = self._identifier.classify(text[: self.cfg.max_chars])
        return lang, float(prob)

    def reason(self, text: str) -> str | None:
        """``lang_unsure`` (top probability below ``cfg.threshold``), ``lang_<code>`` (not in
        ``cfg.allowed``) or ``None`` (kept, or the filter is off)."""
        if self._identifier is None:
            return None
        lang, prob = self.classify(text)
        if prob < self.cfg.threshold:
            return "lang_unsure"
        if self.allowed and lang not in self.allowed:
            return f"lang_{lang}"
        return None


class LanguageStep(DocumentStep):
    """Rejects a document by :meth:`LanguageFilter.reason` (``lang_<code>``, ``lang_unsure``); keeps
    every document when ``cfg.enabled`` is false. The identifier is built in :meth:`setup`."""

    def __init__(self, cfg: LanguageConfig):
        self.cfg = cfg
        self._filter: LanguageFilter | None = None

    def setup(self) -> None:
        """Build the :class:`LanguageFilter` (loads the model when enabled: about 1 s)."""
        self._filter = LanguageFilter(self.cfg)

    def apply(self, doc: Doc) -> StepResult:
        """Reject with the language reason, else keep unchanged.

        Raises:
            RuntimeError: :meth:`setup` has not run.
        """
        if self._filter is None:
            raise RuntimeError("LanguageStep.apply before setup(): the language model is not loaded")
        reason = self._filter.reason(doc.text)
        return StepResult.reject(reason) if reason else StepResult.keep(doc)
