"""The image path trains: bundled image shards → DALI (CPU operators here) → TinyCNN → AdamW.

Over 30 steps on the 28-class bundled image set the training loss must fall well below chance
(ln 28 = 3.33 nats) and the batch accuracy must rise. Seeded, so the run is repeatable; the margins
are about half of what a run shows (3.26 → 1.83 nats, accuracy 0 → 0.5 over the last 5 steps).
"""
import json
import math
import statistics

import pytest
import torch

from loaders.images.dali import cuda_device_count
from examples.demo.imageset import build_image_shards
from trainer.vision.train import VisionTrainConfig, num_classes, train_from_flags, train_vision


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    out = tmp_path_factory.mktemp("vision") / "shards"
    build_image_shards(str(out), samples_per_shard=32, size=96, copies=4)
    return out


def test_loss_falls_and_accuracy_rises(images, tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    records = train_from_flags(["--shards", str(images), "--steps", "30", "--metrics", str(metrics)])
    assert [r["step"] for r in records] == list(range(1, 31))
    with open(metrics) as f:
        assert [json.loads(line) for line in f] == records
    first = statistics.mean(r["loss"] for r in records[:5])
    last = statistics.mean(r["loss"] for r in records[-5:])
    assert abs(first - math.log(28)) < 0.5  # starts near chance
    assert last < first - 0.6, (first, last)
    acc_first = statistics.mean(r["accuracy"] for r in records[:5])
    acc_last = statistics.mean(r["accuracy"] for r in records[-5:])
    assert acc_last > acc_first + 0.2, (acc_first, acc_last)
    expected = "cuda" if torch.cuda.is_available() and cuda_device_count() > 0 else "cpu"
    assert all(r["images"] == 16 and r["device"] == expected for r in records)


def test_log_every_and_bad_input(images, tmp_path):
    records = train_vision(VisionTrainConfig(shards=str(images), steps=5, log_every=2))
    assert [r["step"] for r in records] == [2, 4, 5]
    assert num_classes(str(images)) == 28
    with pytest.raises(FileNotFoundError, match="classes.txt"):
        num_classes(str(tmp_path))
    with pytest.raises(ValueError, match="steps"):
        train_vision(VisionTrainConfig(shards=str(images), steps=0))
