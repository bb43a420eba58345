"""Checkpointing: atomic, verified, resharding DCP checkpoints of a run.

- :mod:`.layout`: folder names, the ``COMPLETE`` marker, listing, ``meta.json`` provenance.
- :mod:`.state`: what a checkpoint holds and how it moves to and from a live model/optimizer.
- :mod:`.verify`: per-tensor checksums and reload checks (online and ``python -m trainer verify``).
- :mod:`.checkpoint`: :class:`Checkpointer` (save, verify, commit, prune) and :func:`restore`.
- :mod:`.storage`: where checkpoints live: a local folder (write hidden, fsync, rename) or any fsspec
  URL such as ``s3://`` / ``gs://`` (DCP's fsspec storage, ``COMPLETE`` written last).
"""
from trainer.checkpointing.checkpoint import Checkpointer, Restored, load_checkpoint, restore, save_checkpoint
from trainer.checkpointing.layout import (COMPLETE, CheckpointStorageError, latest_checkpoint, list_checkpoints,
                                         read_meta, step_dir)
from trainer.checkpointing.state import export_checkpoint, load_full_state

__all__ = ["COMPLETE", "CheckpointStorageError", "Checkpointer", "Restored", "export_checkpoint", "latest_checkpoint",
           "list_checkpoints",
           "load_checkpoint", "load_full_state", "read_meta", "restore", "save_checkpoint", "step_dir"]
