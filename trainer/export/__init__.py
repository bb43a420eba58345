"""Verified model export (``python -m trainer export``): ONNX fp32/fp16/int8 and the consolidated
``.pt``, each checked on validation data before it is written under its final name.
"""
from trainer.export.config import ExportConfig, Tolerance, ToleranceConfig
from trainer.export.pipeline import ConversionReport, run_export

__all__ = ["ConversionReport", "ExportConfig", "Tolerance", "ToleranceConfig", "run_export"]
