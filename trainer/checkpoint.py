"""Save and restore a run with ``torch.distributed.checkpoint`` (DCP): model, optimizer, step, loader.

Every rank writes its own shards in parallel into ``<dir>/step_XXXXXX``. Model and optimizer state
go through ``torch.distributed.checkpoint.state_dict`` so DDP and FSDP2 (DTensor shards) both work;
for ZeRO stage 1 each rank stores its own optimizer partition (resume needs the same world size).
The loader state saved is the merged state of all ranks (identical everywhere, written once).
"""
from __future__ import annotations

import os
import pickle
import re

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_state_dict,
                                                     set_model_state_dict, set_state_dict)
from torch.distributed.optim import ZeroRedundancyOptimizer

STEP_DIR = re.compile(r"^step_(\d{6,})$")


def step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"step_{step:06d}")


def latest_checkpoint(root: str) -> str | None:
    """Newest ``step_XXXXXX`` folder under ``root`` holding a finished checkpoint, or ``None``."""
    if not os.path.isdir(root):
        return None
    done = [(int(m.group(1)), name) for name in os.listdir(root) if (m := STEP_DIR.match(name))
            and os.path.exists(os.path.join(root, name, ".metadata"))]
    return os.path.join(root, max(done)[1]) if done else None


def _state(model, optimizer, step: int, loader_state: dict | None) -> dict:
    rank = dist.get_rank()
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        state = {"model": get_model_state_dict(model), f"optim_rank{rank}": optimizer.optim.state_dict()}
    else:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
    state["step"] = step
    state["loader"] = pickle.dumps(loader_state)
    return state


def save_checkpoint(root: str, model, optimizer, step: int, loader_state: dict | None = None) -> str:
    """Write a checkpoint of optimizer step ``step``; collective (every rank calls it). Returns its folder.

    ``loader_state`` (any picklable value) must be the same on every rank, e.g. the loader's
    merged ``global_state_dict()``.
    """
    path = step_dir(root, step)
    dcp.save(_state(model, optimizer, step, loader_state), checkpoint_id=path)
    return path


def load_checkpoint(path: str, model, optimizer) -> tuple[int, dict | None]:
    """Restore model and optimizer in place from ``path``; collective. Returns ``(step, loader_state)``.

    Raises:
        FileNotFoundError: ``path`` holds no finished checkpoint (no ``.metadata``).
    """
    if not os.path.exists(os.path.join(path, ".metadata")):
        raise FileNotFoundError(f"{path}: no finished DCP checkpoint here (missing .metadata)")
    state = _state(model, optimizer, 0, None)
    dcp.load(state, checkpoint_id=path)
    rank = dist.get_rank()
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        set_model_state_dict(model, state["model"])
        optimizer.optim.load_state_dict(state[f"optim_rank{rank}"])
    else:
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return int(state["step"]), pickle.loads(state["loader"])
