"""Save and restore a run with ``torch.distributed.checkpoint`` (DCP), atomically and verified
(:class:`Checkpointer`, :func:`restore`; the save's steps are in ``trainer/README.md``).

Contents of ``<dir>/step_XXXXXX`` (full) and ``<dir>/weights_XXXXXX`` (weights only):

- DCP files (``.metadata``, ``__R_0.distcp``): ``model`` (FQN → tensor), ``optim`` (the
  ``get_optimizer_state_dict`` layout: ``state`` keyed by parameter FQN + ``param_groups``; at
  ZeRO stage 1 each rank saves the parameters it owns, so the union is the same layout),
  ``step``, ``loader`` (the merged loader state of all ranks), ``trainer`` (scheduler and anomaly
  state) and ``rng_rank<R>`` (python, numpy, torch CPU/CUDA RNG states of rank R).
- ``meta.json``: step, kind, world size, ZeRO stage, git commit, package versions, per-tensor
  checksums, the fixed-batch reference loss, ``init_from`` (the pretrained weights the run
  started from: ``{path, kind, sha256}``, or ``null``) and ``tokenizer`` (``{kind, sha256}`` of the
  tokenizer that wrote the run's data, or ``null``); ``config.yaml``: the run's config; ``COMPLETE``.
"""
from __future__ import annotations

import datetime
import json
import os
import pickle
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

import trainer.checkpointing.verify as V
from colaflow.errors import io_cause, io_failure
from trainer.checkpointing.layout import COMPLETE, CheckpointStorageError, exists, git_commit, list_checkpoints, package_versions, step_dir
from trainer.checkpointing.state import apply_state, build_state, load_into, process_rank, set_rng_state
from trainer.checkpointing.storage import open_store


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


class Checkpointer:
    """Atomic, verified DCP checkpoints of one run; every method is collective.

    Args:
        root: checkpoint folder: a local path or an fsspec URL (``s3://bucket/run/ckpt``); how a save
            becomes visible there is :mod:`trainer.checkpointing.storage`'s business.
        device, precision, stage: how the model runs (for the reference forward pass whose loss
            ``meta.json`` keeps for offline verification).
        vocab_size, seq_len: shape of the fixed verification batch.
        config: the run's config as a plain dict (written as ``config.yaml``).
        keep_last: finished checkpoints kept per kind (0 = all).
        async_save: write with ``dcp.async_save`` on a dedicated gloo group.
        init_from: ``{path, kind, sha256}`` of the weights the run started from (``model.init_from``),
            recorded in ``meta.json``; ``None`` for a random initialisation.
        tokenizer: ``{kind, sha256}`` of the tokenizer that wrote the data (the manifest's), recorded in
            ``meta.json`` so a resume on other tokens is refused; ``None`` when the manifest has none.

    Raises:
        trainer.checkpointing.layout.CheckpointStorageError: a URL ``root`` refuses writes (missing
            bucket, credentials), on every rank, at construction.
    """

    def __init__(self, root: str, device: torch.device, precision: str = "fp32", stage: int = 0,
                 vocab_size: int = 2, seq_len: int = 16, config: dict | None = None, keep_last: int = 0,
                 async_save: bool = False, init_from: dict | None = None, tokenizer: dict | None = None):
        self.root, self.device, self.init_from, self.tokenizer = root, device, init_from, tokenizer
        self.precision, self.stage, self.keep_last, self.config = precision, stage, keep_last, config or {}
        self.seq_len = seq_len
        self.batch = V.fixed_batch(vocab_size, seq_len)
        self.pg = dist.new_group(backend="gloo") if async_save and dist.is_initialized() else None
        self.async_save = async_save
        self.pending: _Pending | None = None
        self.commit = git_commit() if process_rank() == 0 else "unknown"
        self.saved: list[str] = []
        self._state_bytes = 0  # of the save in flight, to tell a full disk from other failures
        self.store = open_store(root)
        self.store.check(process_rank())
        if process_rank() == 0:  # saves, prunes or replacements cut short by a crash or a killed worker
            self.store.recover()
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
        tmp = self.store.staging(final)
        if process_rank() == 0:
            self.store.begin(tmp)  # left over by a crash, or the same step saved before a rollback
        if dist.is_initialized():
            dist.barrier()
        state = build_state(model, optimizer, step, loader_state, trainer_state, kind)
        self._state_bytes = _tensor_bytes(state)
        checksums, digests = V.state_checksums(state, self.device), V.object_digests(state)
        loss = V.reference_loss(model, self.batch, self.device, self.precision, self.stage)
        if self.async_save:
            future = dcp.async_save(state, storage_writer=self.store.writer(tmp), process_group=self.pg)
            self.pending = _Pending(future, tmp, final, kind, step, checksums, digests, loss)
        else:
            try:
                dcp.save(state, storage_writer=self.store.writer(tmp))
            except CheckpointException as e:
                # DCP wraps every failure, Ctrl-C included; an interrupt stays an interrupt (exit 130)
                if any(isinstance(f[0], KeyboardInterrupt) for f in e.failures.values()):
                    raise KeyboardInterrupt from e
                self._raise_write_error(e, step, tmp)
            self._commit(_Pending(None, tmp, final, kind, step, checksums, digests, loss))
        return final

    def _raise_write_error(self, e: BaseException, step: int, folder: str):
        """Re-raise failure ``e`` of a save of step ``step`` into ``folder``: as a one-line
        :class:`~trainer.checkpointing.layout.CheckpointStorageError` when an I/O failure caused it (no
        space, quota, read-only, no permission; DCP reports it as ``unexpected pos N vs M`` and keeps
        the ``OSError`` inside, which is lost when the ranks' failures are gathered: then the folder
        itself is examined, :func:`_probable_io_cause`), else as it is."""
        io = io_cause(e) or _probable_io_cause(folder, self._state_bytes)
        if io is None:
            raise e
        raise CheckpointStorageError(f"checkpoint.dir={self.root}: saving step {step} failed: "
                                     f"{io_failure(io, folder)}") from e

    def wait(self) -> None:
        """Finish an async save in flight: wait for its writes, verify, commit."""
        if self.pending is None:
            return
        pending, self.pending = self.pending, None
        future = getattr(pending.future, "upload_completion", pending.future)
        try:
            future.result()
        except Exception as e:  # noqa: BLE001 - an I/O failure gets its one line, anything else stays as it is
            self._raise_write_error(e, pending.step, pending.tmp)
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
                    "init_from": self.init_from, "tokenizer": self.tokenizer, "checksums": p.checksums,
                    "digests": p.digests}
            self.store.write_text(p.tmp, "meta.json", json.dumps(meta, indent=1))
            self.store.write_text(p.tmp, "config.yaml", yaml.safe_dump(self.config, sort_keys=False))
            self.store.commit(p.tmp, p.final, f"step {p.step} verified\n")
            self._prune(p.kind)
        if dist.is_initialized():
            dist.barrier()
        self.saved.append(p.final)

    def _prune(self, kind: str) -> None:
        if self.keep_last > 0:
            for old in list_checkpoints(self.root, kind)[:-self.keep_last]:
                self.store.delete(old)


def _tensor_bytes(state) -> int:
    """Bytes of the tensors (this rank's shards of them) in a nested checkpoint state."""
    if isinstance(state, dict):
        return sum(_tensor_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(_tensor_bytes(v) for v in state)
    if isinstance(state, torch.Tensor):
        local = state.to_local() if hasattr(state, "to_local") else state
        return local.numel() * local.element_size()
    return 0


def _probable_io_cause(folder: str, needed: int) -> OSError | None:
    """Why a local save of about ``needed`` bytes into ``folder`` (or its nearest existing parent)
    failed, when the folder says so: read-only (``EROFS``), not writable (``EACCES``), fewer free
    bytes than ``needed`` (``ENOSPC``), or a file size limit below it (``EFBIG``); ``None`` otherwise."""
    import errno
    import resource
    import shutil

    if "://" in folder:
        return None
    path = folder
    while path and not os.path.exists(path):
        path = os.path.dirname(path)
    if not path:
        return None
    if os.statvfs(path).f_flag & os.ST_RDONLY:
        return OSError(errno.EROFS, os.strerror(errno.EROFS), folder)
    if not os.access(path, os.W_OK):
        return OSError(errno.EACCES, os.strerror(errno.EACCES), folder)
    if shutil.disk_usage(path).free < needed:
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), folder)
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit != resource.RLIM_INFINITY and limit < needed:
        return OSError(errno.EFBIG, os.strerror(errno.EFBIG), folder)
    return None


# -- compatibility helpers (single call, no verification) ----------------------------------
def save_checkpoint(root: str, model, optimizer, step: int, loader_state=None) -> str:
    """Write a full checkpoint of step ``step`` atomically (no verification); collective.

    ``loader_state`` (any picklable value) must be the same on every rank, e.g. the loader's
    merged ``global_state_dict()``. Returns the checkpoint folder.
    """
    store = open_store(root)
    path = step_dir(root, step)
    tmp = store.staging(path)
    if process_rank() == 0:
        store.begin(tmp)
    if dist.is_initialized():
        dist.barrier()
    dcp.save(build_state(model, optimizer, step, loader_state), storage_writer=store.writer(tmp))
    if process_rank() == 0:
        store.commit(tmp, path, "")
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
        FileNotFoundError: ``path`` (local or URL) holds no finished checkpoint (no ``COMPLETE``).
    """
    if not exists(os.path.join(path, COMPLETE)) or not exists(os.path.join(path, ".metadata")):
        raise FileNotFoundError(f"{path}: no finished checkpoint here (no {COMPLETE} or .metadata); "
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
