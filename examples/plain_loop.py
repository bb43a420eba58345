"""A plain PyTorch loop on colaflow's loader: ``TokenDataset`` in torchdata's ``StatefulDataLoader`` (a drop-in
``torch.utils.data.DataLoader`` that also saves its position), 2 worker processes, resumable.

    python -m examples.plain_loop --shards runs/demo/shards --steps 20 --save-at 10 --ckpt /tmp/plain.pt
    python -m examples.plain_loop --shards runs/demo/shards --steps 20 --resume /tmp/plain.pt
"""
import argparse
import json

import torch
import torch.nn.functional as F
from torchdata.stateful_dataloader import StatefulDataLoader

from examples import run
from loaders import DataConfig, TokenDataset


def main(argv=None) -> dict:
    """Train a bigram model for ``--steps`` steps; returns (and prints) the losses and each step's sample keys."""
    p = argparse.ArgumentParser(prog="python -m examples.plain_loop",
                                description="A plain PyTorch loop on colaflow's loader, resumable.")
    p.add_argument("--shards", required=True, help="local shard folder (e.g. runs/demo/shards)")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps in all")
    p.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    p.add_argument("--save-at", type=int, default=0, help="checkpoint after this step")
    p.add_argument("--ckpt", default="", help="checkpoint file to write")
    p.add_argument("--resume", default="", help="checkpoint file to go on from")
    a = p.parse_args(argv)
    dataset = TokenDataset(DataConfig(manifest=a.shards, seq_len=64, micro_batch_size=4, pack_window=1))
    vocab = dataset.sources.manifest.vocab_size
    model = torch.nn.Sequential(torch.nn.Embedding(vocab, 32), torch.nn.Linear(32, vocab))
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loader = StatefulDataLoader(dataset, batch_size=None, num_workers=a.workers)
    step = first_epoch = 0
    if a.resume:
        ckpt = torch.load(a.resume, weights_only=False)
        model.load_state_dict(ckpt["model"])
        optim.load_state_dict(ckpt["optim"])
        loader.load_state_dict(ckpt["data"])  # the next batch is the one the first run would have had
        step, first_epoch = ckpt["step"], ckpt["epoch"]
    out = {"losses": [], "keys": []}
    for epoch in range(first_epoch, 100):
        dataset.set_epoch(epoch)  # as with DistributedSampler; a resumed state's epoch goes on where it was
        for batch in loader:  # loaders.TokenBatch: labels are shifted already, -100 where no loss is taken
            logits = model(batch.input_ids)
            loss = F.cross_entropy(logits.flatten(0, 1), batch.labels.flatten(), ignore_index=-100)
            optim.zero_grad()
            loss.backward()
            optim.step()
            step += 1
            out["losses"].append(loss.item())
            out["keys"].append(list(batch.keys))
            if step == a.save_at:
                torch.save({"model": model.state_dict(), "optim": optim.state_dict(), "step": step,
                            "epoch": epoch, "data": loader.state_dict()}, a.ckpt)
            if step == a.steps:
                print(json.dumps(out))
                return out
    return out


if __name__ == "__main__":
    run(main)
