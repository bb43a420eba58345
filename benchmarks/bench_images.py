"""Images/s: DALI (CPU operators) against a PIL + numpy augmentation loop, same images, same ops.

Both decode the JPEGs of the bundled image set (:mod:`examples.demo.imageset`), take a random
resized crop (area 8-100 %, aspect 3/4-4/3) resized bilinearly to ``crop x crop``, flip
horizontally with p = 0.5 and normalise to float32 CHW with the ImageNet mean/std. The
baseline runs in this process with ``--threads`` threads (PIL releases the GIL while
decoding and resizing); DALI uses the same number of threads. DALI runs twice: decode then
``fn.random_resized_crop`` (the ops as specified), and ``fused_crop`` (decode only the crop
window, then resize: same crop distribution, less decoding). Reported per contender: the
median over interleaved rounds of images per wall-clock second and of images per CPU
second (all threads of the process; steadier on a shared machine). torchvision is not used:
its PyPI wheels do not install beside the pinned CPU torch 2.13.

Run: ``python benchmarks/bench_images.py [--images 1024] [--rounds 3] [--size 384] [--crop 224] [--threads 2]``
"""
from __future__ import annotations

import argparse
import io
import itertools
import json
import math
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from loaders.images.dali import CROP_AREA, CROP_ASPECT, MEAN, STD, DaliImageLoader, cuda_device_count  # noqa: E402
from examples.demo.imageset import build_image_shards  # noqa: E402
from shards import iter_raw  # noqa: E402

MEAN_A = np.array(MEAN, dtype=np.float32).reshape(3, 1, 1)
INV_STD_A = 1.0 / np.array(STD, dtype=np.float32).reshape(3, 1, 1)


def random_resized_crop_box(w: int, h: int, rng: np.random.Generator) -> tuple[int, int, int, int]:
    """Crop box ``(x0, y0, x1, y1)`` as in torchvision's RandomResizedCrop (10 tries, then centre)."""
    area = w * h
    log_lo, log_hi = math.log(CROP_ASPECT[0]), math.log(CROP_ASPECT[1])
    for _ in range(10):
        target = area * rng.uniform(*CROP_AREA)
        ratio = math.exp(rng.uniform(log_lo, log_hi))
        cw, ch = round(math.sqrt(target * ratio)), round(math.sqrt(target / ratio))
        if 0 < cw <= w and 0 < ch <= h:
            x0, y0 = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
            return x0, y0, x0 + cw, y0 + ch
    side = min(w, h)
    return (w - side) // 2, (h - side) // 2, (w - side) // 2 + side, (h - side) // 2 + side


def pil_augment(data: bytes, crop: int, rng: np.random.Generator) -> np.ndarray:
    """Decode + random resized crop + flip + normalise → float32 ``[3, crop, crop]``."""
    with Image.open(io.BytesIO(data)) as im:
        img = im.convert("RGB")
    img = img.resize((crop, crop), Image.Resampling.BILINEAR, box=random_resized_crop_box(img.width, img.height, rng))
    if rng.random() < 0.5:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return (np.asarray(img, dtype=np.float32).transpose(2, 0, 1) - MEAN_A) * INV_STD_A


def pil_batches(images: list[bytes], crop: int, batch: int, pool: ThreadPoolExecutor) -> Callable[[], None]:
    """One call = one batch of the PIL + numpy loop, stacked like a loader would."""
    rngs = [np.random.default_rng([0, t]) for t in range(batch)]
    pos = itertools.count()

    def step() -> None:
        idx = [next(pos) % len(images) for _ in range(batch)]
        np.stack(list(pool.map(lambda i: pil_augment(images[idx[i]], crop, rngs[i]), range(batch))))
    return step


def dali_batches(shards: list[str], crop: int, batch: int, threads: int, device_id,
                 fused: bool = False) -> Callable[[], None]:
    """One call = one batch of :class:`DaliImageLoader` (as torch tensors)."""
    dl = DaliImageLoader(shards, batch_size=batch, crop=crop, seed=0, device_id=device_id, num_threads=threads,
                         fused_crop=fused)
    return dl.next_batch


def images_per_s(step: Callable[[], None], n: int, batch: int) -> tuple[float, float]:
    """``(images per wall second, images per CPU second of this process, all threads)``."""
    steps = max(1, n // batch)
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        step()
    return steps * batch / (time.perf_counter() - t0), steps * batch / (time.process_time() - c0)


def main() -> None:
    """Time DALI (CPU) against the PIL + numpy baseline in interleaved rounds and print images/s and ratios."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=1024, help="images timed per contender and round")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the median is reported")
    p.add_argument("--size", type=int, default=384, help="longer side of the stored pictures, px")
    p.add_argument("--crop", type=int, default=224)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("--json", default="", help="write images/s per contender to this file")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(a.threads) as pool:
        info = build_image_shards(tmp, samples_per_shard=64, size=a.size, copies=4)
        images = [f["jpg"] for path in info.shards for _, f in iter_raw(path)]
        mean_px = np.mean([np.prod(Image.open(io.BytesIO(b)).size) for b in images])
        print(f"{len(images)} JPEGs, mean {mean_px / 1e3:.0f} kpx, crop {a.crop}, batch {a.batch}, {a.threads} threads, "
              f"{a.images} images x {a.rounds} interleaved rounds per contender (median)")
        contenders = {
            "PIL + numpy": pil_batches(images, a.crop, a.batch, pool),
            "DALI cpu": dali_batches(info.shards, a.crop, a.batch, a.threads, None),
            "DALI cpu, ROI-decode crop": dali_batches(info.shards, a.crop, a.batch, a.threads, None, fused=True),
        }
        if cuda_device_count() > 0:
            contenders["DALI mixed/gpu"] = dali_batches(info.shards, a.crop, a.batch, a.threads, 0)
        for step in contenders.values():  # warm-up: threads, allocations, page cache
            step(), step()
        rates = {name: [] for name in contenders}
        for _ in range(a.rounds):
            for name, step in contenders.items():
                rates[name].append(images_per_s(step, a.images, a.batch))
        base = [statistics.median(x[i] for x in rates["PIL + numpy"]) for i in (0, 1)]
        record = {}
        for name, r in rates.items():
            wall, cpu = (statistics.median(x[i] for x in r) for i in (0, 1))
            record[name] = {"images_per_s": wall, "images_per_cpu_s": cpu, "vs_pil": wall / base[0]}
            print(f"{name:27s} {wall:7.1f} images/s (ratio / PIL {wall / base[0]:.2f}x; rounds "
                  f"{', '.join(f'{x[0]:.0f}' for x in r)})   {cpu:7.1f} images/CPU-s (ratio {cpu / base[1]:.2f}x)")
        if a.json:
            with open(a.json, "w", encoding="utf-8") as f:
                json.dump({"images": a.images, "crop": a.crop, "batch": a.batch, "threads": a.threads,
                           "contenders": record}, f, indent=1)


if __name__ == "__main__":
    main()
