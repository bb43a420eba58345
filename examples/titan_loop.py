"""A torchtitan-style stateful loop on colaflow's loader, one process per rank: ``(input_dict, labels)`` batches
from ``TokenDataset`` (rank and world size from ``torch.distributed``), DDP, and per-rank checkpoints that
hold the ``StatefulDataLoader`` state beside the model's, as torchtitan's checkpointer does.

    torchrun --nproc_per_node=2 -m examples.titan_loop --shards runs/demo/shards --out /tmp/titan --save-at 5
    torchrun --nproc_per_node=2 -m examples.titan_loop --shards runs/demo/shards --out /tmp/titan --resume
"""
import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torchdata.stateful_dataloader import StatefulDataLoader

from examples import run
from loaders import DataConfig, TokenDataset


def main(argv=None) -> None:
    """Train ``--steps`` steps on every rank; each writes ``OUT/rank{r}.json`` (losses, inputs, positions)."""
    p = argparse.ArgumentParser(prog="python -m examples.titan_loop",
                                description="A torchtitan-style loop on colaflow's loader (under torchrun).")
    p.add_argument("--shards", required=True, help="local shard folder (e.g. runs/demo/shards)")
    p.add_argument("--out", required=True, help="folder for checkpoints")
    p.add_argument("--steps", type=int, default=10, help="optimizer steps in all")
    p.add_argument("--save-at", type=int, default=0, help="checkpoint after this step")
    p.add_argument("--resume", action="store_true", help="go on from this rank's checkpoint in --out")
    a = p.parse_args(argv)
    dist.init_process_group("gloo")
    dataset = TokenDataset(DataConfig(manifest=a.shards, seq_len=64, micro_batch_size=2, pack_window=1,
                                      format="torchtitan"))  # no rank given: torch.distributed's
    vocab = dataset.sources.manifest.vocab_size
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Embedding(vocab, 32), torch.nn.Linear(32, vocab)))
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loader = StatefulDataLoader(dataset, batch_size=None, num_workers=2)
    ckpt_path, step = os.path.join(a.out, f"checkpoint-rank{dataset.rank}.pt"), 0
    if a.resume:
        ckpt = torch.load(ckpt_path, weights_only=False)
        model.load_state_dict(ckpt["model"])
        optim.load_state_dict(ckpt["optimizer"])
        loader.load_state_dict(ckpt["dataloader"])
        step = ckpt["step"]
    seen = {"losses": [], "inputs": [], "positions": []}
    for input_dict, labels in loader:  # labels shifted already (labels[t] is input[t]'s target), -100 = no loss
        loss = F.cross_entropy(model(input_dict["input"]).flatten(0, 1), labels.flatten(0, 1), ignore_index=-100)
        optim.zero_grad()
        loss.backward()
        optim.step()
        step += 1
        seen["losses"].append(loss.item())
        seen["inputs"].append(input_dict["input"].tolist())
        seen["positions"].append(input_dict["positions"].tolist())
        if step == a.save_at:
            torch.save({"model": model.state_dict(), "optimizer": optim.state_dict(), "step": step,
                        "dataloader": loader.state_dict()}, ckpt_path)
        if step == a.steps:  # fewer than an epoch: every rank still has batches (no rank waits in DDP)
            break
    with open(os.path.join(a.out, f"rank{dataset.rank}.json"), "w") as f:
        json.dump(seen, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    run(main)
