"""Held-out evaluation: validation loss/perplexity during training (:mod:`.validation`, :mod:`.loop`)."""
from trainer.evaluation.loop import Evaluation, evaluation_summary, maybe_evaluate
from trainer.evaluation.validation import EvalResult, Evaluator, loss_sums, perplexity, resolve_val_manifest

__all__ = ["EvalResult", "Evaluation", "Evaluator", "evaluation_summary", "loss_sums", "maybe_evaluate",
           "perplexity", "resolve_val_manifest"]
