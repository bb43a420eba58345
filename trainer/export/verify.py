"""Checking an exported model against the fp32 PyTorch model on held-out validation batches.

Per variant: max and mean ``|logit - reference|`` over real-token positions (labels != -100),
perplexity ``exp(mean next-token cross entropy)`` and its relative change, top-1 (argmax)
agreement, and latency per batch size (median of timed runs after one warm-up). A variant passes
when every number is within its :class:`trainer.export.config.Tolerance`.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import time
from dataclasses import dataclass, field

import numpy as np

from trainer.export.config import Tolerance


@dataclass
class ValidationBatch:
    """One validation micro-batch as numpy int64 arrays ``[B, T]`` (labels: -100 = no loss)."""

    input_ids: np.ndarray
    position_ids: np.ndarray
    document_ids: np.ndarray
    labels: np.ndarray

    def inputs(self, rows: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The model inputs, the first ``rows`` rows (cycled when the batch has fewer)."""
        arrays = (self.input_ids, self.position_ids, self.document_ids)
        if rows is None:
            return arrays
        take = np.arange(rows) % self.input_ids.shape[0]
        return tuple(np.ascontiguousarray(a[take]) for a in arrays)


def validation_batches(manifest_url: str, seq_len: int, rows: int, count: int) -> list[ValidationBatch]:
    """The first ``count`` batches of the dataset at ``manifest_url`` in manifest order (public
    loader API, one process, no shuffle).

    Raises:
        ValueError: the data yields no batch with a real token.
    """
    from loaders import build_text_loader
    from loaders.config import DataConfig
    loader = build_text_loader(DataConfig(manifest=manifest_url, seq_len=seq_len, micro_batch_size=rows,
                                          num_workers=0, shuffle=False), rank=0, world_size=1, in_process=True)
    out = []
    for _, b in zip(range(count), loader):
        out.append(ValidationBatch(*(t.numpy().astype(np.int64) for t in
                                     (b.input_ids, b.position_ids, b.document_ids, b.labels))))
    if not any((b.labels != -100).any() for b in out):
        raise ValueError(f"{manifest_url}: no validation tokens to compare on; pass --data with a non-empty manifest")
    return out


def token_losses(logits: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(nll, argmax)`` at real-token positions: float64 next-token cross entropy (nats) and the
    int64 top-1 prediction, each 1-D over positions where ``labels != -100``."""
    mask = labels != -100
    x = logits[mask].astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    log_z = np.log(np.exp(x).sum(axis=-1))
    nll = log_z - x[np.arange(x.shape[0]), labels[mask]]
    return nll, x.argmax(axis=-1)


@dataclass
class Reference:
    """The fp32 PyTorch model's outputs on the validation batches."""

    logits: list
    nll: float  # mean nats per real token
    tokens: int
    argmax: np.ndarray

    @property
    def perplexity(self) -> float:
        """``exp(nll)``: perplexity of the fp32 PyTorch model on the validation tokens."""
        return math.exp(self.nll)


def reference(runner, batches: list[ValidationBatch]) -> Reference:
    """Run the reference ``runner`` (``logits`` callable) over ``batches``."""
    logits, nll, top = [], [], []
    for b in batches:
        out = runner(*b.inputs())
        logits.append(out)
        n, a = token_losses(out, b.labels)
        nll.append(n)
        top.append(a)
    nll_all = np.concatenate(nll)
    return Reference(logits, float(nll_all.mean()), int(nll_all.size), np.concatenate(top))


@dataclass
class VariantResult:
    """Verification of one exported variant (one row of ``conversion_report.json``).

    Attributes:
        name: file name it is written under when it passes (e.g. ``model.int8.onnx``).
        format / precision: ``onnx``/``pt`` and ``fp32``/``fp16``/``int8``.
        bytes: file size.
        max_abs_diff / mean_abs_diff: logit differences vs the reference at real-token positions.
        perplexity / ppl_delta: the variant's perplexity and ``|ppl - ppl_ref| / ppl_ref``.
        argmax_agreement: fraction of real tokens with the reference's top-1 prediction.
        latency_ms: batch size → median milliseconds per forward of ``[batch, seq_len]``.
        passed: all limits met; ``failures`` says which were not; ``error`` a conversion error.
        path: where the file is now (the final name, or ``*.rejected``; ``None`` if none was made).
        notes: lines the command prints beside the table (e.g. why no tokenizer was exported).
        details: further format-specific findings (``hf``: the greedy generations compared, the files).
    """

    name: str
    format: str
    precision: str
    bytes: int = 0
    max_abs_diff: float | None = None
    mean_abs_diff: float | None = None
    perplexity: float | None = None
    ppl_delta: float | None = None
    argmax_agreement: float | None = None
    latency_ms: dict = field(default_factory=dict)
    passed: bool = False
    failures: list = field(default_factory=list)
    error: str | None = None
    path: str | None = None
    notes: list = field(default_factory=list)
    details: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """JSON-able dict (infinite/NaN numbers as strings)."""
        def clean(v):
            return str(v) if isinstance(v, float) and not math.isfinite(v) else v
        return {k: clean(v) for k, v in dataclasses.asdict(self).items()}


def compare(result: VariantResult, runner, ref: Reference, batches: list[ValidationBatch], tol: Tolerance) -> None:
    """Fill ``result`` with the differences of ``runner`` from ``ref`` and check them against ``tol``."""
    max_diff, diff_sum, diff_n, nll, top = 0.0, 0.0, 0, [], []
    for b, ref_logits in zip(batches, ref.logits):
        out = runner(*b.inputs())
        if out.shape != ref_logits.shape:
            raise ValueError(f"logits of shape {out.shape}, expected {ref_logits.shape}")
        mask = b.labels != -100
        diff = np.abs(out[mask].astype(np.float64) - ref_logits[mask])
        max_diff = max(max_diff, float(diff.max()) if diff.size else 0.0)
        diff_sum += float(diff.sum())
        diff_n += diff.size
        n, a = token_losses(out, b.labels)
        nll.append(n)
        top.append(a)
    nll_mean = float(np.concatenate(nll).mean())
    result.max_abs_diff, result.mean_abs_diff = max_diff, diff_sum / max(diff_n, 1)
    result.perplexity = math.exp(nll_mean) if nll_mean < 700 else float("inf")
    result.ppl_delta = abs(result.perplexity - ref.perplexity) / ref.perplexity
    result.argmax_agreement = float((np.concatenate(top) == ref.argmax).mean())
    checks = [("max_abs_diff", result.max_abs_diff, "<=", tol.max_abs_diff),
              ("ppl_delta", result.ppl_delta, "<=", tol.ppl_delta),
              ("argmax_agreement", result.argmax_agreement, ">=", tol.min_argmax_agreement)]
    result.failures = [f"{k} {v:.3g} not {op} {lim:.3g}" for k, v, op, lim in checks
                       if not (v <= lim if op == "<=" else v >= lim)]  # NaN fails both ways
    result.passed = not result.failures


def latency_ms(runner, batch: ValidationBatch, batch_sizes: list[int], runs: int) -> dict[int, float]:
    """Median milliseconds of ``runner`` on ``[b, seq_len]`` inputs for each ``b`` in ``batch_sizes``
    (one untimed warm-up run each; ``time.perf_counter``)."""
    out = {}
    for b in batch_sizes:
        inputs = batch.inputs(int(b))
        runner(*inputs)
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            runner(*inputs)
            times.append(time.perf_counter() - t0)
        out[int(b)] = round(1000 * statistics.median(times), 3)
    return out
