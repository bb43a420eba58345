"""``python -m trainer --config FILE [key=value ...]``, alone or under ``torchrun --nproc_per_node=N``."""
from __future__ import annotations

import argparse
import sys

import torch.distributed as dist

from shards.config import load_config
from trainer.config import TrainConfig
from trainer.train import train


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer", description=__doc__)
    parser.add_argument("--config", help="YAML file with a TrainConfig (sections model, data, cache, zero, ...)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, e.g. zero.stage=2 optim.lr=1e-3")
    args = parser.parse_args(argv)
    cfg = load_config(TrainConfig, args.config, args.overrides)
    try:
        train(cfg)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
