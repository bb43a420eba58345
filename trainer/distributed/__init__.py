"""Process groups, ZeRO stages 0-3 (DDP, ZeroRedundancyOptimizer, FSDP2) and local launches."""
