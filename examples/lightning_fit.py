"""Lightning on colaflow's loader: ``TokenDataset`` in torchdata's ``StatefulDataLoader``, whose position
Lightning saves in its checkpoint (one every ``--steps / 2``) and restores with ``fit(ckpt_path=...)``.

    python -m examples.lightning_fit --shards runs/demo/shards --out /tmp/pl --steps 20 [--resume /tmp/pl/step=10.ckpt]
"""
import argparse
import json

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from torchdata.stateful_dataloader import StatefulDataLoader

from examples import run
from loaders import DataConfig, TokenDataset


class Bigram(L.LightningModule):
    """A bigram language model on ``loader`` (a TokenDataset, or a TextLoader); notes each step's loss and keys."""

    def __init__(self, loader):
        super().__init__()
        self.loader, vocab = loader, loader.sources.manifest.vocab_size
        self.net = torch.nn.Sequential(torch.nn.Embedding(vocab, 32), torch.nn.Linear(32, vocab))
        self.seen = {"losses": [], "keys": []}

    def on_train_epoch_start(self):
        """Tell the loader the epoch (a resumed state's epoch goes on where it was)."""
        self.loader.set_epoch(self.current_epoch)

    def training_step(self, dataloader_iter):
        """One step on the next batch, fetched here: Lightning would fetch one ahead for a loader without
        len(), and its checkpoint's loader state would count that batch as trained on."""
        batch = next(dataloader_iter)[0].to(self.device)  # a TokenBatch: labels shifted already, -100: no loss
        loss = F.cross_entropy(self.net(batch.input_ids).flatten(0, 1), batch.labels.flatten(), ignore_index=-100)
        self.seen["losses"].append(loss.item())
        self.seen["keys"].append(list(batch.keys))
        return loss

    def configure_optimizers(self):
        """AdamW."""
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def main(argv=None) -> dict:
    """Fit for ``--steps`` steps; returns (and prints) each step's loss and sample keys."""
    p = argparse.ArgumentParser(prog="python -m examples.lightning_fit",
                                description="Lightning on colaflow's loader, resumed from Lightning's checkpoint.")
    p.add_argument("--shards", required=True, help="local shard folder (e.g. runs/demo/shards)")
    p.add_argument("--out", required=True, help="folder for checkpoints (step=N.ckpt, N = steps / 2)")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps in all")
    p.add_argument("--resume", default=None, help="a checkpoint in --out")
    a = p.parse_args(argv)
    model = Bigram(TokenDataset(DataConfig(manifest=a.shards, seq_len=64, micro_batch_size=2, pack_window=1)))
    keep = ModelCheckpoint(dirpath=a.out, filename="{step}", every_n_train_steps=a.steps // 2, save_top_k=-1)
    trainer = L.Trainer(max_steps=a.steps, accelerator="cpu", devices=1, logger=False, callbacks=[keep],
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, StatefulDataLoader(model.loader, batch_size=None, num_workers=2), ckpt_path=a.resume)
    print(json.dumps(model.seen))
    return model.seen


if __name__ == "__main__":
    run(main)
