"""Validation during training: :func:`maybe_evaluate` after every step, the results kept for the
run's summary (``val_loss_first``/``val_loss_last``).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from trainer.evaluation.validation import EvalResult, Evaluator, resolve_val_manifest

log = logging.getLogger(__name__)


@dataclass
class Evaluation:
    """Evaluation state of one run.

    Attributes:
        evaluator: ``None`` when evaluation is off or there is no validation data.
        results: every evaluation of this process, in order.
    """

    evaluator: Evaluator | None
    results: list[EvalResult] = field(default_factory=list)

    def summary(self) -> dict:
        """Summary keys: ``val_loss_first``/``val_loss_last`` (nats per token), ``val_perplexity_last``,
        ``val_tokens`` (real tokens per evaluation, all ranks) and ``evaluations``; ``None`` values
        when nothing was evaluated."""
        first, last = (self.results[0], self.results[-1]) if self.results else (None, None)
        return {"val_loss_first": first and first.loss, "val_loss_last": last and last.loss,
                "val_perplexity_last": last and last.perplexity, "val_tokens": last and last.tokens,
                "evaluations": len(self.results)}


def start_evaluation(run) -> Evaluation:
    """Build the evaluator of ``run`` (a :class:`trainer.train.Run`) from ``eval.*``; logs once and
    returns an inactive :class:`Evaluation` when it is off or no validation split exists."""
    cfg = run.cfg
    if not cfg.eval.enabled:
        return Evaluation(None)
    # a data.mixture is validated on its first source's split unless eval.manifest says otherwise
    data = cfg.data.mixture[0].get("manifest", "") if cfg.data.mixture else cfg.data.manifest
    url = resolve_val_manifest(data, cfg.eval.manifest)
    if url is None:
        if run.info.is_main:
            log.warning("no validation loss: %s lists no 'val' split; preprocess with split.val_fraction=0.01 "
                        "or set eval.manifest", data)
        return Evaluation(None)
    return Evaluation(Evaluator(cfg, run.info, url, run.cache))


def maybe_evaluate(run) -> EvalResult | None:
    """Evaluate ``run.wrapped`` when ``run.step`` is a multiple of ``eval.every`` or the last step;
    log the result to ``run.log`` (rank 0) and keep it. A collective: every rank calls it each step."""
    if run.evaluation is None:
        run.evaluation = start_evaluation(run)
    every, step = run.cfg.eval.every, run.step
    if run.evaluation.evaluator is None or not (step == run.cfg.steps or (every and step % every == 0)):
        return None
    result = run.evaluation.evaluator.evaluate(run.wrapped, step)
    run.evaluation.results.append(result)
    run.log.log(result.record())
    return result


def evaluation_summary(run) -> dict:
    """:meth:`Evaluation.summary` of ``run`` (all ``None`` when it never evaluated)."""
    return (run.evaluation or Evaluation(None)).summary()
