"""Train the small image classifier (:class:`trainer.vision.model.TinyCNN`) on image shards through DALI.

The image path end to end in one process: cached image shards (``KEY.jpg`` + ``KEY.cls``, as
written by ``python -m examples.demo.imageset``) → :class:`loaders.images.dali.DaliImageLoader` (decode, random
resized crop, flip, normalise; CPU operators without CUDA, nvJPEG + GPU operators on GPU 0 when
CUDA is present) → ``TinyCNN`` → AdamW. Each step's mean cross entropy and batch accuracy are
printed and, with ``--metrics FILE``, appended as JSON lines. Logging reads the loss on the host
every ``log_every`` steps only.

CLI::

    python -m examples.demo.imageset --out runs/images
    python -m trainer.vision.train --shards runs/images --steps 30
"""
from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass, fields

import torch

from colaflow.errors import run_cli
from colaflow.wording import help_text
from loaders.images.dali import DaliImageLoader
from trainer.vision.model import TinyCNN


@dataclass
class VisionTrainConfig:
    """Settings of :func:`train_vision` (laptop defaults).

    Attributes:
        shards: folder with ``manifest.json``, the image shards and ``classes.txt`` (the class
            count, see :func:`num_classes`).
        steps: optimizer steps (one batch each).
        batch_size: images per batch.
        crop: side of the square training crop in pixels.
        width: channels of the first conv stage of ``TinyCNN``.
        lr: AdamW learning rate (constant).
        weight_decay: AdamW decoupled weight decay.
        seed: model init and DALI pipeline seed.
        log_every: steps between host reads of loss/accuracy (1 = every step).
        num_threads: DALI CPU threads.
        metrics: JSON-lines file for the logged records (``""`` = print only).
    """

    shards: str = "runs/images"
    steps: int = 30
    batch_size: int = 16
    crop: int = 64
    width: int = 32
    lr: float = 3e-3
    weight_decay: float = 0.01
    seed: int = 0
    log_every: int = 1
    num_threads: int = 2
    metrics: str = ""


def num_classes(shards: str) -> int:
    """Class count from ``classes.txt`` in the shard folder (one name per line).

    Raises:
        FileNotFoundError: no ``classes.txt``; build the shards with ``python -m examples.demo.imageset``.
    """
    path = os.path.join(shards, "classes.txt")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} is missing: image shards need a classes.txt beside manifest.json "
                                "(python -m examples.demo.imageset --out DIR writes one)")
    with open(path, encoding="utf-8") as f:
        return sum(1 for line in f if line.strip())


def train_vision(cfg: VisionTrainConfig) -> list[dict]:
    """Run ``cfg.steps`` AdamW steps of ``TinyCNN`` on DALI batches; returns the logged records.

    Each record: ``step``, ``loss`` (mean cross entropy of the step's batch, nats), ``accuracy``
    (fraction of the batch's argmax predictions that equal the label, before the update),
    ``images``, ``seconds`` (wall time since the start), ``device``.

    Raises:
        ValueError: ``steps``/``batch_size``/``log_every`` < 1.
        FileNotFoundError: see :func:`num_classes`.
    """
    if min(cfg.steps, cfg.batch_size, cfg.log_every) < 1:
        raise ValueError("steps, batch_size and log_every must be >= 1")
    classes = num_classes(cfg.shards)
    loader = DaliImageLoader.from_manifest(cfg.shards, batch_size=cfg.batch_size, crop=cfg.crop, seed=cfg.seed,
                                           num_threads=cfg.num_threads)
    device = torch.device("cuda" if loader.device_id is not None and torch.cuda.is_available() else "cpu")
    torch.manual_seed(cfg.seed)
    model = TinyCNN(classes, cfg.width).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    records, start = [], time.perf_counter()
    sink = open(cfg.metrics, "a", encoding="utf-8") if cfg.metrics else None
    try:
        for step in range(1, cfg.steps + 1):
            images, labels = loader.next_batch()
            images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            logits = model.logits(images)
            loss = torch.nn.functional.cross_entropy(logits.float(), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if step % cfg.log_every == 0 or step == cfg.steps:
                acc = (logits.detach().argmax(dim=1) == labels).float().mean()
                rec = {"step": step, "loss": float(loss.detach()), "accuracy": float(acc),
                       "images": int(labels.numel()), "seconds": time.perf_counter() - start, "device": str(device)}
                records.append(rec)
                print(f"step {step:4d}  loss {rec['loss']:.4f}  acc {rec['accuracy']:.3f}", flush=True)
                if sink is not None:
                    sink.write(json.dumps(rec, sort_keys=True) + "\n")
                    sink.flush()
    finally:
        if sink is not None:
            sink.close()
    first, last = records[0], records[-1]
    print(f"trained {cfg.steps} steps of TinyCNN ({classes} classes) on {device}: loss {first['loss']:.3f} -> "
          f"{last['loss']:.3f} in {last['seconds']:.1f} s")
    return records


def train_from_flags(argv: list[str] | None = None) -> list[dict]:
    """Parse the flags of ``python -m trainer.vision.train`` into :class:`VisionTrainConfig`, train,
    and return the logged records (list of dicts)."""
    defaults = VisionTrainConfig()
    p = argparse.ArgumentParser(prog="python -m trainer.vision.train", description=help_text(__doc__),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    for f in fields(VisionTrainConfig):
        p.add_argument("--" + f.name.replace("_", "-"), type=type(getattr(defaults, f.name)),
                       default=getattr(defaults, f.name), help=f"default {getattr(defaults, f.name)!r}")
    args = p.parse_args(argv)
    return train_vision(VisionTrainConfig(**{f.name: getattr(args, f.name) for f in fields(VisionTrainConfig)}))


def main(argv: list[str] | None = None) -> int:
    """``python -m trainer.vision.train``: :func:`train_from_flags`; returns 0."""
    train_from_flags(argv)
    return 0


if __name__ == "__main__":
    run_cli(main)
