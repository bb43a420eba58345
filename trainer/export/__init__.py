"""Verified model export (``python -m trainer export``): ONNX fp32/fp16/int8 and the consolidated
``.pt``, each checked on validation data before it is written under its final name.

- :mod:`.config`: :class:`ExportConfig` and per-variant tolerances.
- :mod:`.models`: ONNX export/conversion and the ``logits`` runners (PyTorch, onnxruntime).
- :mod:`.verify`: validation batches, logit/perplexity/argmax comparison, latency.
- :mod:`.provenance`: the record stored in every exported model.
- :mod:`.pipeline`: :func:`run_export`, temp-name-then-rename commits, ``conversion_report.json``.
"""
from trainer.export.config import ExportConfig, Tolerance, ToleranceConfig
from trainer.export.pipeline import ConversionReport, run_export

__all__ = ["ConversionReport", "ExportConfig", "Tolerance", "ToleranceConfig", "run_export"]
