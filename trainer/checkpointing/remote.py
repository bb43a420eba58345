"""Checkpoints on object storage (``s3://``, ``gs://``, any fsspec URL) with
``torch.distributed.checkpoint``'s fsspec storage (``FsspecWriter`` / ``FsspecReader``).

Object stores cannot rename a folder atomically, so instead of the write-then-rename of
:class:`trainer.checkpointing.Checkpointer` (local or shared file systems), every rank writes its
DCP files straight into ``URL/step_XXXXXX``; after a barrier rank 0 writes ``meta.json`` and then
``COMPLETE``. A folder without ``COMPLETE`` is an unfinished save and is never restored. The
state layout is :func:`trainer.checkpointing.state.build_state`'s, so any world size or ZeRO stage can
resume, as from a local checkpoint. Credentials and endpoints come from the environment
(``AWS_*`` for s3fs) or fsspec's configuration.
"""
from __future__ import annotations

import json
import pickle

import fsspec
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter

from trainer.checkpointing.checkpoint import Restored
from trainer.checkpointing.layout import COMPLETE
from trainer.checkpointing.state import apply_state, build_state, process_rank, set_rng_state


def url_step_dir(root_url: str, step: int) -> str:
    """``ROOT/step_XXXXXX``: the folder URL of the full checkpoint of ``step``."""
    return f"{root_url.rstrip('/')}/step_{step:06d}"


def save_to_url(root_url: str, step: int, model, optimizer, loader_state=None, trainer_state=None) -> str:
    """Write a full checkpoint of ``step`` under ``root_url``; collective. Returns its folder URL.

    Args:
        root_url: checkpoint folder URL, e.g. ``s3://bucket/runs/r1/ckpt``.
        loader_state, trainer_state: picklable values, the same on every rank (merged loader state).
    Raises:
        PermissionError / OSError: the store refuses the writes (credentials, bucket missing).
    """
    url = url_step_dir(root_url, step)
    fs, path = fsspec.core.url_to_fs(url)
    if process_rank() == 0 and fs.exists(f"{path}/{COMPLETE}"):
        fs.rm(f"{path}/{COMPLETE}")  # the same step saved again after a rollback: unfinished until rewritten
    if dist.is_initialized():
        dist.barrier()
    dcp.save(build_state(model, optimizer, step, loader_state, trainer_state), storage_writer=FsspecWriter(url))
    if dist.is_initialized():
        dist.barrier()  # every rank's files are written before COMPLETE appears
    if process_rank() == 0:
        world = dist.get_world_size() if dist.is_initialized() else 1
        fs.pipe_file(f"{path}/meta.json", json.dumps({"step": step, "kind": "full", "world_size": world}).encode())
        fs.pipe_file(f"{path}/{COMPLETE}", f"step {step}\n".encode())
    if dist.is_initialized():
        dist.barrier()
    return url


def list_url_checkpoints(root_url: str) -> list[str]:
    """Finished checkpoint folder URLs under ``root_url`` (with ``COMPLETE``), oldest step first."""
    fs, path = fsspec.core.url_to_fs(root_url)
    protocol = root_url.split("://", 1)[0]
    fs.invalidate_cache()  # other processes write checkpoints: list the store, not a cached listing
    done = sorted(p for p in fs.glob(f"{path.rstrip('/')}/step_*/{COMPLETE}"))
    return [f"{protocol}://{p.rsplit('/', 1)[0]}" for p in done]


def restore_from_url(url: str, model, optimizer, restore_rng: bool = True) -> Restored:
    """Load the full checkpoint at folder ``url`` into ``model`` / ``optimizer``; collective.

    Raises:
        FileNotFoundError: ``url`` holds no finished checkpoint (no ``COMPLETE``).
    """
    fs, path = fsspec.core.url_to_fs(url)
    fs.invalidate_cache()
    if not fs.exists(f"{path}/{COMPLETE}"):
        raise FileNotFoundError(f"{url}: no finished checkpoint here (no {COMPLETE}); pick one listed by "
                                f"list_url_checkpoints or set checkpoint.resume=\"\"")
    state = build_state(model, optimizer, for_load=True)
    rng_key = f"rng_rank{process_rank()}"
    if rng_key not in FsspecReader(url).read_metadata().state_dict_metadata:
        del state[rng_key]  # a rank new to this world size keeps its own RNG
    dcp.load(state, storage_reader=FsspecReader(url))
    apply_state(state, model, optimizer)
    rng = pickle.loads(state[rng_key]) if rng_key in state else None
    if restore_rng and rng is not None:
        set_rng_state(rng)
    return Restored(int(state["step"]), pickle.loads(state["loader"]), pickle.loads(state["trainer"]),
                    rng is not None)
