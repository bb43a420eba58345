"""A small real image set from the images bundled with scikit-image and scikit-learn.

Every ``.png``/``.jpg`` file shipped in ``skimage.data.data_dir`` (astronaut, camera,
chelsea, coffee, ...) plus scikit-learn's two sample photos (``china.jpg``,
``flower.jpg``) — about 28 pictures, no download. The label is the image's name: class
index = position of the name in the sorted list of names; the caption is the name in words.

To get a few dozen samples, each picture yields ``copies`` samples: copy 0 is the whole
picture, the others are deterministic crops (a seeded numpy generator picks the box and
whether to mirror it). Each sample is resized so its longer side is ``size`` pixels and
stored as JPEG (quality 90) or PNG.

A sample with key ``K`` is written by :func:`shards.encode_image_sample` as members
``K.jpg`` (or ``K.png``), ``K.cls`` (class index as ASCII digits), ``K.txt`` (caption) and
``K.json`` (``caption``, ``name``, ``source``, ``copy``, ``width``, ``height``); keys are
``{name}-{copy:02d}``. ``manifest.json`` (tokens 0) and ``classes.txt`` (one name per
line, line number = class index) go beside the shards.

CLI: ``python -m examples.demo.imageset --out DIR [--samples-per-shard N] [--size PX] [--copies K]``
"""
from __future__ import annotations

import argparse
import io
import os
from dataclasses import dataclass

import numpy as np
from PIL import Image
from tqdm import tqdm

from colaflow.errors import run_cli
from shards import Manifest, ShardSequenceWriter, encode_image_sample, escape_key

IMAGE_EXTS = (".png", ".jpg")
JPEG_QUALITY = 90
CROP_SEED = 1234  # fixed: the image set is a dataset, not an experiment knob
MIN_CROP_FRACTION = 0.5  # side of a crop as a fraction of the picture's side, at least


@dataclass(frozen=True)
class BundledImage:
    """One source picture.

    Attributes:
        name: label name, the file name without extension (e.g. ``astronaut``).
        path: absolute path of the file inside the installed package.
        source: ``skimage`` or ``sklearn``.
    """

    name: str
    path: str
    source: str


@dataclass(frozen=True)
class ImageSetInfo:
    """What :func:`build_image_shards` wrote.

    Attributes:
        manifest: path of ``manifest.json``.
        classes: label names; index = class id.
        samples: samples written.
        shards: shard file paths in order.
    """

    manifest: str
    classes: list[str]
    samples: int
    shards: list[str]


def bundled_images() -> list[BundledImage]:
    """The image files bundled in scikit-image and scikit-learn, sorted by name.

    Raises:
        RuntimeError: fewer than two images were found (package data missing).
    """
    import skimage.data
    import sklearn.datasets

    found = []
    for f in os.listdir(skimage.data.data_dir):
        stem, ext = os.path.splitext(f)
        if ext in IMAGE_EXTS:
            found.append(BundledImage(stem, os.path.join(skimage.data.data_dir, f), "skimage"))
    sk_dir = os.path.join(os.path.dirname(sklearn.datasets.__file__), "images")
    for f in ("china.jpg", "flower.jpg"):  # what sklearn.datasets.load_sample_images() reads
        if os.path.exists(os.path.join(sk_dir, f)):
            found.append(BundledImage(os.path.splitext(f)[0], os.path.join(sk_dir, f), "sklearn"))
    if len(found) < 2:
        raise RuntimeError("no bundled images found: reinstall scikit-image and scikit-learn "
                           "(`pip install scikit-image scikit-learn`)")
    return sorted(found, key=lambda b: b.name)


def caption_of(name: str) -> str:
    """Caption from an image name, e.g. ``motorcycle_left`` → ``a picture of motorcycle left``."""
    return "a picture of " + name.replace("_", " ").lower()


def load_rgb(path: str) -> Image.Image:
    """Open an image file as 8-bit RGB (grey and alpha pictures are converted; alpha dropped)."""
    with Image.open(path) as im:
        return im.convert("RGB")


def _variant(img: Image.Image, copy: int, rng: np.random.Generator) -> Image.Image:
    if copy == 0:
        return img
    w, h = img.size
    frac = rng.uniform(MIN_CROP_FRACTION, 1.0)
    cw, ch = max(1, int(w * frac)), max(1, int(h * frac))
    x0, y0 = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
    out = img.crop((x0, y0, x0 + cw, y0 + ch))
    return out.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if rng.random() < 0.5 else out


def _fit(img: Image.Image, size: int) -> Image.Image:
    scale = size / max(img.size)
    if scale >= 1.0:
        return img
    return img.resize((max(1, round(img.width * scale)), max(1, round(img.height * scale))),
                      Image.Resampling.BILINEAR)


def encode_image(img: Image.Image, ext: str) -> bytes:
    """Encode an RGB image as ``jpg`` (quality 90, no EXIF) or ``png`` bytes; deterministic."""
    buf = io.BytesIO()
    if ext == "jpg":
        img.save(buf, format="JPEG", quality=JPEG_QUALITY)
    elif ext == "png":
        img.save(buf, format="PNG")
    else:
        raise ValueError(f"unsupported image extension {ext!r} (use 'jpg' or 'png')")
    return buf.getvalue()


def build_image_shards(out_dir: str, samples_per_shard: int = 32, size: int = 256, copies: int = 4,
                       ext: str = "jpg", prefix: str = "images") -> ImageSetInfo:
    """Write the bundled image set as shards + ``manifest.json`` + ``classes.txt`` into ``out_dir``.

    Output is byte-identical across runs for the same arguments and package versions.
    Samples are ordered copy-major (all pictures' copy 0, then copy 1, ...), so every
    shard mixes classes.

    Args:
        out_dir: folder to write (created).
        samples_per_shard: samples per shard (the last shard may hold fewer).
        size: longer side of every stored image, in pixels (smaller pictures are kept as is).
        copies: samples per picture (1 = whole pictures only).
        ext: ``jpg`` or ``png``.
        prefix: shard file name prefix (``{prefix}-000000.tar``).
    Returns:
        :class:`ImageSetInfo`.
    Raises:
        ValueError: ``copies`` < 1, ``size`` < 8, or an unsupported ``ext``.
    """
    if copies < 1 or size < 8:
        raise ValueError(f"need copies >= 1 and size >= 8 px, got copies={copies} size={size}")
    images = bundled_images()
    classes = [b.name for b in images]
    pictures = [load_rgb(b.path) for b in images]
    rngs = [np.random.default_rng([CROP_SEED, i]) for i in range(len(images))]
    writer = ShardSequenceWriter(out_dir, prefix=prefix, max_samples=samples_per_shard)
    total = len(images) * copies
    with tqdm(total=total, desc="image shards", unit="img") as bar:
        for copy in range(copies):
            for cls, (b, pic) in enumerate(zip(images, pictures)):
                img = _fit(_variant(pic, copy, rngs[cls]), size)
                meta = {"caption": caption_of(b.name), "name": b.name, "source": b.source,
                        "copy": copy, "width": img.width, "height": img.height}
                writer.write(escape_key(f"{b.name}-{copy:02d}"),
                             encode_image_sample(encode_image(img, ext), ext, cls=cls, caption=meta["caption"], meta=meta))
                bar.update()
    infos = writer.close()
    manifest_path = Manifest(shards=infos).save(out_dir)
    with open(os.path.join(out_dir, "classes.txt"), "w", encoding="utf-8") as f:
        f.write("".join(c + "\n" for c in classes))
    print(f"wrote {total} samples ({len(classes)} classes) in {len(infos)} shards to {out_dir}")
    return ImageSetInfo(manifest_path, classes, total, [os.path.join(out_dir, s.name) for s in infos])


def main(argv: list[str] | None = None) -> int:
    """``python -m examples.demo.imageset --out DIR``: write the bundled pictures as image shards (see
    :func:`build_image_shards`); returns 0."""
    p = argparse.ArgumentParser(prog="python -m examples.demo.imageset", description="Write the bundled scikit-image/scikit-learn pictures as image shards.")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--samples-per-shard", type=int, default=32)
    p.add_argument("--size", type=int, default=256, help="longer side in pixels")
    p.add_argument("--copies", type=int, default=4, help="samples per picture (whole + crops)")
    p.add_argument("--ext", choices=("jpg", "png"), default="jpg")
    a = p.parse_args(argv)
    build_image_shards(a.out, a.samples_per_shard, a.size, a.copies, a.ext)
    return 0


if __name__ == "__main__":
    run_cli(main)
