"""Atomic, verified, resharding DCP checkpoints of a run (``trainer/README.md`` maps the modules)."""
import importlib

# Imported on first use: the folder names and meta.json (``.layout``) are read by the command line's
# config errors, ``--dry-run`` and run-folder checks, which must not pay for torch.distributed.checkpoint
# (about a second: it imports sympy), which ``.checkpoint`` and ``.state`` import.
_EXPORTS = {"COMPLETE": ".layout", "CheckpointStorageError": ".layout", "Checkpointer": ".checkpoint",
            "Restored": ".checkpoint", "export_checkpoint": ".state", "latest_checkpoint": ".layout",
            "list_checkpoints": ".layout", "load_checkpoint": ".checkpoint", "load_full_state": ".state",
            "read_meta": ".layout", "restore": ".checkpoint", "save_checkpoint": ".checkpoint", "step_dir": ".layout"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    """Lazy access to the package's public names (PEP 562)."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'trainer.checkpointing' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
