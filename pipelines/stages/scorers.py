"""The quality classifier's models, one registry keyed by ``classifier.kind`` (:data:`SCORERS`):

* ``fasttext``: a fastText ``.bin`` classifier (Joulin et al. 2017), as DCLM (Li et al. 2024)
  filters with one; ``pip install 'colaflow[curation]'``.
* ``hf``: a Hugging Face sequence-classification model in a local folder
  (``AutoModelForSequenceClassification``), as FineWeb-Edu scores pages with one; scored in
  batches of ``classifier.batch_size`` on the GPU when there is one, else on the CPU; needs torch
  (``pip install 'colaflow[train]'``).

A score is the model's probability of ``classifier.label``. Each kind has a cheap check, run on
the driver before the run starts, and a loader, run once per worker. This module does not import
``pipelines.config`` (the config imports :data:`SCORERS` for ``classifier.kind``'s choices).
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Callable, NamedTuple, Protocol, Sequence

import fsspec

from colaflow.config import ConfigError

if TYPE_CHECKING:
    from pipelines.config import ClassifierConfig


class Scorer(Protocol):
    """A loaded model that scores texts."""

    def scores(self, texts: Sequence[str]) -> list[float]:
        """The probability of the configured label for each text, in [0, 1], in order."""
        ...


def _check_labels(cfg: "ClassifierConfig", labels: list[str]) -> None:
    """Refuse a ``cfg.label`` the model does not give: it would score every document 0 and filter all.

    Raises:
        colaflow.config.ConfigError: one line listing the model's labels.
    """
    if cfg.label not in labels:
        shown = ", ".join(labels[:10]) + (", ..." if len(labels) > 10 else "")
        raise ConfigError(f"classifier.label={cfg.label}: the model {cfg.path} has no such label (its labels: "
                          f"{shown or 'none'}); set classifier.label to one of them")


class FastTextScorer:
    """A fastText classifier; a remote ``cfg.path`` is read through a local copy.

    Args:
        cfg: the classifier settings (``path``, ``label``).
    Raises:
        ImportError: fastText is not installed (one line saying what to install).
        colaflow.config.ConfigError: the file is not a fastText model, or lacks ``cfg.label``.
    """

    def __init__(self, cfg: "ClassifierConfig"):
        try:
            import fasttext
        except ImportError as e:
            raise ImportError("classifier.kind=fasttext needs fastText: pip install 'colaflow[curation]'") from e
        path = cfg.path
        try:
            self.model = fasttext.load_model(fsspec.open_local(f"simplecache::{path}") if "://" in path else path)
        except ValueError as e:  # fastText: "<path> has wrong file format!"
            raise ConfigError(f"classifier.path={path}: not a fastText model ({e}); give a .bin saved by "
                              "fasttext.train_supervised(...).save_model") from None
        _check_labels(cfg, list(self.model.get_labels()))
        self.label = cfg.label

    def scores(self, texts: Sequence[str]) -> list[float]:
        """The probability of the label for each text (newlines read as spaces: fastText
        classifies one line), 0 when the model does not give it."""
        out = []
        for text in texts:
            # the model's own predict, not FastText.predict: its np.array(copy=False) fails under numpy 2
            probs = self.model.f.predict(text.replace("\n", " ") + "\n", -1, 0.0, "strict")
            out.append(min(next((p for p, label in probs if label == self.label), 0.0), 1.0))
        return out


def check_fasttext(cfg: "ClassifierConfig") -> None:
    """The file exists; a local one is also loaded here, so a bad model or label refuses the run.

    Raises:
        ImportError: fastText is not installed.
        colaflow.config.ConfigError: no such file, not a fastText model, or no ``cfg.label``.
    """
    fs, path = fsspec.core.url_to_fs(cfg.path)
    if not fs.isfile(path):
        raise ConfigError(f"classifier.path={cfg.path}: no such file; give a fastText .bin model "
                          "(fasttext.train_supervised(...).save_model) or classifier.path=null")
    if "://" not in cfg.path:  # a remote model is loaded on the workers only
        FastTextScorer(cfg)


class HFScorer:
    """A Hugging Face sequence-classification model and its tokenizer from the local folder
    ``cfg.path``, in eval mode on ``cuda`` when available, else the CPU.

    Args:
        cfg: the classifier settings (``path``, ``label``, ``batch_size``, ``max_tokens``).
    Raises:
        ImportError: torch is not installed (one line saying what to install).
        colaflow.config.ConfigError: ``cfg.label`` is not one of the model's labels.
    """

    def __init__(self, cfg: "ClassifierConfig"):
        try:
            import torch
        except ImportError as e:
            raise ImportError("classifier.kind=hf needs torch: pip install 'colaflow[train]'") from e
        from transformers import AutoModelForSequenceClassification, AutoTokenizer
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.path, local_files_only=True)
        model = AutoModelForSequenceClassification.from_pretrained(cfg.path, local_files_only=True)
        labels = [model.config.id2label[i] for i in range(model.config.num_labels)]
        _check_labels(cfg, labels)
        if self.tokenizer.pad_token is None:  # decoder models (Llama) have none; batches need one
            self.tokenizer.pad_token = self.tokenizer.eos_token
            model.config.pad_token_id = self.tokenizer.pad_token_id
        self.model = model.to(self.device).eval()
        self.index = labels.index(cfg.label)
        # a tokenizer that knows its model's length caps it (an unknown one says 1e30)
        self.batch_size, self.max_tokens = cfg.batch_size, min(cfg.max_tokens, self.tokenizer.model_max_length)

    def scores(self, texts: Sequence[str]) -> list[float]:
        """The softmax probability of the label for each text (its first ``max_tokens`` tokens, fewer
        where the tokenizer's ``model_max_length`` is lower), ``batch_size`` texts per forward pass."""
        import torch  # loaded by __init__; not imported at module level, where workers may lack it
        out: list[float] = []
        for start in range(0, len(texts), self.batch_size):
            batch = self.tokenizer(list(texts[start:start + self.batch_size]), truncation=True,
                                   max_length=self.max_tokens, padding=True, return_tensors="pt").to(self.device)
            with torch.inference_mode():
                logits = self.model(**batch).logits.float()
            out.extend(logits.softmax(-1)[:, self.index].tolist())
        return out


def check_hf(cfg: "ClassifierConfig") -> None:
    """The folder holds a model config that gives ``cfg.label`` (only ``config.json`` is read here;
    the weights load on the workers).

    Raises:
        colaflow.config.ConfigError: a remote path, no model folder, or no ``cfg.label``.
    """
    if "://" in cfg.path or not os.path.isfile(os.path.join(cfg.path, "config.json")):
        raise ConfigError(f"classifier.path={cfg.path}: no Hugging Face model folder; give a local folder "
                          "saved by save_pretrained (config.json, weights, tokenizer) or classifier.path=null")
    from transformers import AutoConfig
    config = AutoConfig.from_pretrained(cfg.path, local_files_only=True)
    _check_labels(cfg, [config.id2label[i] for i in range(config.num_labels)])


class ScorerKind(NamedTuple):
    """One kind of model: its driver-side check and its loader.

    Attributes:
        check: refuses a bad ``classifier`` section before the run (raises ``ConfigError``).
        load: the :class:`Scorer` for a ``classifier`` section, once per worker.
    """

    check: Callable[["ClassifierConfig"], None]
    load: Callable[["ClassifierConfig"], Scorer]


SCORERS = {"fasttext": ScorerKind(check_fasttext, FastTextScorer), "hf": ScorerKind(check_hf, HFScorer)}
