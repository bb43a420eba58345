"""Names and metadata of checkpoint folders: ``step_XXXXXX`` / ``weights_XXXXXX``, the ``COMPLETE``
marker, listing finished checkpoints, and the provenance written into ``meta.json``."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib import metadata as importlib_metadata

CKPT_DIR = re.compile(r"^(step|weights)_(\d{6,})$")
COMPLETE = "COMPLETE"


def step_dir(root: str, step: int, kind: str = "full") -> str:
    """Folder of the checkpoint of ``step``: ``ROOT/step_XXXXXX`` (full) or ``ROOT/weights_XXXXXX``."""
    return os.path.join(root, f"{'step' if kind == 'full' else 'weights'}_{step:06d}")


def list_checkpoints(root: str, kind: str = "full") -> list[str]:
    """Finished (``COMPLETE``) checkpoint folders of ``kind`` under ``root``, oldest first."""
    if not os.path.isdir(root):
        return []
    want = "step" if kind == "full" else "weights"
    done = [(int(m.group(2)), name) for name in os.listdir(root) if (m := CKPT_DIR.match(name))
            and m.group(1) == want and os.path.exists(os.path.join(root, name, COMPLETE))]
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
    with open(os.path.join(path, "meta.json"), encoding="utf-8") as f:
        return json.load(f)
