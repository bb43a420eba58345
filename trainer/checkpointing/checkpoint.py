"""Save and restore a run with ``torch.distributed.checkpoint`` (DCP), atomically and verified.

Layout of ``<dir>/step_XXXXXX`` (full) and ``<dir>/weights_XXXXXX`` (weights only):

- DCP files (``.metadata``, ``__R_0.distcp``): ``model`` (FQN → tensor), ``optim`` (the
  ``get_optimizer_state_dict`` layout: ``state`` keyed by parameter FQN + ``param_groups``),
  ``step``, ``loader`` (the merged loader state of all ranks), ``trainer`` (scheduler and anomaly
  state) and ``rng_rank<R>`` (python, numpy, torch CPU/CUDA RNG states of rank R).
- ``meta.json``: step, kind, world size, ZeRO stage, git commit, package versions, per-tensor
  checksums and the fixed-batch reference loss; ``config.yaml``: the run's config; ``COMPLETE``.

Every rank writes its own shards in parallel into a hidden ``.NAME.partial`` folder (DCP fsyncs
them). After all ranks finished, the stored bytes are read back item by item and checked against
checksums of the live state (:mod:`trainer.checkpointing.verify`; no second model is built); only
then rank 0 writes ``meta.json``, ``config.yaml`` and ``COMPLETE`` (each fsynced, ``COMPLETE``
last), renames the folder to its final name and fsyncs the parent, so a visible checkpoint is
always whole and durable. Replacing a folder of the same step and pruning old ones go through
hidden ``.NAME.old`` / ``.NAME.deleting`` names (:func:`publish`, :func:`retire`), so no folder is
ever half-deleted while it still says ``COMPLETE``.

ZeRO stage 1 (``ZeroRedundancyOptimizer``) owns whole parameters per rank: each rank saves the
optimizer state of the parameters it owns under their FQNs, so the union is the regular
world-size-independent layout, and on load each rank reads the FQNs it owns under the new
world size (any world size, and even another ZeRO stage, can resume).
"""
from __future__ import annotations

import datetime
import json
import os
import pickle
import shutil
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from trainer.checkpointing import verify as V
from trainer.checkpointing.layout import COMPLETE, git_commit, list_checkpoints, package_versions, step_dir
from trainer.checkpointing.state import apply_state, build_state, load_into, process_rank, set_rng_state


@dataclass
class _Pending:
    future: object
    tmp: str
    final: str
    kind: str
    step: int
    checksums: dict
    digests: dict
    loss: float


def _fsync(path: str) -> None:
    """``fsync`` a file or folder (a folder: so the names created or renamed in it are durable)."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if os.path.isdir(path) else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_synced(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _hidden(root: str, final: str, suffix: str) -> str:
    return os.path.join(root, f".{os.path.basename(final)}.{suffix}")


def recover_root(root: str) -> None:
    """Tidy ``root`` after a crash (rank 0, at start): remove unfinished saves (``.NAME.partial``)
    and half-pruned folders (``.NAME.deleting``); put back a replaced checkpoint (``.NAME.old``) whose
    replacement never arrived, else remove it."""
    if not os.path.isdir(root):
        return
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if not name.startswith("."):
            continue
        if name.endswith(".old") and not os.path.exists(os.path.join(root, name[1:-len(".old")])):
            os.replace(path, os.path.join(root, name[1:-len(".old")]))
        elif name.endswith((".partial", ".deleting", ".old")):
            shutil.rmtree(path, ignore_errors=True)


def publish(tmp: str, final: str) -> None:
    """Rename the finished folder ``tmp`` to ``final`` durably. A folder already at ``final`` (the
    same step saved again after a rollback) is first renamed aside to ``.NAME.old`` and deleted only
    after the new one is in place, so at every instant one whole copy exists (:func:`recover_root`
    puts ``.old`` back after a crash between the renames)."""
    root = os.path.dirname(final)
    old = _hidden(root, final, "old")
    if os.path.exists(final):
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    _fsync(root)
    shutil.rmtree(old, ignore_errors=True)


def retire(path: str) -> None:
    """Delete checkpoint folder ``path`` so that it never looks finished while half-deleted: it is
    renamed to a hidden ``.NAME.deleting`` first (invisible to :func:`list_checkpoints`), durably,
    then removed."""
    root = os.path.dirname(path)
    doomed = _hidden(root, path, "deleting")
    os.replace(path, doomed)
    _fsync(root)
    shutil.rmtree(doomed, ignore_errors=True)


class Checkpointer:
    """Atomic, verified DCP checkpoints of one run; every method is collective.

    Args:
        root: checkpoint folder.
        device, precision, stage: how the model runs (for the reference forward pass whose loss
            ``meta.json`` keeps for offline verification).
        vocab_size, seq_len: shape of the fixed verification batch.
        config: the run's config as a plain dict (written as ``config.yaml``).
        keep_last: finished checkpoints kept per kind (0 = all).
        async_save: write with ``dcp.async_save`` on a dedicated gloo group.
    """

    def __init__(self, root: str, device: torch.device, precision: str = "fp32", stage: int = 0,
                 vocab_size: int = 2, seq_len: int = 16, config: dict | None = None, keep_last: int = 0,
                 async_save: bool = False):
        self.root, self.device = root, device
        self.precision, self.stage, self.keep_last, self.config = precision, stage, keep_last, config or {}
        self.seq_len = seq_len
        self.batch = V.fixed_batch(vocab_size, seq_len)
        self.pg = dist.new_group(backend="gloo") if async_save and dist.is_initialized() else None
        self.async_save = async_save
        self.pending: _Pending | None = None
        self.commit = git_commit() if process_rank() == 0 else "unknown"
        self.saved: list[str] = []
        if process_rank() == 0:  # saves, prunes or replacements cut short by a crash or a killed worker
            recover_root(root)
        if dist.is_initialized():
            dist.barrier()

    def save(self, step: int, model, optimizer, loader_state=None, trainer_state=None, kind: str = "full") -> str:
        """Write checkpoint ``kind`` (``full``/``weights``) of step ``step``; returns its final folder
        (with ``async_save`` it appears after the next :meth:`wait`).

        Raises:
            trainer.checkpointing.verify.CheckpointVerifyError: the written checkpoint does not verify.
        """
        self.wait()
        final = step_dir(self.root, step, kind)
        tmp = _hidden(self.root, final, "partial")
        if process_rank() == 0:
            shutil.rmtree(tmp, ignore_errors=True)  # left over by a crash during an earlier save
            os.makedirs(self.root, exist_ok=True)
        if dist.is_initialized():
            dist.barrier()
        state = build_state(model, optimizer, step, loader_state, trainer_state, kind)
        checksums, digests = V.state_checksums(state, self.device), V.object_digests(state)
        loss = V.reference_loss(model, self.batch, self.device, self.precision, self.stage)
        if self.async_save:
            future = dcp.async_save(state, checkpoint_id=tmp, process_group=self.pg)
            self.pending = _Pending(future, tmp, final, kind, step, checksums, digests, loss)
        else:
            dcp.save(state, checkpoint_id=tmp)
            self._commit(_Pending(None, tmp, final, kind, step, checksums, digests, loss))
        return final

    def wait(self) -> None:
        """Finish an async save in flight: wait for its writes, verify, commit."""
        if self.pending is None:
            return
        pending, self.pending = self.pending, None
        future = getattr(pending.future, "upload_completion", pending.future)
        future.result()
        self._commit(pending)

    def close(self) -> None:
        """Finish any async save and release the async saves' gloo group (collective when async).

        Destroying the group before exit matters: a gloo group torn down during interpreter
        shutdown can abort the process ("terminate called without an active exception")."""
        self.wait()
        if self.pg is not None:
            dist.destroy_process_group(self.pg)
            self.pg = None

    def verify(self, path: str) -> None:
        """Verify a finished checkpoint against its ``meta.json`` (what every save does before it
        commits), at any world size; collective.

        Raises:
            trainer.checkpointing.verify.CheckpointVerifyError: naming the tensors, state and files that fail.
        """
        meta = V.read_meta(path)
        V.check_stored(path, path, meta["checksums"], meta.get("digests", {}), self.device)

    def _commit(self, p: _Pending) -> None:
        V.check_stored(p.tmp, p.final, p.checksums, p.digests, self.device)
        if process_rank() == 0:
            import yaml
            meta = {"step": p.step, "kind": p.kind, "world_size": dist.get_world_size() if dist.is_initialized()
                    else 1, "zero_stage": self.stage, "precision": self.precision, "git_commit": self.commit,
                    "versions": package_versions(), "created_utc": datetime.datetime.now(datetime.timezone.utc)
                    .isoformat(timespec="seconds"), "verify": {"loss": p.loss, "seq_len": self.seq_len},
                    "checksums": p.checksums, "digests": p.digests}
            _write_synced(os.path.join(p.tmp, "meta.json"), json.dumps(meta, indent=1))
            _write_synced(os.path.join(p.tmp, "config.yaml"), yaml.safe_dump(self.config, sort_keys=False))
            _fsync(p.tmp)  # meta and config are durable before COMPLETE says so
            _write_synced(os.path.join(p.tmp, COMPLETE), f"step {p.step} verified\n")
            _fsync(p.tmp)
            publish(p.tmp, p.final)
            self._prune(p.kind)
        if dist.is_initialized():
            dist.barrier()
        self.saved.append(p.final)

    def _prune(self, kind: str) -> None:
        if self.keep_last > 0:
            for old in list_checkpoints(self.root, kind)[:-self.keep_last]:
                retire(old)


# -- compatibility helpers (single call, no verification) ----------------------------------
def save_checkpoint(root: str, model, optimizer, step: int, loader_state=None) -> str:
    """Write a full checkpoint of step ``step`` atomically (no verification); collective.

    ``loader_state`` (any picklable value) must be the same on every rank, e.g. the loader's
    merged ``global_state_dict()``. Returns the checkpoint folder.
    """
    path, tmp = step_dir(root, step), os.path.join(root, f".step_{step:06d}.partial")
    dcp.save(build_state(model, optimizer, step, loader_state), checkpoint_id=tmp)
    if process_rank() == 0:
        _write_synced(os.path.join(tmp, COMPLETE), "")
        publish(tmp, path)
    if dist.is_initialized():
        dist.barrier()
    return path


@dataclass
class Restored:
    """What :func:`restore` brought back besides model and optimizer."""

    step: int
    loader_state: object
    trainer_state: object
    rng_restored: bool


def restore(path: str, model, optimizer, restore_rng: bool = True) -> Restored:
    """Load a full checkpoint into ``model`` and ``optimizer`` (any world size, any ZeRO stage);
    collective. Restores this rank's RNG states when the checkpoint has them (a rank new to the
    world size keeps its own; ``Restored.rng_restored`` says which happened).

    Raises:
        FileNotFoundError: ``path`` holds no finished checkpoint.
    """
    if not os.path.exists(os.path.join(path, ".metadata")):
        raise FileNotFoundError(f"{path}: no finished DCP checkpoint here (missing .metadata); "
                                "pick another one or set checkpoint.resume=\"\"")
    state = load_into(path, model, optimizer)
    apply_state(state, model, optimizer)
    rng = pickle.loads(state[f"rng_rank{process_rank()}"]) if f"rng_rank{process_rank()}" in state else None
    if restore_rng and rng is not None:
        set_rng_state(rng)
    return Restored(int(state["step"]), pickle.loads(state["loader"]), pickle.loads(state["trainer"]),
                    rng is not None)


def load_checkpoint(path: str, model, optimizer) -> tuple[int, object]:
    """Restore model and optimizer in place from ``path``; collective. Returns ``(step, loader_state)``."""
    r = restore(path, model, optimizer, restore_rng=False)
    return r.step, r.loader_state
