"""Process group setup and ZeRO stages 0-3 on top of torch.distributed (DDP, ZeroRedundancyOptimizer, FSDP2).

ZeRO (Rajbhandari et al. 2020, arXiv:1910.02054) partitions the model states across the N ranks of
data parallelism:

==========  ===========================================  ===================================
stage       implementation                               sharded across ranks
==========  ===========================================  ===================================
0           ``DistributedDataParallel``                  nothing (plain data parallelism)
1           DDP + ``ZeroRedundancyOptimizer``            optimizer state
2           FSDP2 ``fully_shard(reshard_after_forward    optimizer state, gradients (params
            =False)`` per block + root                   gathered from forward to backward)
3           FSDP2 ``fully_shard`` per block + root       optimizer state, gradients, params
==========  ===========================================  ===================================

Works on CPU with gloo (device mesh on ``cpu``) and on CUDA with nccl.
"""
from __future__ import annotations

import contextlib
import datetime
import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP

from trainer.config import ZeroConfig


@dataclass
class DistInfo:
    """Where this process runs: ``rank`` of ``world_size``, ``local_rank`` on its node, ``device``."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0 (the rank that writes logs and reports)."""
        return self.rank == 0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for single-process and test rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(device: str = "auto") -> DistInfo:
    """Join (or create) the default process group from torchrun's env vars.

    Without torchrun (no ``RANK`` in the environment) a world of size 1 is created on an in-memory
    store, so the same DDP/FSDP code paths run; the environment is left as it was (torchrun's
    variables set here would be inherited by any child process, which would take itself for a rank
    of this world). Backend: nccl on CUDA, gloo on CPU.

    Raises:
        ValueError: ``device="cuda"`` on a machine without CUDA.
    """
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device=cuda but torch.cuda.is_available() is False; use device=cpu")
    alone = "RANK" not in os.environ
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if device == "cuda":
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    else:
        dev = torch.device("cpu")
    if not dist.is_initialized():
        alone_args = {"store": dist.HashStore(), "rank": 0, "world_size": 1} if alone else {}
        dist.init_process_group("nccl" if device == "cuda" else "gloo", timeout=datetime.timedelta(minutes=10),
                                device_id=dev if device == "cuda" else None, **alone_args)
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, dev)


def wrap_model(model: nn.Module, zero: ZeroConfig, info: DistInfo, precision: str = "fp32") -> nn.Module:
    """Apply the data-parallel wrapper of ``zero.stage`` to ``model`` (already on ``info.device``).

    Stages 2/3 shard every module in ``model.blocks`` and then the root (embedding, final norm,
    head); ``zero.cpu_offload`` (stage 3) keeps the shards, their gradients and so the optimizer
    state in host memory (FSDP2 ``CPUOffloadPolicy``, pinned on CUDA). With ``precision="bf16"``
    FSDP2 gathers parameters in bf16 and reduces gradients in fp32, keeping fp32 sharded master
    weights; stages 0/1 use autocast instead (see :func:`autocast`).
    Returns the wrapped module; its ``forward`` has the same signature as ``model``'s.
    """
    if zero.stage in (0, 1):
        ids = [info.device.index] if info.device.type == "cuda" else None
        return DDP(model, device_ids=ids, bucket_cap_mb=zero.bucket_cap_mb, gradient_as_bucket_view=True)
    mesh = init_device_mesh(info.device.type, (info.world_size,))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if precision == "bf16" else None,
                              reduce_dtype=torch.float32)
    reshard = zero.stage == 3
    offload = CPUOffloadPolicy(pin_memory=info.device.type == "cuda") if zero.cpu_offload else OffloadPolicy()
    blocks = list(model.blocks)
    for block in blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp, offload_policy=offload)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp, offload_policy=offload)
    if zero.forward_prefetch > 0:
        for i, block in enumerate(blocks):
            block.set_modules_to_forward_prefetch(blocks[i + 1: i + 1 + zero.forward_prefetch])
    if zero.backward_prefetch > 0:
        for i, block in enumerate(blocks):
            block.set_modules_to_backward_prefetch(blocks[max(0, i - zero.backward_prefetch): i][::-1])
    return model


def autocast(device: torch.device, precision: str, stage: int):
    """Autocast context for the forward pass: bf16 compute for stages 0/1 with ``precision=bf16``.

    FSDP stages handle bf16 through their ``MixedPrecisionPolicy``, so autocast is off there.
    """
    enabled = precision == "bf16" and stage in (0, 1)
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=enabled)


def cpu_has_bf16() -> bool:
    """Whether this CPU has oneDNN's bf16 kernels (AVX-512 BW/VL/DQ, AMX or Arm BF16: PyTorch's own
    check). Without them, bf16 compute on the CPU is emulated and slower than fp32."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def precision_warning(device: torch.device, precision: str) -> str | None:
    """A one-line warning when ``precision=bf16`` will run slower than fp32 on ``device`` (a CPU
    without :func:`cpu_has_bf16`), else ``None``."""
    if precision != "bf16" or device.type != "cpu" or cpu_has_bf16():
        return None
    return ("warning: precision=bf16 on a CPU without bf16 kernels (no AVX-512 or AMX) is emulated and "
            "about 2x slower than fp32 here: set precision=fp32")


def build_optimizer(model: nn.Module, stage: int, lr: float, betas, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW over two groups (matrices decayed; norms/biases not). Stage 1 shards it with ZeRO.

    ``fused``/``foreach`` AdamW is used where the parameters allow it (DTensor params under FSDP
    use foreach).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    kwargs = dict(lr=lr, betas=tuple(betas))
    if stage == 1:
        return ZeroRedundancyOptimizer(groups, optimizer_class=torch.optim.AdamW, **kwargs)
    return torch.optim.AdamW(groups, foreach=True, **kwargs)


def set_grad_sync(model: nn.Module, last_micro_batch: bool):
    """Gradient synchronisation of one micro-batch of an accumulated step; returns a context manager.

    - DDP (stages 0/1): all-reduce only on the last micro-batch (``no_sync`` before it): the
      unreduced local gradients are full size (4Ψ) either way, so skipping the reduction is free.
    - FSDP2 (stages 2/3): reduce-scatter on **every** micro-batch, which keeps ZeRO's promise of
      4Ψ/N gradient bytes per rank during accumulation. Skipping it (FSDP2's
      ``set_requires_gradient_sync(False)``) would hold the full unsharded fp32 gradient (4Ψ) on
      every rank between micro-batches — measured by ``tests/unit/trainer/test_zero.py``. The cost is one
      reduce-scatter per micro-batch instead of per step (``grad_accum_steps`` x the gradient traffic),
      the trade the ZeRO paper makes too (gradients are reduced as they are produced).
    """
    if isinstance(model, DDP):
        return contextlib.nullcontext() if last_micro_batch else model.no_sync()
    model.set_requires_gradient_sync(True)
    return contextlib.nullcontext()


def _local_bytes(t: torch.Tensor) -> int:
    if isinstance(t, DTensor):
        t = t.to_local()
    return t.numel() * t.element_size()


def _fsdp_params(model: nn.Module) -> list:
    """FSDP2's per-parameter records (``FSDPParam``: sharded storage, unsharded copy, gradients) of
    every ``fully_shard`` module in ``model``; empty for DDP. Reads FSDP2 internals
    (``_get_fsdp_state()._fsdp_param_groups``): the public API shows only one view at a time."""
    from torch.distributed.fsdp import FSDPModule
    out = []
    for m in model.modules():
        if isinstance(m, FSDPModule):
            for group in m._get_fsdp_state()._fsdp_param_groups:
                out.extend(group.fsdp_params)
    return out


def param_bytes(model: nn.Module) -> int:
    """Bytes of parameter storage this rank holds now. Under FSDP2: every sharded storage, plus the
    gathered (unsharded) copy of the parameters that are gathered at the moment (stage 2 keeps
    both from forward to backward)."""
    from torch.distributed.fsdp._fully_shard._fsdp_param import ShardedState
    fsdp = _fsdp_params(model)
    if not fsdp:
        return sum(_local_bytes(p) for p in model.parameters())
    held = 0
    for fp in fsdp:
        held += _local_bytes(fp._sharded_param_data)
        if fp.sharded_state == ShardedState.UNSHARDED:
            held += _local_bytes(fp._unsharded_param)
    return held


def grad_bytes(model: nn.Module) -> int:
    """Bytes of the gradients this rank holds now: the local shard under FSDP2, plus any unsharded
    gradient FSDP2 keeps between micro-batches when gradient sync is off."""
    held = sum(_local_bytes(p.grad) for p in model.parameters() if p.grad is not None)
    for fp in _fsdp_params(model):
        unsharded = getattr(fp, "_unsharded_param", None)
        for g in (getattr(unsharded, "grad", None), fp.unsharded_accumulated_grad):
            if g is not None:
                held += _local_bytes(g)
    return held


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of per-parameter optimizer state tensors this rank holds (Adam's m and v; the scalar
    ``step`` counters are ignored). For ``ZeroRedundancyOptimizer`` only the local partition counts.
    """
    inner = optimizer.optim if isinstance(optimizer, ZeroRedundancyOptimizer) else optimizer
    return sum(_local_bytes(v) for state in inner.state.values() for v in state.values()
               if torch.is_tensor(v) and v.dim() > 0)


def zero_formula_bytes(stage: int, n_params: int, world_size: int, bytes_per_value: int = 4) -> dict[str, float]:
    """Per-rank model-state bytes predicted by ZeRO, in the fp32 analogue used for fp32 training.

    The ZeRO paper counts mixed precision: 2Ψ (fp16 params) + 2Ψ (fp16 grads) + KΨ (K=12: fp32
    master, momentum, variance). Training in fp32 there is no separate master copy, so params and
    grads take 4Ψ each and Adam state K=8 (m and v). Per rank with N ranks:

    - stage 0: params 4Ψ, grads 4Ψ, optimizer 8Ψ
    - stage 1: params 4Ψ, grads 4Ψ, optimizer 8Ψ/N
    - stage 2: params 4Ψ + 4Ψ/N (the gathered copy, held from forward to backward, beside the
      sharded storage FSDP2 always keeps), grads 4Ψ/N, optimizer 8Ψ/N
    - stage 3: params 4Ψ/N, grads 4Ψ/N, optimizer 8Ψ/N

    Returns ``{"params", "grads", "optimizer"}`` in bytes.
    """
    psi, n, b = float(n_params), float(world_size), bytes_per_value
    params = {3: b * psi / n, 2: b * psi * (1 + 1 / n)}.get(stage, b * psi)
    return {"params": params,
            "grads": b * psi / (n if stage >= 2 else 1),
            "optimizer": 2 * b * psi / (n if stage >= 1 else 1)}


def measure_model_states(model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn, stage: int) -> dict[str, int]:
    """Run one training step and measure this rank's model-state bytes at the points ZeRO describes.

    ``loss_fn(model)`` returns a scalar loss. Parameters are counted right after forward, when the
    stage holds the most it keeps for the whole forward→backward window (stage 2: every block
    gathered; stage 3: only the local shards plus the root's — so stage 3 is counted after the
    step, between steps, where only shards remain; transient per-block gathers are ZeRO's
    "temporary buffers", not model states). Gradients are counted after backward, optimizer state
    after ``step()``. Returns ``{"params", "grads", "optimizer"}`` in bytes.
    """
    loss = loss_fn(model)
    params = param_bytes(model)
    loss.backward()
    grads = grad_bytes(model)
    optimizer.step()
    if stage == 3:
        params = param_bytes(model)
    out = {"params": params, "grads": grads, "optimizer": optimizer_state_bytes(optimizer)}
    optimizer.zero_grad(set_to_none=True)
    return out
