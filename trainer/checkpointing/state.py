"""What a checkpoint holds (model, optimizer with ZeRO-1 state under parameter FQNs, step, loader,
trainer and per-rank RNG state) and how it moves between a live model/optimizer and DCP files.
"""
from __future__ import annotations

import os
import pickle
import random

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

from trainer.checkpointing.layout import storage_reader


def process_rank() -> int:
    """This process's rank in the default process group (0 without one)."""
    return dist.get_rank() if dist.is_initialized() else 0


def rng_state() -> dict:
    """This process's python, numpy and torch (CPU and CUDA) RNG states."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore the python, numpy, torch CPU and (when present and available) CUDA RNG states of :func:`rng_state`."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _unwrap(model):
    return model.module if isinstance(model, DistributedDataParallel) else model


def _zero_owned_state(model, optimizer: ZeroRedundancyOptimizer, init: bool) -> dict:
    """``{fqn: state}`` of the parameters this rank's ZeRO partition owns (the live state tensors,
    so DCP loads into them in place). ``init`` creates missing Adam state first with a zero-gradient,
    zero-learning-rate step (parameters unchanged)."""
    inner = optimizer.optim
    names = {id(p): n for n, p in _unwrap(model).named_parameters()}
    owned = [p for g in inner.param_groups for p in g["params"]]
    if init and any(not inner.state.get(p) for p in owned):
        lrs = [g["lr"] for g in inner.param_groups]
        made = [p for p in owned if p.grad is None]
        for p in made:
            p.grad = torch.zeros_like(p)
        for g in inner.param_groups:
            g["lr"] = 0.0
        inner.step()
        for g, lr in zip(inner.param_groups, lrs):
            g["lr"] = lr
        for p in made:
            p.grad = None
    return {names[id(p)]: inner.state[p] for p in owned if inner.state.get(p)}


def _zero_param_groups(model, optimizer: ZeroRedundancyOptimizer) -> list[dict]:
    names = {id(p): n for n, p in _unwrap(model).named_parameters()}
    return [{**{k: v for k, v in g.items() if k != "params"}, "params": [names[id(p)] for p in g["params"]]}
            for g in optimizer.param_groups]


def build_state(model, optimizer, step: int = 0, loader_state=None, trainer_state=None,
                kind: str = "full", for_load: bool = False) -> dict:
    """The state dict handed to DCP (see the module doc for keys). ``optimizer`` may be ``None``
    for ``kind="weights"``. With ``for_load`` ZeRO-1 state is initialised so it can be loaded into."""
    if kind == "weights":
        return {"model": get_model_state_dict(model), "step": step}
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        state = {"model": get_model_state_dict(model),
                 "optim": {"state": _zero_owned_state(model, optimizer, for_load)}}
        if not for_load:
            state["optim"]["param_groups"] = _zero_param_groups(model, optimizer)
    else:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
    state.update(step=step, loader=pickle.dumps(loader_state), trainer=pickle.dumps(trainer_state))
    state[f"rng_rank{process_rank()}"] = pickle.dumps(None if for_load else rng_state())
    return state


def apply_state(state: dict, model, optimizer) -> None:
    """Copy a loaded :func:`build_state` dict into ``model`` / ``optimizer`` (``None``: weights only)."""
    if optimizer is None or isinstance(optimizer, ZeroRedundancyOptimizer):
        set_model_state_dict(model, state["model"])  # ZeRO-1 optimizer state was loaded in place
    else:
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def _saved_keys(path: str) -> set[str]:
    return set(storage_reader(path).read_metadata().state_dict_metadata)


def load_into(path: str, model, optimizer, kind: str = "full") -> dict:
    """DCP-load checkpoint ``path`` into a template of ``model``/``optimizer``; collective.
    Returns the loaded (not yet applied) state dict; the RNG entry is present only when this rank
    had one saved (same or smaller world size)."""
    state = build_state(model, optimizer, kind=kind, for_load=True)
    rng_key = f"rng_rank{process_rank()}"
    if rng_key in state and rng_key not in _saved_keys(path):
        del state[rng_key]
    dcp.load(state, storage_reader=storage_reader(path))
    return state


def load_full_state(path: str) -> dict:
    """Every tensor and object of a checkpoint, unsharded, in one process (offline use)."""
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict
    state: dict = {}
    _load_state_dict(state, storage_reader=storage_reader(path), planner=_EmptyStateDictLoadPlanner(),
                     no_dist=True)
    return state


def export_checkpoint(path: str, out: str) -> None:
    """Write checkpoint ``path`` as one ``torch.save`` file (``torch.load(out)["model"]`` = weights),
    via ``torch.distributed.checkpoint.format_utils.dcp_to_torch_save``; single process."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    dcp_to_torch_save(path, out)
