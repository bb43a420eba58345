"""The ZeRO trainer: GPT model (``model``), ZeRO stages 0-3 (``parallel``), loop (``train``),
DCP checkpoints (``checkpoint``); run with ``torchrun --nproc_per_node=N -m trainer --config FILE``."""
