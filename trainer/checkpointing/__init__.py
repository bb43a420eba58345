"""Atomic, verified, resharding DCP checkpoints of a run (``trainer/README.md`` maps the modules)."""
from trainer.checkpointing.checkpoint import Checkpointer, Restored, load_checkpoint, restore, save_checkpoint
from trainer.checkpointing.layout import (
                                         COMPLETE,
                                         CheckpointStorageError,
                                         latest_checkpoint,
                                         list_checkpoints,
                                         read_meta,
                                         step_dir,
)
from trainer.checkpointing.state import export_checkpoint, load_full_state

__all__ = ["COMPLETE", "CheckpointStorageError", "Checkpointer", "Restored", "export_checkpoint", "latest_checkpoint",
           "list_checkpoints",
           "load_checkpoint", "load_full_state", "read_meta", "restore", "save_checkpoint", "step_dir"]
