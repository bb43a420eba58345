"""Checkpoint files are durable and a folder never looks finished while it is incomplete: meta.json,
config.yaml, COMPLETE and the parent folder are fsynced; a same-step re-save keeps a whole copy at
every instant; pruning never leaves a half-deleted folder that says COMPLETE; verification reads
the stored bytes (loader, RNG and trainer state included) without building a second model."""
import os

import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader

from trainer.checkpointing import storage as ckpt_mod
from trainer.checkpointing import COMPLETE, Checkpointer, list_checkpoints, restore
from trainer.checkpointing.verify import CheckpointVerifyError
from trainer.config import ModelConfig
from trainer.model import GPT

SMALL = ModelConfig(vocab_size=64, d_model=16, n_layers=1, n_heads=2, max_seq_len=16)


def _model():
    torch.manual_seed(0)
    model = GPT(SMALL)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.zeros(1, 8, dtype=torch.long), torch.arange(8)[None], torch.zeros(1, 8, dtype=torch.long),
          torch.ones(1, 8, dtype=torch.long)).backward()
    opt.step()
    return model, opt


def _folder(root, name):
    path = os.path.join(root, name)
    os.makedirs(path)
    for f in ("a.distcp", "meta.json", COMPLETE):
        open(os.path.join(path, f), "w").close()
    return path


def test_save_fsyncs_metadata_marker_and_parent(tmp_path, monkeypatch):
    synced, real = [], os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real(fd)
    monkeypatch.setattr(os, "fsync", fsync)
    model, opt = _model()
    root = str(tmp_path / "ckpt")
    path = Checkpointer(root, torch.device("cpu"), vocab_size=64, seq_len=16).save(1, model, opt, {"epoch": 0})
    tmp = os.path.join(root, ".step_000001.partial")
    for name in ("meta.json", "config.yaml", COMPLETE):
        assert os.path.join(tmp, name) in synced, synced
    assert synced.index(os.path.join(tmp, COMPLETE)) > synced.index(os.path.join(tmp, "meta.json"))
    assert synced[-1] == root and os.path.exists(os.path.join(path, COMPLETE))  # the rename is durable


def test_same_step_resave_keeps_a_whole_copy_when_cut_between_renames(tmp_path, monkeypatch):
    root = str(tmp_path)
    final, tmp = _folder(root, "step_000004"), _folder(root, ".step_000004.partial")
    open(os.path.join(final, "first"), "w").close()
    calls, real = [], os.replace

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError("killed between the renames")
        return real(src, dst)
    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OSError):
        ckpt_mod.publish(tmp, final)
    monkeypatch.setattr(os, "replace", real)
    assert os.path.exists(os.path.join(root, ".step_000004.old", "first"))  # moved aside, not deleted
    ckpt_mod.recover_root(root)
    assert sorted(os.listdir(root)) == ["step_000004"] and os.path.exists(os.path.join(final, "first"))
    assert list_checkpoints(root) == [final]


def test_pruning_cut_short_never_leaves_a_complete_half_folder(tmp_path, monkeypatch):
    root = str(tmp_path)
    old, new = _folder(root, "step_000002"), _folder(root, "step_000004")
    real = ckpt_mod.shutil.rmtree

    def rmtree(path, ignore_errors=False):
        os.remove(os.path.join(path, "a.distcp"))  # part of the folder is gone, then the process dies
        raise KeyboardInterrupt
    monkeypatch.setattr(ckpt_mod.shutil, "rmtree", rmtree)
    with pytest.raises(KeyboardInterrupt):
        ckpt_mod.retire(old)
    monkeypatch.setattr(ckpt_mod.shutil, "rmtree", real)
    assert list_checkpoints(root) == [new]
    ckpt_mod.recover_root(root)
    assert sorted(os.listdir(root)) == ["step_000004"]


def test_verification_checks_loader_state_from_the_stored_bytes(tmp_path):
    model, opt = _model()
    ck = Checkpointer(str(tmp_path / "ckpt"), torch.device("cpu"), vocab_size=64, seq_len=16)
    path = ck.save(3, model, opt, {"epoch": 1, "loader": {"position": list(range(200))}}, {"anomaly": {}})
    ck.verify(path)
    fresh = GPT(SMALL)
    restored = restore(path, fresh, torch.optim.AdamW(fresh.parameters()))
    assert restored.step == 3 and restored.loader_state["loader"]["position"][-1] == 199
    info = next(v for k, v in FileSystemReader(path).read_metadata().storage_data.items() if k.fqn == "loader")
    with open(os.path.join(path, info.relative_path), "r+b") as f:  # one byte inside the stored loader state
        f.seek(info.offset + 100)
        byte = f.read(1)
        f.seek(info.offset + 100)
        f.write(bytes([byte[0] ^ 0x01]))
    with pytest.raises(CheckpointVerifyError, match="loader") as err:
        ck.verify(path)
    assert ".distcp" in str(err.value)
