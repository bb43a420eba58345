"""The Hugging Face ``Trainer`` on colaflow's packed rows: a small ``LlamaForCausalLM`` (built from a config,
nothing downloaded) fed ``TokenDataset`` batches in the ``hf`` format (unshifted labels, per-document
``position_ids``, so transformers keeps the packed documents apart).

    python -m examples.hf_trainer --shards runs/demo/shards --out /tmp/hf --steps 30
    python -m examples.hf_trainer --shards runs/demo/shards --out /tmp/hf --steps 30 --resume
"""
import argparse
import json

from torch.utils.data import DataLoader
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

from examples import run
from loaders import DataConfig, TokenDataset


class PackedTrainer(Trainer):
    """The ``Trainer`` batches what a dataset yields (``per_device_train_batch_size`` samples per batch);
    colaflow's batches are whole already, so they pass through as they are (``batch_size=None``)."""

    def get_train_dataloader(self) -> DataLoader:
        """The dataset's batches as they come (a whole batch per item)."""
        return DataLoader(self.train_dataset, batch_size=None, num_workers=self.args.dataloader_num_workers)


def dataset(shards: str) -> TokenDataset:
    """Packed rows of 64 tokens, 4 per batch, as ``model(**batch)`` takes them."""
    return TokenDataset(DataConfig(manifest=shards, seq_len=64, micro_batch_size=4, pack_window=1, format="hf"))


def main(argv=None) -> dict:
    """Train for ``--steps`` steps (checkpoints every ``--save-steps``); returns (and prints) the losses."""
    p = argparse.ArgumentParser(prog="python -m examples.hf_trainer",
                                description="The HF Trainer on colaflow's packed rows (a small LlamaForCausalLM).")
    p.add_argument("--shards", required=True, help="local shard folder (e.g. runs/demo/shards)")
    p.add_argument("--out", required=True, help="folder for checkpoints")
    p.add_argument("--steps", type=int, default=30, help="optimizer steps in all")
    p.add_argument("--save-steps", type=int, default=15, help="checkpoint every N steps")
    p.add_argument("--resume", action="store_true", help="go on from the newest checkpoint in --out")
    a = p.parse_args(argv)
    data = dataset(a.shards)
    config = LlamaConfig(vocab_size=data.sources.manifest.vocab_size, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
    args = TrainingArguments(output_dir=a.out, max_steps=a.steps, save_steps=a.save_steps, learning_rate=3e-3,
                             warmup_steps=3, logging_steps=1, report_to=[], use_cpu=True, seed=0,
                             dataloader_num_workers=2)
    trainer = PackedTrainer(model=LlamaForCausalLM(config), args=args, train_dataset=data)
    trainer.train(resume_from_checkpoint=a.resume or None)
    out = {"losses": [h["loss"] for h in trainer.state.log_history if "loss" in h]}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    run(main)
