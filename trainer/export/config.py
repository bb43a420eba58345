"""Configuration of ``python -m trainer export``: formats, precisions, batch sizes, validation data
and the tolerance each variant must meet before it is written under its final name."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from colaflow.config import check_fields, setting

FORMATS = ("onnx", "pt", "hf")  # the writers: trainer.export.pipeline.WRITERS
PRECISIONS = ("fp32", "fp16", "int8")


@dataclass
class Tolerance:
    """Limits of one variant against the fp32 PyTorch model on the validation batches.

    Attributes:
        max_abs_diff: largest allowed ``|logit - reference logit|`` over real-token positions.
        ppl_delta: largest allowed ``|ppl - ppl_ref| / ppl_ref`` (relative perplexity change).
        min_argmax_agreement: smallest allowed fraction of real tokens whose top-1 prediction
            equals the reference's.
    """

    max_abs_diff: float = setting(1e-4, ge=0)
    ppl_delta: float = setting(1e-3, ge=0)
    min_argmax_agreement: float = setting(0.999, ge=0.0)  # above 1: no variant can pass (a forced failure)


@dataclass
class ToleranceConfig:
    """Per-variant tolerances (``tolerance.int8.ppl_delta=0.05`` on the command line).

    Defaults: fp32 ONNX matches to 1e-4 in logits; fp16 to 1.0 (half precision keeps ~3
    significant digits: the demo model's logits, up to ~30 in magnitude, differ by up to 0.4 at
    0.002 % perplexity change) and 0.5 % in perplexity; dynamic INT8 (per-tensor weight
    quantization) is judged by perplexity (2 %) and top-1 agreement, not logits; the consolidated
    ``.pt`` must reproduce the checkpoint exactly; the ``hf`` folder loaded by ``transformers`` in
    fp32 meets the fp32 limits, and loaded in bf16 is reported without limits (set
    ``tolerance.hf_bf16.*`` to enforce some).
    """

    fp32: Tolerance = field(default_factory=Tolerance)
    fp16: Tolerance = field(default_factory=lambda: Tolerance(1.0, 0.005, 0.99))
    int8: Tolerance = field(default_factory=lambda: Tolerance(float("inf"), 0.02, 0.9))
    pt: Tolerance = field(default_factory=lambda: Tolerance(1e-6, 1e-6, 1.0))
    hf: Tolerance = field(default_factory=Tolerance)
    hf_bf16: Tolerance = field(default_factory=lambda: Tolerance(float("inf"), float("inf"), 0.0))


@dataclass
class ExportConfig:
    """What ``python -m trainer export`` writes and how it checks it.

    Attributes:
        format: ``onnx`` (one file per precision), ``pt`` (the consolidated ``torch.save`` file) or
            ``hf`` (a Hugging Face Llama folder: :mod:`trainer.export.hf`).
        precisions: ONNX precisions among ``fp32``, ``fp16`` (weights and activations in half,
            inputs/outputs kept) and ``int8`` (onnxruntime dynamic quantization of MatMul weights).
        batch_sizes: batch sizes whose latency is measured on onnxruntime (or PyTorch for ``pt``).
        data: dataset or validation ``manifest.json`` (path, folder or URL); ``""`` = the
            checkpoint's ``data.manifest``. Its ``val`` split is used when listed, else the
            manifest itself (then the report says ``held_out: false``).
        seq_len: tokens per validation row (0 = the checkpoint's ``data.seq_len``).
        rows: rows per validation batch.
        batches: validation batches compared (the same for every variant).
        latency_runs: timed runs per batch size (after one warm-up run); the median is reported.
        opset: ONNX opset version (0 = the exporter's default).
        threads: onnxruntime intra-op threads and PyTorch threads of the reference (0 = their
            defaults, all cores; 1 gives steadier latencies on a shared machine).
        max_shard_size: ``hf``: the largest ``model-*.safetensors`` shard (``save_pretrained``'s
            ``max_shard_size``: ``"5GB"``, ``"200MB"``); one ``model.safetensors`` below it.
        generate_tokens: ``hf``: greedy tokens that ``transformers`` must generate exactly as
            colaflow's :func:`trainer.model.greedy_decode` does.
        tolerance: per-variant limits (:class:`ToleranceConfig`).
    """

    format: str = "onnx"
    precisions: list[str] = field(default_factory=lambda: ["fp32", "int8"])
    batch_sizes: list[int] = field(default_factory=lambda: [1, 8])
    data: str = ""
    seq_len: int = setting(0, ge=0)
    rows: int = setting(8, ge=1)
    batches: int = setting(2, ge=1)
    latency_runs: int = setting(5, ge=1)
    opset: int = setting(0, ge=0)
    threads: int = setting(0, ge=0)
    max_shard_size: str = "5GB"
    generate_tokens: int = setting(20, ge=1)
    tolerance: ToleranceConfig = field(default_factory=ToleranceConfig)

    def validate(self) -> None:
        """Check the declared ranges (:func:`colaflow.config.check_fields`, tolerances included) and
        the lists; raise ``ValueError`` naming the bad field and its valid values."""
        check_fields(self)
        if self.format not in FORMATS:
            raise ValueError(f"--format {self.format!r}: use one of {', '.join(FORMATS)}")
        bad = [p for p in self.precisions if p not in PRECISIONS]
        if bad or not self.precisions:
            raise ValueError(f"--precision {','.join(map(str, self.precisions))!r}: use some of {', '.join(PRECISIONS)}")
        if not self.batch_sizes or any(int(b) < 1 for b in self.batch_sizes):
            raise ValueError(f"--batch-sizes {self.batch_sizes}: use positive integers, e.g. 1,8")
        if not re.fullmatch(r"\d+\s*[KMG]i?B", str(self.max_shard_size).strip(), re.IGNORECASE):
            raise ValueError(f"max_shard_size={self.max_shard_size!r}: use a size such as 5GB or 200MB")
