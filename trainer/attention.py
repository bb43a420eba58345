"""Document-causal attention over packed rows, without a ``T x T`` mask where the device allows.

A packed row holds several documents; token ``i`` may attend token ``j`` iff ``j <= i`` and both
carry the same ``document_ids`` value (padding, id -1, is one more "document", so every query has
a key and no softmax row is empty). The mask is built once per forward
(:func:`document_mask`) as one of three typed records, each with ``attend(q, k, v)``:

==============  ==============================================================  =================
record          how                                                             extra memory
==============  ==============================================================  =================
``CausalMask``  every row holds one document: SDPA ``is_causal=True`` (flash     none
                kernel on CUDA)
``FlexMask``    ``torch.nn.attention.flex_attention`` with a ``BlockMask`` of   ``B x T/128 x
                128 x 128 tiles (fully masked tiles are skipped), compiled on   T/128`` indices
                CUDA; eager on CPU (forward only: torch has no FlexAttention    (eager build on
                backward there)                                                 CPU: ``B x T x T``)
``DenseMask``   boolean ``[B, 1, T, T]`` mask into SDPA (the reference; the     ``B x T x T`` bool
                path ``torch.export``/ONNX can trace)                           + SDPA's own
==============  ==============================================================  =================

``model.attention`` chooses through :data:`BACKENDS`: ``auto`` (FlexAttention on CUDA, the dense
mask on CPU, where training needs a backward), ``flex`` or ``dense``. Whether every row holds one
document is known on the host: the trainer passes it from the packing
(``TokenBatch.one_document_rows``); without it the check reads CPU tensors only (on a device it
would wait for the device once per forward). Never while ``torch.export`` traces (a graph must
serve every input).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F

from trainer.choices import ATTENTION_NAMES


def _repeat_kv(k: torch.Tensor, v: torch.Tensor, n_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Grouped-query heads for SDPA: key/value ``[B, Hkv, T, hd]`` → ``[B, n_heads, T, hd]``, query
    head ``i`` reading key/value head ``i // (n_heads / Hkv)`` (an explicit copy, which ONNX export
    traces; SDPA's ``enable_gqa`` it does not)."""
    b, kv, t, hd = k.shape
    if kv == n_heads:
        return k, v
    group = n_heads // kv
    return tuple(z[:, :, None].expand(b, kv, group, t, hd).reshape(b, n_heads, t, hd) for z in (k, v))


@dataclass(frozen=True)
class CausalMask:
    """Every row is one document (or all padding): plain causal attention."""

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """``q`` [B, H, T, hd], ``k``/``v`` [B, Hkv, T, hd] (Hkv divides H) → [B, H, T, hd]."""
        k, v = _repeat_kv(k, v, q.shape[1])
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


@dataclass(frozen=True)
class DenseMask:
    """The boolean document-causal mask ``mask`` [B, 1, T, T] (True: query i may attend key j)."""

    mask: torch.Tensor

    @classmethod
    def build(cls, document_ids: torch.Tensor) -> DenseMask:
        """From ``document_ids`` int64 [B, T]."""
        return cls(dense_document_mask(document_ids))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """``q`` [B, H, T, hd], ``k``/``v`` [B, Hkv, T, hd] → [B, H, T, hd]."""
        k, v = _repeat_kv(k, v, q.shape[1])
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask)


@lru_cache(maxsize=None)
def _compiled(name: str):
    """``torch.nn.attention.flex_attention.<name>`` compiled once per process: ``flex_attention``
    (the fused kernel; eager it materialises the scores) or ``create_block_mask`` (tile by tile;
    eager it evaluates the mask at every ``B x T x T`` position, ~10 bytes each)."""
    from torch.nn.attention import flex_attention as flex
    return torch.compile(getattr(flex, name), dynamic=False)


@dataclass(frozen=True)
class FlexMask:
    """A FlexAttention ``BlockMask`` of the document-causal rule (``block_mask``)."""

    block_mask: object  # torch.nn.attention.flex_attention.BlockMask

    @classmethod
    def build(cls, document_ids: torch.Tensor, compiled: bool | None = None) -> FlexMask:
        """From ``document_ids`` int64 [B, T]. ``compiled`` (default: on CUDA) builds the block mask
        with a compiled kernel, without a ``B x T x T`` intermediate; compiling takes seconds (CPU:
        tens of seconds) once per process, so the CPU default is eager."""
        from torch.nn.attention.flex_attention import create_block_mask
        docs = document_ids

        def same_document_causal(b, h, q_idx, kv_idx):
            return (docs[b, q_idx] == docs[b, kv_idx]) & (q_idx >= kv_idx)

        b, t = docs.shape
        compiled = docs.device.type == "cuda" if compiled is None else compiled
        build = _compiled("create_block_mask") if compiled else create_block_mask
        return cls(build(same_document_causal, b, None, t, t, device=docs.device))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """``q`` [B, H, T, hd], ``k``/``v`` [B, Hkv, T, hd] → [B, H, T, hd].

        Raises:
            NotImplementedError: a backward is needed on CPU (torch's FlexAttention has none there).
        """
        from torch.nn.attention.flex_attention import flex_attention
        if q.device.type == "cpu":
            if torch.is_grad_enabled() and any(z.requires_grad for z in (q, k, v)):
                raise NotImplementedError(NO_CPU_BACKWARD)
            # without grad mode nothing is recorded; detached, torch's CPU check lets the call through
            q, k, v = q.detach(), k.detach(), v.detach()
            with warnings.catch_warnings():  # "called without torch.compile": chosen on CPU (compiling takes ~20 s)
                warnings.simplefilter("ignore", UserWarning)
                return flex_attention(q, k, v, block_mask=self.block_mask, enable_gqa=q.shape[1] != k.shape[1])
        # inside a compiled block (compile: true) the block's graph takes flex_attention in as it is
        flex = flex_attention if torch.compiler.is_compiling() else _compiled("flex_attention")
        return flex(q, k, v, block_mask=self.block_mask, enable_gqa=q.shape[1] != k.shape[1])


AttentionMask = CausalMask | DenseMask | FlexMask

# the one place a backend is chosen: model.attention (after "auto" is resolved) -> its mask builder
BACKENDS = {"flex": FlexMask.build, "dense": DenseMask.build}
NO_CPU_BACKWARD = ("model.attention=flex: torch's FlexAttention has no backward on CPU; train on CPU with "
                   "model.attention=auto or dense (flex works on CPU for evaluation only)")


def check_trainable(name: str, device: torch.device) -> None:
    """Refuse, before anything is built, a backend that cannot train on ``device``.

    Raises:
        ValueError: ``flex`` on a CPU (one line: what to use instead).
    """
    if resolve(name, device) == "flex" and device.type == "cpu":
        raise ValueError(NO_CPU_BACKWARD)


def resolve(name: str, device: torch.device) -> str:
    """The backend ``name`` stands for on ``device``: ``auto`` is ``flex`` on CUDA, else ``dense``.

    Raises:
        ValueError: ``name`` is not one of :data:`trainer.choices.ATTENTION_NAMES`.
    """
    if name not in ATTENTION_NAMES:
        raise ValueError(f"model.attention={name!r}: use one of {', '.join(ATTENTION_NAMES)}")
    if name == "auto":
        return "flex" if device.type == "cuda" else "dense"
    return name


def one_document_per_row(document_ids: torch.Tensor) -> bool:
    """Whether every row of ``document_ids`` [B, T] holds one id only (one host read)."""
    return bool((document_ids == document_ids[:, :1]).all())


def document_mask(document_ids: torch.Tensor, backend: str = "auto", one_document: bool | None = None) -> AttentionMask:
    """The attention mask record of ``document_ids`` int64 [B, T] for ``backend`` (see :data:`trainer.choices.ATTENTION_NAMES`).

    Returns :class:`CausalMask` when every row holds one document, else the backend's record.
    ``one_document`` says so from the host (:attr:`loaders.rank.batch.TokenBatch.one_document_rows`);
    ``None``: checked for CPU tensors only. While ``torch.export`` traces, never.

    Raises:
        ValueError: unknown ``backend``.
    """
    name = resolve(backend, document_ids.device)
    if torch.compiler.is_exporting():
        one_document = False
    elif one_document is None:  # on a device the check would be a host sync per forward
        one_document = document_ids.device.type == "cpu" and one_document_per_row(document_ids)
    if one_document:
        return CausalMask()
    return BACKENDS[name](document_ids)


def dense_document_mask(document_ids: torch.Tensor) -> torch.Tensor:
    """Boolean attention mask [B, 1, T, T] of ``document_ids`` int64 [B, T]: True where query i may
    attend key j (``j <= i``, same document; padding, id -1, attends to earlier padding)."""
    t = document_ids.shape[1]
    same = document_ids[:, :, None] == document_ids[:, None, :]
    causal = torch.ones(t, t, dtype=torch.bool, device=document_ids.device).tril()
    return (same & causal)[:, None]
