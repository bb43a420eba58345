"""Issue 37: token ids outside the model's vocabulary stop training and evaluation with one clear
error naming the batch's documents (they used to reach the embedding and end in an IndexError)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from loaders import build_text_loader
from loaders.config import DataConfig
from shards.format.tokens import TokenRangeError
from tests.support.data import write_counting_shards
from trainer.config import TrainConfig
from trainer.distributed.parallel import DistInfo
from trainer.evaluation.validation import Evaluator
from trainer.train import micro_batches


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("ids"))
    write_counting_shards(path, 12, max_samples=6, vocab=64, max_len=30, seed=0)  # ids 0..63
    return path


def test_training_batches_are_checked_against_the_model_vocabulary(shards):
    data = DataConfig(manifest=shards, seq_len=32, micro_batch_size=2, num_workers=0)
    _, batch = next(micro_batches(build_text_loader(data, in_process=True), 0, 64))
    assert int(batch.input_ids.max()) < 64
    with pytest.raises(TokenRangeError, match=r"training batch of doc\d{4}.*: token id \d+ is outside the vocabulary "
                                              r"of 40"):
        for _ in zip(range(20), micro_batches(build_text_loader(data, in_process=True), 0, 40)):
            pass


def test_validation_batches_are_checked_against_the_model_vocabulary(shards):
    cfg = TrainConfig()
    cfg.model.vocab_size, cfg.data = 40, dataclasses.replace(cfg.data, seq_len=32, micro_batch_size=2)
    validation = Evaluator(cfg, DistInfo(0, 1, 0, torch.device("cpu")), shards)
    with pytest.raises(TokenRangeError, match=f"{shards}: validation batch of doc"):
        list(validation.batches())


def test_a_batch_in_range_never_has_its_keys_read(shards):
    """Each training batch used to decode its keys for an error message it did not raise: loader
    workers had to gather every batch's document ids for it."""
    data = DataConfig(manifest=shards, seq_len=32, micro_batch_size=2, num_workers=0)
    read = []
    for _, batch in micro_batches(build_text_loader(data, in_process=True), 0, 64):
        keys = batch.keys
        assert keys._keys is None  # not decoded by the check
        read.append(batch)
        if len(read) == 3:
            break
    assert len(read) == 3 and read[0].keys[0].startswith("doc")
