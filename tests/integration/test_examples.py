"""The framework examples (``examples/``) run a few steps each on CPU, on learnable shards, and their
resume is checked: the steps after a resume see the batches (and losses) of the uninterrupted run.
torchtitan-style: 2 gloo ranks under torchrun, with no rank arguments, read disjoint documents."""
from __future__ import annotations

import ast
import itertools
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from loaders import DataConfig, TokenDataset
from tests.support.data import write_counting_shards
from tests.support.paths import REPO

VOCAB = 64


@pytest.fixture(scope="module")
def counting(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("counting"))
    write_counting_shards(d, 120, max_samples=40, vocab=VOCAB, max_len=60, seed=0)
    return d


def test_plain_loop_resumes_with_the_batches_it_would_have_had(counting, tmp_path):
    from examples import plain_loop
    ckpt = str(tmp_path / "plain.pt")
    whole = plain_loop.main(["--shards", counting, "--steps", "8", "--save-at", "4", "--ckpt", ckpt])
    resumed = plain_loop.main(["--shards", counting, "--steps", "8", "--resume", ckpt])
    assert resumed == {"losses": whole["losses"][4:], "keys": whole["keys"][4:]}
    assert whole["losses"][-1] < whole["losses"][0]


def test_hf_trainer_loss_falls_over_30_steps_and_resumes(counting, tmp_path):
    from examples import hf_trainer
    out = str(tmp_path / "hf")
    losses = hf_trainer.main(["--shards", counting, "--out", out, "--steps", "30", "--save-steps", "15"])["losses"]
    assert len(losses) == 30
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.5
    shutil.rmtree(os.path.join(out, "checkpoint-30"))
    resumed = hf_trainer.main(["--shards", counting, "--out", out, "--steps", "30", "--save-steps", "15", "--resume"])
    assert resumed["losses"][15:] == pytest.approx(losses[15:], abs=1e-4)


def test_hf_trainer_labels_are_the_next_token_not_the_one_after(counting):
    """The example's batches: labels are the inputs unshifted (-100 at each document's first token and on
    padding), and the model's own loss on them is the loss on colaflow's shifted labels."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from examples import hf_trainer
    hf = list(itertools.islice(hf_trainer.dataset(counting), 4))
    native = list(itertools.islice(TokenDataset(DataConfig(manifest=counting, seq_len=64, micro_batch_size=4,
                                                           pack_window=1)), 4))
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64))
    for h, b in zip(hf, native):
        ids, pos, labels = h["input_ids"], h["position_ids"], h["labels"]
        real = labels != -100
        assert labels[real].equal(ids[real]) and real.equal(pos > 0)
        # counting documents: each target is its predecessor + 1 (mod VOCAB), i.e. the next token
        assert ((labels[:, 1:] - ids[:, :-1]) % VOCAB)[real[:, 1:]].eq(1).all()
        with torch.no_grad():
            out = model(**h)
        mine = F.cross_entropy(out.logits.flatten(0, 1), b.labels.flatten(), ignore_index=-100)
        torch.testing.assert_close(out.loss, mine)


def test_lightning_resumes_from_its_checkpoint(counting, tmp_path):
    from examples import lightning_fit
    args = ["--shards", counting, "--out", str(tmp_path), "--steps", "8"]
    whole = lightning_fit.main(args)
    resumed = lightning_fit.main(args + ["--resume", str(tmp_path / "step=4.ckpt")])
    assert resumed == {"losses": whole["losses"][4:], "keys": whole["keys"][4:]}


def test_lightning_takes_colaflow_text_loader_as_is_and_resumes(counting, tmp_path):
    """Lightning given colaflow's own ``TextLoader`` (no DataLoader) stores its state in the checkpoint."""
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    from examples.lightning_fit import Bigram
    from loaders import build_text_loader

    def fit(resume=None) -> dict:
        model = Bigram(build_text_loader(DataConfig(manifest=counting, seq_len=64, micro_batch_size=2, pack_window=1)))
        keep = ModelCheckpoint(dirpath=tmp_path, filename="{step}", every_n_train_steps=4, save_top_k=-1)
        L.Trainer(max_steps=8, accelerator="cpu", devices=1, logger=False, callbacks=[keep], enable_progress_bar=False,
                  enable_model_summary=False).fit(model, model.loader, ckpt_path=resume)
        return model.seen

    whole = fit()
    resumed = fit(str(tmp_path / "step=4.ckpt"))
    assert resumed == {"losses": whole["losses"][4:], "keys": whole["keys"][4:]}


def test_each_example_is_about_60_lines_of_code():
    """Each example reads in one go: at most 60 lines after its docstring (which shows how to run it)."""
    for name in ("plain_loop", "hf_trainer", "lightning_fit", "titan_loop"):
        text = (REPO / "examples" / f"{name}.py").read_text()
        code = len(text.splitlines()) - ast.parse(text).body[0].end_lineno
        assert code <= 60, f"examples/{name}.py: {code} lines after its docstring"


def _documents(seen: dict) -> set[tuple]:
    """The documents (chunks) in a rank's inputs, cut where the positions restart."""
    out = set()
    for rows, positions in zip(seen["inputs"], seen["positions"]):
        for row, pos in zip(rows, positions):
            starts = [i for i, p in enumerate(pos) if p == 0] + [len(pos)]
            out |= {tuple(row[a:b]) for a, b in zip(starts[:-1], starts[1:]) if b - a > 1}
    return out


def test_titan_loop_on_two_torchrun_ranks_reads_disjoint_documents_and_resumes(counting, tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    env.pop("WORLD_SIZE", None)

    def torchrun(*args):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
               "examples.titan_loop", "--shards", counting, "--out", str(tmp_path), "--steps", "8", *args]
        proc = subprocess.run(cmd, cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
        return [json.load(open(tmp_path / f"rank{r}.json")) for r in range(2)]

    whole = torchrun("--save-at", "4")
    assert all(len(r["losses"]) == 8 for r in whole)
    assert not _documents(whole[0]) & _documents(whole[1])  # no rank arguments, yet no document on both
    resumed = torchrun("--resume")
    for w, r in zip(whole, resumed):
        assert r["inputs"] == w["inputs"][4:] and r["losses"] == pytest.approx(w["losses"][4:], abs=1e-6)


@pytest.mark.parametrize("example,shards,status,message", [
    ("plain_loop", "{tmp}/missing", 1, "error: not found or unreachable: {tmp}/missing; check the path or URL"),
    ("hf_trainer --out {tmp}", "http://127.0.0.1:9/manifest.json", 2,
     "error: data.manifest=http://127.0.0.1:9/manifest.json is remote and no cache was given: pass cache=")])
def test_an_example_given_bad_shards_says_so_in_one_line(tmp_path, example, shards, status, message):
    """examples.run: missing data exits 1, a bad setting 2, each in one line on stderr (no traceback)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    module, *args = example.format(tmp=tmp_path).split()
    p = subprocess.run([sys.executable, "-m", f"examples.{module}", *args, "--shards", shards.format(tmp=tmp_path)],
                       cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == status and p.stderr.startswith(message.format(tmp=tmp_path)), p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
