"""Hugging Face Llama models for tests, built from configs with random weights (no downloads)."""
from __future__ import annotations

import sys

import torch


def relink_logs() -> None:
    """Point transformers' log handler at the live ``sys.stderr``. It keeps the stream (and that
    stream's ``flush``) of the moment it was made; when that was a ``capsys`` stream of an earlier
    test (closed since), each later transformers warning prints ``--- Logging error ---`` and a
    traceback into whatever test runs then. A no-op until transformers' logging is imported."""
    hf_logging = sys.modules.get("transformers.utils.logging")
    handler = getattr(hf_logging, "_default_handler", None)
    if handler is not None:  # not setStream(): it flushes the old stream, which may be closed
        handler.stream, handler.flush = sys.stderr, sys.stderr.flush


def save_random_llama(folder: str, vocab: int = 96, kv_heads: int = 2, tie: bool = True, seed: int = 0,
                      **config):
    """Save a randomly initialised ``LlamaForCausalLM`` (hidden 32, 2 layers, 4 heads, SwiGLU width 88,
    RoPE base 500000) with ``save_pretrained`` into ``folder``; returns the model (fp32, eval mode).
    ``config``: further ``LlamaConfig`` fields."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(**{"vocab_size": vocab, "hidden_size": 32, "intermediate_size": 88, "num_hidden_layers": 2,
                         "num_attention_heads": 4, "num_key_value_heads": kv_heads, "max_position_embeddings": 64,
                         "rms_norm_eps": 1e-5, "tie_word_embeddings": tie,
                         "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}, **config})
    from trainer.export.hf import quiet
    model = LlamaForCausalLM(cfg).eval()
    with quiet():
        model.save_pretrained(folder)
    return model
