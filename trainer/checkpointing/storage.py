"""Where a :class:`trainer.checkpointing.Checkpointer` writes: a local folder (:class:`LocalStore`) or
an fsspec URL such as ``s3://`` / ``gs://`` (:class:`UrlStore`); a store decides only how a save
becomes visible and how a checkpoint is deleted.
"""
from __future__ import annotations

import os
import shutil

import fsspec

from trainer.checkpointing.layout import COMPLETE, is_url, list_names, storage_error


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
    """Tidy local ``root`` after a crash (rank 0, at start): remove unfinished saves (``.NAME.partial``)
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
    """Rename the finished local folder ``tmp`` to ``final`` durably. A folder already at ``final``
    (the same step saved again after a rollback) is first renamed aside to ``.NAME.old`` and deleted
    only after the new one is in place, so at every instant one whole copy exists
    (:func:`recover_root` puts ``.old`` back after a crash between the renames)."""
    root = os.path.dirname(final)
    old = _hidden(root, final, "old")
    if os.path.exists(final):
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    _fsync(root)
    shutil.rmtree(old, ignore_errors=True)


def retire(path: str) -> None:
    """Delete local checkpoint folder ``path`` so that it never looks finished while half-deleted:
    it is renamed to a hidden ``.NAME.deleting`` first, durably, then removed."""
    root = os.path.dirname(path)
    doomed = _hidden(root, path, "deleting")
    os.replace(path, doomed)
    _fsync(root)
    shutil.rmtree(doomed, ignore_errors=True)


class LocalStore:
    """Checkpoints in local (or shared) folder ``root``: DCP writes a hidden ``.NAME.partial`` folder,
    its files are fsynced, it is renamed to its final name and the parent fsynced (:func:`publish`);
    deletion renames to ``.NAME.deleting`` first (:func:`retire`); :func:`recover_root` tidies what
    a crash left."""

    def __init__(self, root: str):
        self.root = root

    def check(self, rank: int) -> None:
        """Nothing to probe: a local folder that refuses writes fails with its own ``OSError``."""

    def staging(self, final: str) -> str:
        """Folder DCP writes into before the save is committed: the hidden ``.NAME.partial``."""
        return _hidden(self.root, final, "partial")

    def recover(self) -> None:
        """Rank 0 at start: tidy what a crash left (:func:`recover_root`)."""
        recover_root(self.root)

    def begin(self, staging: str) -> None:
        """Rank 0 before a save: drop a ``.partial`` left by a crash, create the root."""
        shutil.rmtree(staging, ignore_errors=True)
        os.makedirs(self.root, exist_ok=True)

    def writer(self, staging: str):
        """DCP storage writer into ``staging`` (``FileSystemWriter``, files fsynced)."""
        from torch.distributed.checkpoint import FileSystemWriter
        return FileSystemWriter(staging)

    def write_text(self, staging: str, name: str, text: str) -> None:
        """Write file ``name`` (UTF-8 ``text``) into ``staging``, fsynced."""
        _write_synced(os.path.join(staging, name), text)

    def commit(self, staging: str, final: str, marker: str) -> None:
        """Make the save visible: fsync the folder, write ``COMPLETE`` (text ``marker``) last,
        fsync, rename to ``final`` (:func:`publish`)."""
        _fsync(staging)  # meta and config are durable before COMPLETE says so
        _write_synced(os.path.join(staging, COMPLETE), marker)
        _fsync(staging)
        publish(staging, final)

    def delete(self, path: str) -> None:
        """Delete a finished checkpoint (:func:`retire`)."""
        retire(path)

    def remove_all(self) -> None:
        """Delete the whole checkpoint root (``checkpoint.overwrite``)."""
        shutil.rmtree(self.root, ignore_errors=True)


class UrlStore:
    """Checkpoints under fsspec URL ``root``. Object stores cannot rename a folder atomically, so
    every rank writes its DCP files (``FsspecWriter``) straight into the final folder and rank 0
    writes ``COMPLETE`` last; a folder without it is invisible
    (:func:`trainer.checkpointing.layout.list_checkpoints`) and is removed before the same step is
    written again. Deletion removes ``COMPLETE`` first. Credentials and endpoints come from the
    environment (``AWS_*`` for s3fs) or fsspec's config."""

    def __init__(self, root: str):
        self.root = root.rstrip("/")
        self.fs, self.path = fsspec.core.url_to_fs(self.root)

    def _key(self, url: str) -> str:
        return self.fs._strip_protocol(url)

    def check(self, rank: int) -> None:
        """Write and delete one small object as rank ``rank``, so a store that refuses writes fails
        at start in one line instead of in the middle of a save.

        Raises:
            trainer.checkpointing.layout.CheckpointStorageError: naming the URL and the store's reason
                (missing bucket, credentials).
        """
        probe = f"{self.path}/.probe-rank{rank}"
        try:
            self.fs.pipe_file(probe, b"ok")
            self.fs.rm(probe)
        except Exception as e:  # noqa: BLE001 - botocore/gcsfs raise their own types; all mean "cannot write"
            raise storage_error(self.root, "write", e) from e

    def staging(self, final: str) -> str:
        """Folder DCP writes into: ``final`` itself (no rename on object stores)."""
        return final

    def recover(self) -> None:
        """Nothing to tidy: a save cut short has no ``COMPLETE`` (invisible) and is removed by
        :meth:`begin` when that step is written again."""

    def begin(self, staging: str) -> None:
        """Rank 0 before a save: delete an earlier folder of the same step, ``COMPLETE`` first."""
        self.delete(staging)

    def writer(self, staging: str):
        """DCP storage writer into URL ``staging`` (``FsspecWriter``)."""
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter
        return FsspecWriter(staging)

    def write_text(self, staging: str, name: str, text: str) -> None:
        """Upload object ``name`` (UTF-8 ``text``) into ``staging``."""
        self.fs.pipe_file(f"{self._key(staging)}/{name}", text.encode("utf-8"))

    def commit(self, staging: str, final: str, marker: str) -> None:
        """Make the save visible: upload ``COMPLETE`` (text ``marker``) after every other object."""
        self.write_text(final, COMPLETE, marker)

    def delete(self, path: str) -> None:
        """Delete checkpoint folder URL ``path``: ``COMPLETE`` first, so it is invisible while the
        rest goes."""
        key = self._key(path)
        self.fs.invalidate_cache()
        if self.fs.exists(f"{key}/{COMPLETE}"):
            self.fs.rm(f"{key}/{COMPLETE}")
        if self.fs.exists(key):
            self.fs.rm(key, recursive=True)
        self.fs.invalidate_cache()

    def remove_all(self) -> None:
        """Delete every checkpoint under the root (``checkpoint.overwrite``), each ``COMPLETE`` first."""
        for name in list_names(self.root):
            self.delete(f"{self.root}/{name}")


def open_store(root: str) -> LocalStore | UrlStore:
    """The store of checkpoint root ``root``: :class:`UrlStore` for an fsspec URL, else :class:`LocalStore`."""
    return UrlStore(root) if is_url(root) else LocalStore(root)
