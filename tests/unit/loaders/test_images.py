"""Image path: bundled pictures → image shards → DALI (decode, crop, flip, normalise), seeded and resumable."""
from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from loaders.images.dali import MEAN, STD, DaliImageLoader, cuda_device_count
from examples.demo.imageset import build_image_shards, caption_of
from shards import Manifest, ShardError, TarShardWriter, iter_samples

SIZE, COPIES, PER_SHARD, CROP, B = 96, 2, 16, 32, 8
LOW = min((0 - m) / s for m, s in zip(MEAN, STD))
HIGH = max((255 - m) / s for m, s in zip(MEAN, STD))


@pytest.fixture(scope="module")
def imageset(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("images"))
    info = build_image_shards(out, samples_per_shard=PER_SHARD, size=SIZE, copies=COPIES)
    samples = [s for p in info.shards for s in iter_samples(p)]
    return info, samples


def loader(info, **kw) -> DaliImageLoader:
    args = dict(batch_size=B, crop=CROP, seed=5, device_id=None, initial_fill=32)
    return DaliImageLoader(info.shards, **{**args, **kw})


def test_image_set_holds_the_bundled_pictures_and_round_trips(imageset):
    info, samples = imageset
    assert {"astronaut", "camera", "chelsea", "coffee", "china", "flower"} <= set(info.classes)
    assert info.classes == sorted(info.classes) and len(info.classes) >= 20
    assert len(samples) == info.samples == len(info.classes) * COPIES
    assert len({s["__key__"] for s in samples}) == len(samples)
    for s in samples:
        assert s["cls"] == info.classes.index(s["json"]["name"])
        assert s["txt"] == s["json"]["caption"] == caption_of(s["json"]["name"])
        with Image.open(io.BytesIO(s["jpg"])) as im:
            assert im.format == "JPEG" and im.mode == "RGB"
            assert max(im.size) <= SIZE and im.size == (s["json"]["width"], s["json"]["height"])
    m = Manifest.load(info.manifest)
    assert m.total_samples == len(samples) and m.total_tokens == 0
    for sh in m.shards:
        data = open(os.path.join(os.path.dirname(info.manifest), sh.name), "rb").read()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (sh.bytes, sh.sha256)


def test_image_set_is_byte_identical_across_builds(tmp_path):
    a = build_image_shards(str(tmp_path / "a"), samples_per_shard=64, size=24, copies=2)
    b = build_image_shards(str(tmp_path / "b"), samples_per_shard=64, size=24, copies=2)
    assert [open(p, "rb").read() for p in a.shards] == [open(p, "rb").read() for p in b.shards]


def test_dali_batches_are_normalised_float_chw_with_the_shards_labels(imageset):
    info, samples = imageset
    label_of = {s["__key__"]: s["cls"] for s in samples}
    dl = loader(info)
    assert dl.device_id is None and len(dl) == -(-len(samples) // B)
    seen = 0
    for images, labels in dl:
        assert images.shape == (B, 3, CROP, CROP) and images.dtype == torch.float32
        assert labels.shape == (B,) and labels.dtype == torch.int64
        assert torch.isfinite(images).all()
        assert LOW - 1e-4 <= images.min() and images.max() <= HIGH + 1e-4
        assert images.std() > 0.1  # real pictures, not a constant fill
        assert labels.tolist() == [label_of[k] for k in dl.last_keys]
        seen += 1
    assert seen == len(dl) and dl.epoch == 1


def test_unshuffled_epoch_reads_every_sample_in_shard_order(imageset):
    info, samples = imageset
    dl = DaliImageLoader.from_manifest(os.path.dirname(info.manifest), batch_size=B, crop=CROP, device_id=None,
                                       shuffle=False)
    keys, labels = [], []
    for _, y in dl:
        keys += dl.last_keys
        labels += y.tolist()
    assert keys == [s["__key__"] for s in samples]
    assert labels == [s["cls"] for s in samples]


def test_ranks_read_disjoint_parts_that_cover_the_set(imageset):
    info, samples = imageset
    parts = []
    for rank in range(2):
        dl = loader(info, shuffle=False, shard_id=rank, num_shards=2, batch_size=4)
        keys = []
        for _ in dl:
            keys += dl.last_keys
        parts.append(keys)
    assert set(parts[0]).isdisjoint(parts[1])
    assert sorted(parts[0] + parts[1]) == sorted(s["__key__"] for s in samples)


def test_same_seed_same_batches_other_seed_other_batches(imageset):
    info, _ = imageset
    a, b, c = loader(info), loader(info), loader(info, seed=6)
    for _ in range(3):
        (xa, ya), (xb, yb), (xc, _) = a.next_batch(), b.next_batch(), c.next_batch()
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert not torch.equal(xa, xc)


@settings(max_examples=4, deadline=None)
@given(stop=st.integers(min_value=0, max_value=10))
def test_resume_gives_the_batches_of_an_uninterrupted_run(imageset, stop):
    info, _ = imageset
    straight = loader(info)
    expected = [straight.next_batch() for _ in range(stop + 3)]
    first = loader(info)
    for _ in range(stop):
        first.next_batch()
    state = json.loads(json.dumps(first.state_dict()))
    assert state["batches"] == stop and state["epoch"] == stop // len(first)
    resumed = loader(info)
    resumed.load_state_dict(state)
    assert (resumed.epoch, resumed.batch_in_epoch) == (first.epoch, first.batch_in_epoch)
    for x, y in expected[stop:]:
        rx, ry = resumed.next_batch()
        assert torch.equal(rx, x) and torch.equal(ry, y)


def test_roi_decode_crop_variant_is_seeded_and_resumable(imageset):
    info, _ = imageset
    straight = loader(info, fused_crop=True)
    expected = [straight.next_batch() for _ in range(3)]
    assert expected[0][0].shape == (B, 3, CROP, CROP) and LOW - 1e-4 <= expected[0][0].min()
    head = loader(info, fused_crop=True)
    head.next_batch()
    resumed = loader(info, fused_crop=True)
    resumed.load_state_dict(head.state_dict())
    for x, y in expected[1:]:
        rx, ry = resumed.next_batch()
        assert torch.equal(rx, x) and torch.equal(ry, y)


def test_resume_with_other_settings_is_refused(imageset):
    info, _ = imageset
    state = loader(info).state_dict()
    with pytest.raises(ValueError, match="same config"):
        loader(info, seed=99).load_state_dict(state)


def test_bad_samples_are_left_out_counted_and_dead_lettered(tmp_path, imageset):
    _, samples = imageset
    good = samples[0]["jpg"]
    shard = str(tmp_path / "mixed-000000.tar")
    with TarShardWriter(shard) as w:
        w.write("good1", {"jpg": good, "cls": b"1"})
        w.write("truncated", {"jpg": good[: len(good) // 3], "cls": b"2"})
        w.write("garbage", {"jpg": b"not an image at all", "cls": b"3"})
        w.write("nolabel", {"jpg": good})
        w.write("badlabel", {"jpg": good, "cls": b"three"})
        w.write("good2", {"jpg": good, "cls": b"4"})
    for _ in range(2):  # second time the index and its dead letters are reused
        dl = DaliImageLoader([shard], batch_size=2, crop=16, device_id=None, shuffle=False)
        assert dl.report.samples == 2
        assert sorted(r.key for r in dl.report.rejected) == ["badlabel", "garbage", "nolabel", "truncated"]
        _, labels = dl.next_batch()
        assert dl.last_keys == ["good1", "good2"] and labels.tolist() == [1, 4]
    dead = [json.loads(line) for line in open(shard[:-4] + ".checked.idx.rejected.jsonl")]
    assert {d["key"]: d["shard"] for d in dead} == {k: shard for k in ("truncated", "garbage", "nolabel", "badlabel")}
    assert any("missing member .cls" in d["reason"] for d in dead)


def test_unreadable_shard_is_a_clear_error(tmp_path, imageset):
    info, _ = imageset
    broken = str(tmp_path / "broken-000000.tar")
    with open(info.shards[0], "rb") as f, open(broken, "wb") as g:
        g.write(f.read()[:700])  # header of the first member, then the data stops
    with pytest.raises(ShardError, match="broken-000000.tar"):
        DaliImageLoader([broken], device_id=None)


@pytest.mark.gpu
@pytest.mark.skipif(cuda_device_count() == 0, reason="needs a CUDA device")
def test_gpu_mixed_decoder_batches_and_resume(imageset):
    info, _ = imageset
    dl = loader(info, device_id=0)
    batches = [dl.next_batch() for _ in range(3)]
    x, y = batches[0]
    assert x.shape == (B, 3, CROP, CROP) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert LOW - 1e-3 <= x.min().item() and x.max().item() <= HIGH + 1e-3
    head = loader(info, device_id=0)
    head.next_batch()
    resumed = loader(info, device_id=0)
    resumed.load_state_dict(head.state_dict())
    for x, y in batches[1:]:
        rx, ry = resumed.next_batch()
        assert torch.equal(rx.cpu(), x.cpu()) and torch.equal(ry, y)


def test_index_names_every_member_at_its_data_offset(imageset):
    info, _ = imageset
    dl = loader(info)
    with open(dl.report.indexes[0]) as f, tarfile.open(info.shards[0]) as tar:
        version, count = f.readline().split()
        rows = [line.split() for line in f]
        members = {m.name: m for m in tar}
    assert version == "v1.2" and int(count) == len(rows) == PER_SHARD
    for row in rows:
        for ext, offset, size, name in zip(*[iter(row)] * 4):
            assert name.endswith("." + ext)
            assert (members[name].offset_data, members[name].size) == (int(offset), int(size))
