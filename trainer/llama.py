"""colaflow's decoder in Hugging Face's Llama terms: ``transformers.LlamaConfig`` from a
:class:`~trainer.config.ModelConfig` and back, and tensor names both ways.

colaflow's GPT with ``norm: rmsnorm`` is Llama's architecture (Touvron et al. 2023): pre-norm
RMSNorm, rotate-half RoPE, SwiGLU, no biases, optionally tied embeddings and grouped-query
attention. Only the layout of a few tensors differs: colaflow stacks q, k and v into one
``attn.qkv`` matrix and gate and up into one ``mlp.gate_up``; Llama keeps them apart.
RoPE needs no permutation (both rotate halves, not interleaved pairs).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from trainer.config import ModelConfig

MODEL_TYPE = "llama"
ARCHITECTURE = "LlamaForCausalLM"
_LAYER = "model.layers.{i}."


class NotExpressible(ValueError):
    """A colaflow model config with no Llama equivalent (a usage error: export it another way)."""


@dataclass
class SpecialIds:
    """The tokenizer's special ids an exported model's configs carry (``None``: the tokenizer has none)."""

    bos_id: int | None = None
    eos_id: int | None = None
    pad_id: int | None = None


def check_expressible(cfg: ModelConfig) -> None:
    """Raise :class:`NotExpressible` (one line) when ``cfg`` has no Llama equivalent (LayerNorm)."""
    if cfg.norm != "rmsnorm":
        raise NotExpressible(f"model.norm={cfg.norm}: the Hugging Face Llama layout has RMSNorm only; export this "
                         "model with --format onnx or pt")


def llama_config(cfg: ModelConfig, ids: SpecialIds, dtype: str = "float32"):
    """The ``transformers.LlamaConfig`` of a colaflow model.

    Args:
        cfg: the model's sizes (``vocab_size`` set).
        ids: bos/eos/pad ids of its tokenizer.
        dtype: the weights' dtype name (``float32``, ``bfloat16``).

    Raises:
        NotExpressible: see :func:`check_expressible`.
    """
    from transformers import LlamaConfig
    check_expressible(cfg)
    config = LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.ffn_width,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.kv_heads,
        head_dim=cfg.head_dim, hidden_act="silu", max_position_embeddings=cfg.max_seq_len, rms_norm_eps=cfg.norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta}, attention_bias=False,
        mlp_bias=False, tie_word_embeddings=cfg.tie_embeddings, bos_token_id=ids.bos_id, eos_token_id=ids.eos_id,
        pad_token_id=ids.pad_id, dtype=dtype, architectures=[ARCHITECTURE])
    # readers built on transformers 4 (and llama.cpp's converter) look for the base frequency here,
    # not in rope_parameters; without it they would fall back to 10000
    config.rope_theta = cfg.rope_theta
    return config


def architecture_of(config: dict, where: str) -> dict:
    """The :meth:`ModelConfig.architecture` fields of a Hugging Face ``config.json`` (a dict).

    Args:
        config: the parsed ``config.json`` (transformers 4 or 5 keys).
        where: the file's path, for messages.

    Raises:
        ValueError: not a Llama model, or a feature colaflow does not implement (RoPE scaling,
            biases, another activation, a head size other than ``hidden_size / heads``), in one line.
    """
    from transformers import LlamaConfig
    kind = config.get("model_type")
    if kind != MODEL_TYPE:
        names = ", ".join(config.get("architectures") or []) or "none named"
        raise ValueError(f"{where}: model_type {kind!r} ({names}) is not a Llama model; model.init_from reads "
                         f"{ARCHITECTURE} folders (Llama 2/3, TinyLlama, SmolLM, or a colaflow hf export)")
    c = LlamaConfig.from_dict(config)
    rope = dict(c.rope_parameters or {})
    heads, kv = c.num_attention_heads, c.num_key_value_heads or c.num_attention_heads
    unsupported = []
    if rope.get("rope_type", "default") != "default":
        unsupported.append(f"RoPE scaling rope_type={rope['rope_type']!r} (colaflow implements plain RoPE)")
    if c.hidden_act != "silu":
        unsupported.append(f"hidden_act={c.hidden_act!r} (colaflow's SwiGLU uses silu)")
    if c.attention_bias or getattr(c, "mlp_bias", False):
        unsupported.append("attention_bias/mlp_bias (colaflow's projections have no biases)")
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    if head_dim * heads != c.hidden_size:
        unsupported.append(f"head_dim={head_dim} x {heads} heads != hidden_size={c.hidden_size}")
    if unsupported:
        raise ValueError(f"{where}: {'; '.join(unsupported)}: not supported, so these weights would load wrong; "
                         "pick a model without it")
    return {"vocab_size": c.vocab_size, "d_model": c.hidden_size, "n_layers": c.num_hidden_layers,
            "n_heads": heads, "n_kv_heads": kv, "ffn_hidden": c.intermediate_size,
            "max_seq_len": c.max_position_embeddings, "norm": "rmsnorm", "tie_embeddings": bool(c.tie_word_embeddings),
            "rope_theta": float(rope.get("rope_theta", 10000.0)), "norm_eps": float(c.rms_norm_eps)}


def to_hf(state: dict, cfg: ModelConfig) -> dict:
    """colaflow ``GPT.state_dict()`` → ``LlamaForCausalLM`` tensors (views; ``lm_head.weight`` only
    when untied)."""
    hd = cfg.head_dim
    q_rows, kv_rows = cfg.n_heads * hd, cfg.kv_heads * hd
    out = {"model.embed_tokens.weight": state["tok_emb.weight"], "model.norm.weight": state["norm.weight"]}
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = state["lm_head.weight"]
    for i in range(cfg.n_layers):
        src, dst = f"blocks.{i}.", _LAYER.format(i=i)
        q, k, v = state[src + "attn.qkv.weight"].split([q_rows, kv_rows, kv_rows])
        gate, up = state[src + "mlp.gate_up.weight"].chunk(2)
        out.update({dst + "input_layernorm.weight": state[src + "norm1.weight"],
                    dst + "self_attn.q_proj.weight": q, dst + "self_attn.k_proj.weight": k,
                    dst + "self_attn.v_proj.weight": v, dst + "self_attn.o_proj.weight": state[src + "attn.proj.weight"],
                    dst + "post_attention_layernorm.weight": state[src + "norm2.weight"],
                    dst + "mlp.gate_proj.weight": gate, dst + "mlp.up_proj.weight": up,
                    dst + "mlp.down_proj.weight": state[src + "mlp.down.weight"]})
    return out


def from_hf(tensors: dict, cfg: ModelConfig, where: str) -> dict:
    """``LlamaForCausalLM`` tensors → a colaflow ``GPT.state_dict()`` of ``cfg`` (fp32 copies).

    A tied model's ``lm_head.weight``, when stored, is dropped (it is the embedding); rotary
    ``inv_freq`` buffers some folders carry are ignored.

    Raises:
        ValueError: a tensor is missing, or has a shape other than ``cfg`` needs (named, one line).
    """
    def take(name: str, shape: tuple) -> torch.Tensor:
        if name not in tensors:
            raise ValueError(f"{where}: no tensor {name}; not a complete {ARCHITECTURE} checkpoint")
        t = tensors[name]
        if tuple(t.shape) != shape:
            raise ValueError(f"{where}: {name} has shape {tuple(t.shape)}, config.json implies {shape}")
        return t.to(torch.float32)

    d, hd, ffn = cfg.d_model, cfg.head_dim, cfg.ffn_width
    q_rows, kv_rows = cfg.n_heads * hd, cfg.kv_heads * hd
    out = {"tok_emb.weight": take("model.embed_tokens.weight", (cfg.vocab_size, d)),
           "norm.weight": take("model.norm.weight", (d,))}
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = take("lm_head.weight", (cfg.vocab_size, d))
    for i in range(cfg.n_layers):
        src, dst = _LAYER.format(i=i), f"blocks.{i}."
        out.update({
            dst + "norm1.weight": take(src + "input_layernorm.weight", (d,)),
            dst + "attn.qkv.weight": torch.cat([take(src + "self_attn.q_proj.weight", (q_rows, d)),
                                                take(src + "self_attn.k_proj.weight", (kv_rows, d)),
                                                take(src + "self_attn.v_proj.weight", (kv_rows, d))]),
            dst + "attn.proj.weight": take(src + "self_attn.o_proj.weight", (d, q_rows)),
            dst + "norm2.weight": take(src + "post_attention_layernorm.weight", (d,)),
            dst + "mlp.gate_up.weight": torch.cat([take(src + "mlp.gate_proj.weight", (ffn, d)),
                                                   take(src + "mlp.up_proj.weight", (ffn, d))]),
            dst + "mlp.down.weight": take(src + "mlp.down_proj.weight", (d, ffn))})
    return out
