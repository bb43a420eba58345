"""Validation loss and perplexity over a fixed set of held-out batches, on every rank.

The validation data is the ``val`` split that preprocessing lists in the training manifest
(``split.val_fraction``; :mod:`pipelines.stages.split`), or any manifest named by ``eval.manifest``. It is
read through the public loader (:func:`loaders.build_text_loader`, in order, no shuffle), rewound to
its first batch before each evaluation, so every evaluation sees the same tokens: each rank reads
``ceil(eval.tokens / (world_size x rows x seq_len))`` micro-batches (fewer when the split is
smaller; the loader's step policy keeps the ranks in step). Loss = summed cross entropy over every
real token (labels != -100) of all ranks / their count, from one all-reduce of two numbers and one
host read per evaluation: the training steps themselves get no extra host sync. Perplexity =
exp(loss) (Jelinek et al. 1977).
"""
from __future__ import annotations

import dataclasses
import logging
import math
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from shards.format.tokens import check_token_ids
from trainer.config import TrainConfig
from trainer.distributed import parallel

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvalResult:
    """One evaluation.

    Attributes:
        step: optimizer step after which it ran.
        loss: mean cross entropy per real token, all ranks (nats).
        perplexity: ``exp(loss)`` (``inf`` on overflow).
        tokens: real tokens evaluated, all ranks.
        seconds: wall time of the evaluation on this rank.
    """

    step: int
    loss: float
    perplexity: float
    tokens: int
    seconds: float

    def record(self) -> dict:
        """The metrics record (``metrics.jsonl``/TensorBoard/Prometheus): ``step``, ``val_loss``,
        ``val_perplexity``, ``val_tokens``, ``val_seconds``."""
        return {"step": self.step, "val_loss": self.loss, "val_perplexity": self.perplexity,
                "val_tokens": self.tokens, "val_seconds": self.seconds}


def perplexity(loss: float) -> float:
    """``exp(loss)`` for a loss in nats per token; ``inf`` when it overflows."""
    return math.exp(loss) if loss < 700 else float("inf")


def resolve_val_manifest(data_manifest: str, eval_manifest: str = "") -> str | None:
    """URL of the validation manifest: ``eval_manifest`` when set, else the ``val`` split listed in
    ``data_manifest``; ``None`` when that manifest lists none.

    Raises:
        FileNotFoundError / ValueError: a manifest is missing or is not a manifest.
    """
    from shards.format.manifest import Manifest, split_manifest_url
    if eval_manifest:
        Manifest.load(eval_manifest)  # fail now, with the manifest's own message
        return eval_manifest
    manifest = Manifest.load(data_manifest)
    return split_manifest_url(data_manifest, manifest, "val") if "val" in manifest.splits else None


def loss_sums(model, batches, device: torch.device, precision: str = "fp32", stage: int = 0):
    """Summed loss and real-token count of ``batches`` (iterable of :class:`TokenBatch`) under
    ``torch.no_grad``: device tensors ``(float64 [], int64 [])``, no host sync. ``model`` is the
    (wrapped) GPT whose forward returns the summed cross entropy in nats."""
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    tokens = torch.zeros((), dtype=torch.long, device=device)
    with torch.no_grad():
        for b in batches:
            b = b.to(device, non_blocking=True) if device.type == "cuda" else b
            with parallel.autocast(device, precision, stage):
                loss_sum += model(b.input_ids, b.position_ids, b.document_ids, b.labels, b.one_document_rows).double()
            tokens += (b.labels != -100).sum()
    return loss_sum, tokens


class Evaluator:
    """Evaluates a model on the fixed validation batches of this rank.

    Args:
        cfg: the run's config (``eval``, ``data``, ``precision``, ``zero.stage``).
        info: this process's rank, world size and device.
        manifest_url: validation manifest (see :func:`resolve_val_manifest`).
        cache: the run's shard cache, or ``None`` to read local shards in place.
    """

    def __init__(self, cfg: TrainConfig, info: parallel.DistInfo, manifest_url: str, cache=None):
        from loaders import build_text_loader
        self.cfg, self.info, self.manifest_url = cfg, info, manifest_url
        rows = cfg.eval.micro_batch_size or cfg.data.micro_batch_size
        data = dataclasses.replace(cfg.data, manifest=manifest_url, micro_batch_size=rows, shuffle=False,
                                   num_workers=0, remainder="uneven", step_policy="pad")
        self.loader = build_text_loader(data, cache, info.rank, info.world_size, in_process=True)
        self.start_state = self.loader.state_dict()
        self.batches_per_rank = max(1, math.ceil(cfg.eval.tokens / (info.world_size * rows * data.seq_len)))

    def batches(self):
        """This rank's validation micro-batches, from the first one (the loader is rewound), their
        token ids checked against the model's vocabulary (:func:`shards.format.tokens.check_token_ids`)."""
        self.loader.load_state_dict(self.start_state)
        for _, batch in zip(range(self.batches_per_rank), self.loader):
            check_token_ids(batch.host_ids, self.cfg.model.vocab_size,
                            lambda: f"{self.manifest_url}: validation batch of {', '.join(batch.keys[:3])}")
            yield batch

    def evaluate(self, model, step: int) -> EvalResult:
        """Loss and perplexity of ``model`` (every rank calls this with its part of the model).

        Raises:
            RuntimeError: the validation data yielded no real token (an empty split).
        """
        t0 = time.perf_counter()
        was_training = model.training
        model.eval()
        try:
            loss_sum, tokens = loss_sums(model, self.batches(), self.info.device, self.cfg.precision,
                                         self.cfg.zero.stage)
        finally:
            model.train(was_training)
        totals = torch.stack([loss_sum, tokens.double()])
        if dist.is_available() and dist.is_initialized() and self.info.world_size > 1:
            dist.all_reduce(totals)
        total_loss, total_tokens = totals.tolist()
        if total_tokens < 1:
            raise RuntimeError(f"{self.manifest_url}: the validation data has no tokens; preprocess with a larger "
                               "split.val_fraction or set eval.enabled=false")
        loss = total_loss / total_tokens
        return EvalResult(step, loss, perplexity(loss), int(total_tokens), time.perf_counter() - t0)
