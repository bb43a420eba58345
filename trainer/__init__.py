"""The trainer: a Llama-architecture model (:mod:`.model`), ZeRO stages 0-3 (:mod:`.distributed`), the
loop (:mod:`.train`) and verified DCP checkpoints (:mod:`.checkpointing`); see ``trainer/README.md``.
Run with ``torchrun --nproc_per_node=N -m trainer --config FILE`` (or ``colaflow train``)."""
