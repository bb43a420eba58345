"""What a training command does with a run folder that already holds output: resume, refuse or
overwrite (the table is in ``trainer/README.md``). A checkpoint is compatible when its
``config.yaml`` has the same model architecture (:meth:`ModelConfig.architecture`: ``init_from`` and
how the SwiGLU width was given do not count): DCP reshards every other difference (world size,
ZeRO stage), not tensor shapes or names.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field

from trainer.checkpointing.layout import exists, is_url, latest_checkpoint, list_names, open_file, read_meta
from trainer.checkpointing.storage import open_store
from trainer.config import ModelConfig, TrainConfig

# files and folders (relative to run_dir) that one training run writes, besides checkpoint.dir
RUN_ARTIFACTS = ("train_summary.json", "config.json", "events.jsonl", "report", "profile")


class RunFolderError(ValueError):
    """The run folder holds an earlier run that cannot be resumed; the message says what to do."""


@dataclass
class RunPlan:
    """What :func:`plan_run` decided for ``run_dir``.

    Attributes:
        action: ``fresh`` (nothing there), ``resume`` or ``overwrite`` (earlier run removed first).
        checkpoint: folder to resume from (``resume`` only).
        step: optimizer step the checkpoint holds (0 when not resuming).
    """

    action: str
    checkpoint: str | None = None
    step: int = 0
    lock: object = field(default=None, compare=False, repr=False)  # rank 0's hold on run_dir (lock_run_folder)


LOCK_FILE = ".colaflow-run.lock"  # in run_dir, locked by the live run's rank 0


def lock_run_folder(run_dir: str, probe: bool = False):
    """Take the exclusive lock of ``run_dir`` for this run (rank 0; released by the kernel when the
    process ends, or by ``release()``); the folder is created if missing.

    Args:
        run_dir: the run folder.
        probe: only check that no live run holds it (``--dry-run``): nothing is created, the lock is
            released at once and ``None`` returned.
    Returns:
        the held :class:`cache.storage.locks.FileLock` (``None`` with ``probe``).
    Raises:
        RunFolderError: another live run holds it; the message names its pid.
    """
    from cache.storage.locks import FileLock
    path = os.path.join(run_dir, LOCK_FILE)
    if probe and not os.path.exists(path):
        _check_writable(run_dir)
        return None
    os.makedirs(run_dir, exist_ok=True)
    lock = FileLock(path)
    if not lock.acquire(blocking=False):
        pid = lock.holder()
        raise RunFolderError(f"run_dir={run_dir} is in use by a live run (pid {pid if pid else '?'}): two runs "
                             "would train into it at once; wait for it to end (or stop it), or choose another run_dir")
    if probe:
        lock.release()
        return None
    return lock


def _check_writable(run_dir: str) -> None:
    """Check that ``run_dir`` (or the nearest folder above it that exists) takes a new file, by
    creating and removing one: permission bits alone miss a read-only filesystem and root's rights.

    Raises:
        RunFolderError: no file can be created there; the message names the folder and the cause.
    """
    import tempfile
    where = os.path.abspath(run_dir)
    while not os.path.isdir(where) and os.path.dirname(where) != where:
        where = os.path.dirname(where)
    try:
        fd, name = tempfile.mkstemp(prefix=".colaflow-probe-", dir=where)
        os.close(fd)
        os.remove(name)
    except OSError as e:
        raise RunFolderError(f"run_dir={run_dir} cannot be written: creating a file in {where} failed "
                             f"({e.strerror or e}); choose a run_dir on a writable filesystem") from e


def checkpoint_root(cfg: TrainConfig) -> str:
    """``checkpoint.dir`` resolved against ``run_dir``; an fsspec URL (``s3://bucket/run/ckpt``) as is."""
    return cfg.checkpoint.dir if is_url(cfg.checkpoint.dir) else os.path.join(cfg.run_dir, cfg.checkpoint.dir)


def _earlier_output(cfg: TrainConfig) -> list[str]:
    names = [cfg.metrics.jsonl, "train_summary.json"]
    found = [os.path.join(cfg.run_dir, n) for n in names if os.path.exists(os.path.join(cfg.run_dir, n))]
    root = checkpoint_root(cfg)
    if list_names(root):
        found.append(root)
    return found


def check_compatible(path: str, cfg: TrainConfig) -> int:
    """Check that checkpoint ``path`` can be resumed by ``cfg``; returns its step.

    Raises:
        RunFolderError: not a finished full checkpoint, or its ``model`` section differs from
            ``cfg.model`` (the differing keys are named).
    """
    import yaml

    from colaflow.config import ConfigError, from_dict
    try:
        meta = read_meta(path)
        with open_file(os.path.join(path, "config.yaml"), "r") as f:
            saved = (yaml.safe_load(f) or {}).get("model", {})
    except (OSError, ValueError) as e:
        raise RunFolderError(f"{path}: not a readable colaflow checkpoint ({e}); pick another with "
                             "checkpoint.resume=PATH or start over with checkpoint.overwrite=true") from e
    if meta.get("kind") != "full":
        raise RunFolderError(f"{path}: a weights-only checkpoint cannot resume training (no optimizer/loader "
                             "state); use a step_XXXXXX folder")
    try:
        have = from_dict(ModelConfig, saved).architecture()  # keys an older trainer did not write: defaults
    except ConfigError as e:
        raise RunFolderError(f"{path}: its config.yaml model section does not load ({e}); pick another with "
                             "checkpoint.resume=PATH or start over with checkpoint.overwrite=true") from e
    want = cfg.model.architecture()
    differ = sorted(k for k in want if want[k] != have[k] and not (k == "vocab_size" and want[k] == 0))
    if differ:
        what = ", ".join(f"model.{k}={have[k]!r} (now {want[k]!r})" for k in differ)
        raise RunFolderError(f"{path} was trained with {what}: it cannot be resumed by this config. Use another "
                             "run_dir, or checkpoint.overwrite=true to replace that run")
    return int(meta["step"])


def plan_run(cfg: TrainConfig) -> RunPlan:
    """Decide between fresh start, resume and overwrite for ``cfg.run_dir`` (module doc); reads only.

    Raises:
        RunFolderError: the folder holds an earlier run that this config must not continue or replace.
    """
    ck = cfg.checkpoint
    if ck.overwrite:
        return RunPlan("overwrite")
    if ck.resume not in ("", "latest"):
        if not exists(ck.resume):
            raise RunFolderError(f"checkpoint.resume={ck.resume}: no such checkpoint folder; use latest, \"\" "
                                 "or an existing step_XXXXXX folder")
        return RunPlan("resume", ck.resume, check_compatible(ck.resume, cfg))
    latest = latest_checkpoint(checkpoint_root(cfg))
    if latest is not None:
        return RunPlan("resume", latest, check_compatible(latest, cfg))
    earlier = _earlier_output(cfg)
    if earlier and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
        raise RunFolderError(f"run_dir={cfg.run_dir} already holds a run ({', '.join(earlier)}) with no finished "
                             "checkpoint to resume from; use another run_dir or checkpoint.overwrite=true")
    return RunPlan("fresh")


def remove_earlier_run(cfg: TrainConfig) -> None:
    """Delete what an earlier run wrote into ``run_dir`` (checkpoints, metrics, events, summary,
    report, profile, TensorBoard); other files in the folder are left alone."""
    names = [*RUN_ARTIFACTS, cfg.metrics.jsonl, cfg.metrics.tensorboard_dir]
    open_store(checkpoint_root(cfg)).remove_all()
    for path in [os.path.join(cfg.run_dir, n) for n in names if n]:
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.remove(path)


def _step_of(line: str) -> int | None:
    """The ``step`` of one ``metrics.jsonl`` record (0 when it has none), ``None`` for a line that is
    not a whole JSON record."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return int(record.get("step", 0)) if isinstance(record, dict) else None


def truncate_metrics(path: str, step: int) -> int:
    """Drop the records of ``metrics.jsonl`` at ``path`` whose ``step`` is after ``step``, and a
    record cut short (a run killed, or out of space, while it wrote it), rewritten atomically;
    returns how many were dropped (0 when the file is absent)."""
    if not os.path.exists(path):
        return 0
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = [line for line in f if line.strip()]
    keep = [line for line in lines if _step_of(line) is not None and _step_of(line) <= step]
    if len(keep) < len(lines):
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(keep)
        os.replace(tmp, path)
    return len(lines) - len(keep)


def prepare_run(cfg: TrainConfig, is_main: bool) -> RunPlan:
    """:func:`plan_run` on rank 0, shared with every rank; rank 0 then applies it (overwrite:
    remove the earlier run; resume: drop metrics records after the checkpoint's step); collective
    when distributed (one broadcast and one barrier). Rank 0 first locks ``run_dir``
    (:func:`lock_run_folder`) and keeps it locked in the returned plan's ``lock`` until the run ends.

    Raises:
        RunFolderError: see :func:`plan_run`, or another live run holds ``run_dir`` (raised on every rank).
    """
    import torch.distributed as dist
    result: list = [None]
    lock = None
    if is_main:
        try:
            lock = lock_run_folder(cfg.run_dir)
            result[0] = plan_run(cfg)
        except RunFolderError as e:
            result[0] = e
            if lock is not None:
                lock.release()
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(result, src=0)
    if isinstance(result[0], RunFolderError):
        raise RunFolderError(str(result[0]))
    plan: RunPlan = result[0]
    plan.lock = lock
    if is_main:
        if plan.action == "overwrite":
            remove_earlier_run(cfg)
        else:
            truncate_metrics(os.path.join(cfg.run_dir, cfg.metrics.jsonl), plan.step)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
    return plan
