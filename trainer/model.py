"""GPT-style decoder over packed rows: RoPE from ``position_ids``, attention within one document.

Architecture (pre-norm, as in GPT-2/LLaMA): token embedding → N × [norm → causal self-attention →
residual, norm → SwiGLU MLP → residual] → final norm → (tied) output projection. Several documents
share a row; ``document_ids`` makes attention block-diagonal causal (:mod:`trainer.attention`) so
no token sees another document, and ``position_ids`` restarts RoPE at 0 per document. The loss is the SUM of token cross
entropies over real tokens (labels != -100); the trainer divides by the global token count.

References: Vaswani et al. 2017 (attention); Su et al. 2021 (RoPE, arXiv:2104.09864);
Shazeer 2020 (SwiGLU, arXiv:2002.05202); Zhang & Sennrich 2019 (RMSNorm).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from trainer import attention, kernels, memory
from trainer.choices import NORM_EPS, OFFLOAD_MODES, checkpoint_mode
from trainer.config import ModelConfig


class Norm(nn.Module):
    """RMSNorm or LayerNorm over the last dim [..., D], through :mod:`trainer.kernels` (fused Triton
    kernels on CUDA, PyTorch otherwise)."""

    def __init__(self, dim: int, kind: str = "rmsnorm", eps: float = NORM_EPS):
        super().__init__()
        self.kind, self.eps = kind, eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if kind == "layernorm" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise ``x`` [..., D] over its last dim; same shape and dtype."""
        if self.kind == "rmsnorm":
            return kernels.rms_norm(x, self.weight, self.eps)
        return kernels.layer_norm(x, self.weight, self.bias, self.eps)


def rope_cos_sin(position_ids: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE tables for per-token positions: ``position_ids`` [B, T] → cos, sin [B, 1, T, head_dim] fp32."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=position_ids.device, dtype=torch.float32) / head_dim)
    angles = position_ids.float()[..., None] * inv_freq  # [B, T, head_dim/2]
    angles = torch.cat([angles, angles], dim=-1)[:, None]
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [B, H, T, hd] by the RoPE angles (rotate-half convention); keeps ``x.dtype``."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


class Attention(nn.Module):
    """Self-attention with RoPE inside one document (:mod:`trainer.attention`): ``n_heads`` query
    heads over ``n_kv_heads`` key/value heads (grouped-query attention when fewer; query head ``i``
    reads key/value head ``i // (n_heads / n_kv_heads)``, as in Llama). ``qkv`` stacks the query,
    key and value projections in that order: ``[(n_heads + 2 n_kv_heads) * head_dim, d_model]``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.kv_heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.d_model, (cfg.n_heads + 2 * cfg.kv_heads) * cfg.head_dim, bias=False)
        self.proj = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.d_model, bias=False)

    def forward(self, x, cos, sin, mask: attention.AttentionMask):
        """``x`` [B, T, D] with RoPE tables ``cos``/``sin`` and the row's document ``mask`` (built
        once per forward by :func:`trainer.attention.document_mask`) → [B, T, D]."""
        b, t, _ = x.shape
        hd, kv = self.head_dim, self.n_kv_heads
        q, k, v = self.qkv(x).split([self.n_heads * hd, kv * hd, kv * hd], dim=-1)
        q = q.view(b, t, self.n_heads, hd).transpose(1, 2)
        k, v = (z.view(b, t, kv, hd).transpose(1, 2) for z in (k, v))
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = mask.attend(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(b, t, self.n_heads * hd))


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))`` with gate and up fused into one matrix (``gate_up``: the gate's
    ``ffn_width`` rows, then the up projection's)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        hidden = cfg.ffn_width
        self.gate_up = nn.Linear(cfg.d_model, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, cfg.d_model, bias=False)

    def forward(self, x):
        """[..., D] → [..., D]."""
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class Block(nn.Module):
    """Pre-norm transformer block. ``checkpointing`` (``none``/``full``/``selective``) recomputes
    activations in backward and ``offload`` keeps its saved tensors in host memory
    (:mod:`trainer.memory`)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm1 = Norm(cfg.d_model, cfg.norm, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.norm2 = Norm(cfg.d_model, cfg.norm, cfg.norm_eps)
        self.mlp = SwiGLU(cfg)
        self.checkpointing = "none"
        self.offload = False

    def _forward(self, x, cos, sin, mask):
        x = x + self.attn(self.norm1(x), cos, sin, mask)
        return x + self.mlp(self.norm2(x))

    def forward(self, x, cos, sin, mask):
        """Residual attention + MLP on ``x`` [B, T, D] → [B, T, D]."""
        # checkpoint inside the module so FSDP's hooks on this block wrap the recomputation too
        with memory.offload(self.offload, x.device):
            return memory.run_block(self._forward, x, cos, sin, mask, mode=self.checkpointing)


class GPT(nn.Module):
    """Decoder-only language model.

    ``forward(input_ids, position_ids, document_ids, labels)`` with int64 tensors [B, T] returns the
    fp32 scalar SUM of cross entropy over tokens whose label != -100 (units: nats).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.vocab_size < 1:
            raise ValueError("ModelConfig.vocab_size must be set (0 means: fill it from the manifest first)")
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = Norm(cfg.d_model, cfg.norm, cfg.norm_eps)
        self.lm_head = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.attention_backend = cfg.attention
        self.offload_model = False
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2 init: N(0, 0.02), residual output projections scaled by 1/sqrt(2 * n_layers)."""
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * self.cfg.n_layers) if name.endswith(("proj.weight", "down.weight")) else 0.02
                nn.init.normal_(p, std=std)

    def set_activation_checkpointing(self, mode: bool | str) -> None:
        """Checkpointing of every block: ``none`` (or ``False``), ``full`` (or ``True``) or
        ``selective`` (:func:`trainer.choices.checkpoint_mode`)."""
        for block in self.blocks:
            block.checkpointing = checkpoint_mode(mode)

    def set_activation_offload(self, mode: str) -> None:
        """Keep the tensors saved for backward in host memory: ``none``, ``blocks`` (each block's)
        or ``model`` (the whole forward's; :data:`trainer.choices.OFFLOAD_MODES`)."""
        if mode not in OFFLOAD_MODES:
            raise ValueError(f"memory.offload_activations={mode!r}: use {', '.join(OFFLOAD_MODES)}")
        self.offload_model = mode == "model"
        for block in self.blocks:
            block.offload = mode == "blocks"

    def set_attention(self, backend: str) -> None:
        """Attention backend of the forward: ``auto``, ``flex`` or ``dense`` (:mod:`trainer.attention`)."""
        attention.resolve(backend, torch.device("cpu"))  # raises on an unknown name
        self.attention_backend = backend

    @property
    def output_weight(self) -> torch.Tensor:
        """The ``[vocab, d_model]`` output projection (the token embedding when tied)."""
        return self.tok_emb.weight if self.lm_head is None else self.lm_head.weight

    def hidden_states(self, input_ids, position_ids, document_ids, one_document: bool | None = None) -> torch.Tensor:
        """Final-norm hidden states [B, T, d_model] (compute dtype); ``one_document``: see :meth:`forward`."""
        cos, sin = rope_cos_sin(position_ids, self.cfg.head_dim, self.cfg.rope_theta)
        mask = attention.document_mask(document_ids, self.attention_backend, one_document)
        x = self.tok_emb(input_ids)
        for block in self.blocks:
            x = block(x, cos, sin, mask)
        return self.norm(x)

    def logits(self, input_ids, position_ids, document_ids) -> torch.Tensor:
        """Output logits [B, T, vocab] (for evaluation and tests; training uses the fused loss)."""
        h = self.hidden_states(input_ids, position_ids, document_ids)
        return h @ self.output_weight.to(h.dtype).t()

    def forward(self, input_ids, position_ids, document_ids, labels, one_document: bool | None = None) -> torch.Tensor:
        """Summed next-token cross entropy (fp32 scalar, nats) over real tokens.

        Args: ``input_ids``, ``position_ids``, ``document_ids``, ``labels``: int64 ``[B, T]``;
        labels of -100 are ignored. Attention stays within one document; positions restart per
        document. ``one_document``: every row holds one document (or only padding), as known on the
        host (``TokenBatch.one_document_rows``; ``None``: checked on CPU tensors only), so attention
        is plain causal. The loss is fused with the output projection (:mod:`trainer.kernels`). With
        ``set_activation_offload("model")`` every tensor saved for backward waits in host memory."""
        with memory.offload(self.offload_model, input_ids.device):
            h = self.hidden_states(input_ids, position_ids, document_ids, one_document)
            kind = h.device.type
            dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else h.dtype
            # the loss op gets inputs of one dtype and runs outside autocast (it keeps its own fp32 math)
            with torch.autocast(kind, enabled=False):
                return kernels.linear_cross_entropy(h.to(dtype).flatten(0, 1), self.output_weight.to(dtype),
                                                    labels.flatten(), ignore_index=-100, reduction="sum")


def count_parameters(model: nn.Module) -> int:
    """Number of distinct parameters (tied weights counted once)."""
    return sum(p.numel() for p in model.parameters())


@torch.no_grad()
def greedy_decode(model: GPT, prompt: list[int], new_tokens: int, eos_id: int | None = None) -> list[int]:
    """Greedy (argmax) continuation of one document, recomputing the whole prefix each step (no cache:
    for checks, not serving).

    Args:
        model: the decoder (its device and dtype are used as they are).
        prompt: token ids, at least one.
        new_tokens: most tokens to generate.
        eos_id: stop after generating this id (``None``: never stop early).

    Returns:
        The generated ids (without the prompt), at most ``new_tokens``, ending at ``eos_id`` if it came.
    """
    device = model.output_weight.device
    ids = list(prompt)
    for _ in range(new_tokens):
        x = torch.tensor([ids], dtype=torch.long, device=device)
        pos = torch.arange(len(ids), device=device)[None]
        nxt = int(model.logits(x, pos, torch.zeros_like(x))[0, -1].argmax())
        ids.append(nxt)
        if nxt == eos_id:
            break
    return ids[len(prompt):]
