"""Names and metadata of checkpoint folders (``step_XXXXXX`` / ``weights_XXXXXX``, the ``COMPLETE``
marker, ``meta.json`` provenance), read alike under a local path or any fsspec URL.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib import metadata as importlib_metadata

import fsspec

CKPT_DIR = re.compile(r"^(step|weights)_(\d{6,})$")
COMPLETE = "COMPLETE"


class CheckpointStorageError(OSError):
    """The checkpoint store refuses reads or writes (missing bucket, wrong or missing credentials)."""


def storage_error(root: str, action: str, e: BaseException) -> CheckpointStorageError:
    """One-line :class:`CheckpointStorageError` for store error ``e`` while doing ``action`` under ``root``."""
    reason = str(e).splitlines()[0] if str(e) else type(e).__name__
    return CheckpointStorageError(
        f"checkpoint.dir={root}: cannot {action} there ({type(e).__name__}: {reason}); check that the bucket "
        "exists and the credentials (AWS_* / GOOGLE_* or fsspec config) allow it")


def is_url(path: str) -> bool:
    """Whether ``path`` is an fsspec URL (``PROTOCOL://...``) rather than a local path."""
    return "://" in path


def exists(path: str) -> bool:
    """Whether file or folder ``path`` (local or URL) exists; URLs are asked of the store, not a
    cached listing (other processes write checkpoints)."""
    if not is_url(path):
        return os.path.exists(path)
    fs, p = fsspec.core.url_to_fs(path)
    fs.invalidate_cache()
    return fs.exists(p)


def list_names(root: str) -> list[str]:
    """Names of the entries directly under folder ``root`` (local or URL); ``[]`` when it is missing.

    Raises:
        CheckpointStorageError: the store refuses the listing (credentials), in one line.
    """
    if not is_url(root):
        return os.listdir(root) if os.path.isdir(root) else []
    fs, p = fsspec.core.url_to_fs(root)
    fs.invalidate_cache()
    try:
        return [e.rstrip("/").rsplit("/", 1)[-1] for e in fs.ls(p, detail=False)]
    except FileNotFoundError:
        return []
    except Exception as e:  # noqa: BLE001 - botocore/gcsfs raise their own types; all mean "cannot list"
        raise storage_error(root, "list", e) from e


def open_file(path: str, mode: str = "rb"):
    """Open file ``path`` (local or URL) with fsspec; a context manager like :func:`open`."""
    return fsspec.open(path, mode, encoding="utf-8" if "b" not in mode else None)


def storage_reader(path: str):
    """The DCP storage reader of checkpoint folder ``path``: ``FileSystemReader`` for a local path,
    ``FsspecReader`` for a URL."""
    from torch.distributed.checkpoint import FileSystemReader
    if not is_url(path):
        return FileSystemReader(path)
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader
    return FsspecReader(path)


def step_dir(root: str, step: int, kind: str = "full") -> str:
    """Folder of the checkpoint of ``step``: ``ROOT/step_XXXXXX`` (full) or ``ROOT/weights_XXXXXX``."""
    return os.path.join(root, f"{'step' if kind == 'full' else 'weights'}_{step:06d}")


def list_checkpoints(root: str, kind: str = "full") -> list[str]:
    """Finished (``COMPLETE``) checkpoint folders of ``kind`` under ``root`` (local or URL), oldest first."""
    want = "step" if kind == "full" else "weights"
    done = [(int(m.group(2)), name) for name in list_names(root) if (m := CKPT_DIR.match(name))
            and m.group(1) == want and exists(os.path.join(root, name, COMPLETE))]
    return [os.path.join(root, name) for _, name in sorted(done)]


def latest_checkpoint(root: str) -> str | None:
    """Newest finished full checkpoint under ``root``, or ``None``."""
    found = list_checkpoints(root)
    return found[-1] if found else None


# -- state ---------------------------------------------------------------------------------


def git_commit() -> str:
    """``git rev-parse HEAD`` of the source tree, or ``"unknown"``."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=os.path.dirname(os.path.abspath(__file__)),
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def package_versions() -> dict:
    """Versions of python, torch, numpy and colaflow (``"unknown"`` when not installed), for ``meta.json``."""
    out = {"python": sys.version.split()[0]}
    for name in ("torch", "numpy", "colaflow"):
        try:
            out[name] = importlib_metadata.version(name)
        except importlib_metadata.PackageNotFoundError:
            out[name] = "unknown"
    return out


def read_meta(path: str) -> dict:
    """The checkpoint's ``meta.json`` (written by :class:`trainer.checkpointing.Checkpointer`)."""
    with open_file(os.path.join(path, "meta.json"), "r") as f:
        return json.load(f)
