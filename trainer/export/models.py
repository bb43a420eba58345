"""The models an export compares: the fp32 PyTorch reference and its ONNX/``.pt`` variants, each
behind one call ``logits(input_ids, position_ids, document_ids) -> float32 [B, T, vocab]``.

ONNX: ``torch.onnx.export(..., dynamo=True)`` (``torch.export`` graph → ONNX via onnxscript) of
:meth:`trainer.model.GPT.logits` with dynamic batch and sequence axes; fp16 by
``onnxruntime.transformers.float16.convert_float_to_float16`` (inputs/outputs kept in their types);
INT8 by ``onnxruntime.quantization.quantize_dynamic`` (int8 weights, activations quantized at run
time; Jacob et al. 2018, "Quantization and Training of Neural Networks for Efficient
Integer-Arithmetic-Only Inference"). Provenance goes into the ONNX ``metadata_props``.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import warnings

import numpy as np
import torch

INPUTS = ("input_ids", "position_ids", "document_ids")
PROVENANCE_KEY = "colaflow.provenance"


class LogitsModule(torch.nn.Module):
    """``forward(input_ids, position_ids, document_ids)`` (int64 [B, T]) → fp32 logits [B, T, vocab]
    of a :class:`trainer.model.GPT` (the graph ONNX export traces)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, position_ids, document_ids):
        """int64 ``[B, T]`` ids, positions, document ids → fp32 logits ``[B, T, vocab]``."""
        return self.model.logits(input_ids, position_ids, document_ids).float()


def torch_runner(model: torch.nn.Module):
    """A ``logits`` callable (numpy int64 arrays in, float32 numpy out) running ``model`` on CPU."""
    model.eval()

    def run(input_ids, position_ids, document_ids):
        with torch.no_grad():
            out = model.logits(torch.from_numpy(input_ids), torch.from_numpy(position_ids),
                               torch.from_numpy(document_ids))
        return out.float().numpy()
    return run


@contextlib.contextmanager
def quiet_converters():
    """Hold back the exporters' and quantizer's advisory output (torchvision-op notices, deprecation
    and axis-naming warnings, onnxruntime's pre-processing hint) so the export prints its own table;
    errors still raise."""
    root, onnx_log = logging.getLogger(), logging.getLogger("torch.onnx")
    levels = root.level, onnx_log.level
    root.setLevel(logging.ERROR)
    onnx_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        root.setLevel(levels[0])
        onnx_log.setLevel(levels[1])


def export_onnx(model: torch.nn.Module, path: str, example: tuple[np.ndarray, ...], opset: int = 0) -> None:
    """Write ``model``'s logits graph to ``path`` (one file, weights inside) with dynamic ``batch``
    and ``seq`` axes on every input; ``example``: numpy int64 ``(input_ids, position_ids,
    document_ids)`` used for tracing.

    Raises:
        RuntimeError / torch.onnx errors: the graph cannot be exported.
    """
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
    args = tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in example)
    with quiet_converters():
        program = torch.onnx.export(LogitsModule(model).eval(), args, dynamo=True, input_names=list(INPUTS),
                                    output_names=["logits"], dynamic_shapes={n: {0: batch, 1: seq} for n in INPUTS},
                                    opset_version=opset or None, external_data=False, verbose=False)
        program.save(path, external_data=False)


def convert_fp16(src: str, dst: str) -> None:
    """Half-precision copy of ONNX model ``src`` at ``dst`` (int64 inputs and fp32 logits kept)."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16
    onnx.save(convert_float_to_float16(onnx.load(src), keep_io_types=True), dst)


def quantize_int8(src: str, dst: str) -> None:
    """Dynamic INT8 copy of ONNX model ``src`` at ``dst`` (signed int8 weights)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    with quiet_converters():
        quantize_dynamic(src, dst, weight_type=QuantType.QInt8)


def set_provenance(path: str, record: dict) -> None:
    """Store ``record`` as JSON in the ONNX model's ``metadata_props`` (key ``colaflow.provenance``)."""
    import onnx
    model = onnx.load(path)
    kept = [p for p in model.metadata_props if p.key != PROVENANCE_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    model.metadata_props.add(key=PROVENANCE_KEY, value=json.dumps(record, sort_keys=True, default=str))
    onnx.save(model, path)


def read_provenance(path: str) -> dict:
    """The provenance record of an exported ONNX model (``{}`` when it has none)."""
    import onnx
    model = onnx.load(path, load_external_data=False)
    for p in model.metadata_props:
        if p.key == PROVENANCE_KEY:
            return json.loads(p.value)
    return {}


def ort_runner(path: str, threads: int = 0):
    """A ``logits`` callable running ONNX model ``path`` on onnxruntime's CPU provider."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    options.log_severity_level = 3  # warnings about fp16 casts on CPU are expected
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])

    def run(input_ids, position_ids, document_ids):
        feeds = dict(zip(INPUTS, (input_ids, position_ids, document_ids)))
        return session.run(["logits"], feeds)[0].astype(np.float32, copy=False)
    return run


def file_bytes(path: str) -> int:
    """Size of ``path`` in bytes."""
    return os.path.getsize(path)
