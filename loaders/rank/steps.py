"""Equal step counts across ranks (``data.step_policy``).

Packing makes the number of batches of a rank depend on the lengths of its documents, so ranks
end an epoch after different numbers of steps, and a DDP/FSDP trainer whose ranks disagree on
the step count hangs in its next collective. A rank's count is only known once its documents
are read, so the ranks agree step by step: before each step every rank contributes whether it
still has a batch to one ``torch.distributed.all_reduce`` (SUM of one integer), and

* ``pad``: the epoch goes on while any rank has a batch; a rank that has run out yields fully
  masked batches (no document tokens, every label ``-100``): every sample is read exactly once;
* ``drop``: the epoch ends at the first step where some rank has no batch; the other ranks'
  remaining batches are read to count them (batches, samples, tokens) and not delivered —
  their samples stay unconsumed for this epoch, and are reported;
* ``uneven``: no agreement (each rank stops on its own; single-process use, or a trainer that
  handles it).

Both are reported in ``TextLoader.metrics()`` (``padded_batches``, ``dropped_batches``,
``dropped_samples``, ``dropped_tokens``).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np
import torch

from loaders.pack.packed import PackedBatch
from loaders.rank.batch import TokenBatch

log = logging.getLogger(__name__)

STEP_POLICIES = ("pad", "drop", "uneven")
StepSync = Callable[[bool], int]  # has_batch -> number of ranks that have a batch this step


_CPU_GROUPS: dict = {}  # default process group -> its gloo twin (made once, not once per epoch)


def _cpu_group():
    """A gloo group over the ranks of the default group (collective the first time per default group)."""
    import torch.distributed as dist
    world = dist.group.WORLD
    if world not in _CPU_GROUPS:
        _CPU_GROUPS.clear()  # an earlier default group was destroyed; its twin went with it
        _CPU_GROUPS[world] = dist.new_group(backend="gloo")
    return _CPU_GROUPS[world]


def torch_step_sync(world_size: int) -> StepSync | None:
    """All-reduce step agreement over ``torch.distributed``, or ``None`` when it is not initialised
    or its size differs from ``world_size``.

    The flag never touches an accelerator: it is summed on the CPU by a gloo group (the default
    group when its backend is gloo, else one gloo group made here, collectively, beside NCCL) and
    read through the numpy array that backs it. A flag on the GPU read with ``.item()`` would make
    the host wait for the device before every micro-batch (one host-device sync each).
    """
    import numpy as np
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() != world_size:
        return None
    group = None if dist.get_backend() == "gloo" else _cpu_group()

    def sync(has_batch: bool) -> int:
        flag = np.array([int(has_batch)], dtype=np.int64)
        dist.all_reduce(torch.from_numpy(flag), op=dist.ReduceOp.SUM, group=group)
        return int(flag[0])

    return sync


def padding_batch(rows: int, seq_len: int) -> TokenBatch:
    """A fully masked ``[rows, seq_len]`` batch: input 0, labels -100, documents -1, no keys."""
    return TokenBatch.from_packed(PackedBatch(np.zeros((rows, seq_len), np.uint16), np.zeros(0, np.int32),
                                              np.zeros(rows, np.int32)))


@dataclass
class StepCounts:
    """What a policy did on one rank (cumulative over epochs)."""

    padded_batches: int = 0
    dropped_batches: int = 0
    dropped_samples: int = 0
    dropped_tokens: int = 0
    dropped_positions: set[int] = field(default_factory=set)  # documents with a dropped chunk, this epoch


def equal_steps(batches: Iterator[TokenBatch], policy: str, sync: StepSync | None, world_size: int,
                pad: Callable[[], TokenBatch], counts: StepCounts) -> Iterator[TokenBatch]:
    """``batches`` with as many steps as every other rank's (see the module docstring).

    Args:
        batches: this rank's batches of the epoch.
        policy: one of :data:`STEP_POLICIES`.
        sync: the agreement (``None``: no agreement possible; behaves as ``uneven``).
        world_size: ranks taking part.
        pad: makes one fully masked batch.
        counts: updated with padded/dropped batches, samples and tokens.
    """
    if policy == "uneven" or sync is None or world_size == 1:
        yield from batches
        return
    counts.dropped_positions = set()
    while True:
        batch = next(batches, None)
        have = sync(batch is not None)
        if have == 0:
            return
        if policy == "drop" and have < world_size:
            dropped = [batch, *batches] if batch is not None else []
            for b in dropped:
                counts.dropped_tokens += b.num_doc_tokens
                counts.dropped_positions.update(b.consumed[b.consumed[:, 2] > 0, 0].tolist())
            counts.dropped_batches += len(dropped)
            counts.dropped_samples += len(counts.dropped_positions)
            if dropped:
                log.info("data.step_policy=drop: %d batches of this rank dropped (another rank ran out)", len(dropped))
            return
        if batch is None:  # pad: other ranks still have batches
            counts.padded_batches += 1
            yield pad()
            continue
        yield batch
