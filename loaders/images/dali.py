"""Image loading with NVIDIA DALI: decode, random resized crop, flip, normalise — seeded and resumable.

The pipeline reads cached local image shards (``KEY.jpg`` + ``KEY.cls``) with DALI's
``fn.readers.webdataset`` through index files (:mod:`loaders.images.index`, which also
leaves undecodable samples out and counts them), then:

1. ``fn.decoders.image`` to RGB — ``device="mixed"`` (nvJPEG on the GPU) when a
   ``device_id`` is given, else ``"cpu"``;
2. ``fn.random_resized_crop`` to ``crop x crop``, area 8–100 %, aspect 3/4–4/3 (the
   "Inception" crop, Szegedy et al. 2015, *Going deeper with convolutions*);
3. ``fn.flip`` horizontally where ``fn.random.coin_flip`` says so (p = 0.5);
4. ``fn.crop_mirror_normalize`` to float32 CHW, ``(x - mean) / std`` with the ImageNet
   mean/std on the 0–255 scale.

Every random choice (shuffle buffer, crop boxes, flips) comes from the pipeline seed,
so the same arguments give the same batches. Resuming uses DALI's checkpointing
(``enable_checkpointing``): :meth:`DaliImageLoader.state_dict` stores the reader and RNG
state after the last batch handed out, and :meth:`DaliImageLoader.load_state_dict` rebuilds
the pipeline from it, so the next batch equals the one an uninterrupted run would give.
"""
from __future__ import annotations

import base64
import os
from typing import Iterator

import numpy as np
import torch
from nvidia.dali import backend, fn, pipeline_def, types
from nvidia.dali.pipeline import Pipeline

from loaders.images.index import IndexReport, ensure_indexes

AUTO = "auto"
READER = "Reader"
MEAN = [0.485 * 255, 0.456 * 255, 0.406 * 255]  # ImageNet RGB statistics, 0-255 scale
STD = [0.229 * 255, 0.224 * 255, 0.225 * 255]
CROP_AREA = (0.08, 1.0)
CROP_ASPECT = (3 / 4, 4 / 3)


def cuda_device_count() -> int:
    """CUDA devices DALI can see (0 without a driver or GPU)."""
    try:
        return backend.GetCUDADeviceCount()
    except RuntimeError:
        return 0


def default_device_id() -> int | None:
    """``0`` when CUDA is present, else ``None`` (CPU operators only)."""
    return 0 if cuda_device_count() > 0 else None


def pipeline_seed(seed: int, shard_id: int) -> int:
    """Per-rank pipeline seed from the run seed (ranks draw different crops; 31-bit for DALI)."""
    return int(np.random.SeedSequence([seed, shard_id]).generate_state(1)[0] & 0x7FFFFFFF)


@pipeline_def(enable_checkpointing=True)
def _image_pipeline(shard_paths, index_paths, crop, shard_id, num_shards, gpu, shuffle, initial_fill, image_ext,
                    fused_crop):
    jpegs, labels = fn.readers.webdataset(
        paths=shard_paths, index_paths=index_paths, ext=[image_ext, "cls"], name=READER,
        random_shuffle=shuffle, initial_fill=initial_fill, shard_id=shard_id, num_shards=num_shards,
        missing_component_behavior="error")
    device = "mixed" if gpu else "cpu"
    if fused_crop:  # decode only the crop window (ROI decoding), then resize
        images = fn.decoders.image_random_crop(jpegs, device=device, output_type=types.RGB,
                                               random_area=list(CROP_AREA), random_aspect_ratio=list(CROP_ASPECT))
        images = fn.resize(images, size=[crop, crop])
    else:
        images = fn.decoders.image(jpegs, device=device, output_type=types.RGB)
        images = fn.random_resized_crop(images, size=[crop, crop], random_area=list(CROP_AREA),
                                        random_aspect_ratio=list(CROP_ASPECT))
    images = fn.flip(images, horizontal=fn.random.coin_flip(probability=0.5))
    images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW", mean=MEAN, std=STD)
    return images, labels


def build_dali_image_pipeline(shard_paths: list[str], index_paths: list[str], batch_size: int, crop: int,
                              seed: int, shard_id: int = 0, num_shards: int = 1, device_id: int | None = None,
                              num_threads: int = 2, shuffle: bool = True, initial_fill: int = 256,
                              image_ext: str = "jpg", fused_crop: bool = False,
                              checkpoint: bytes | None = None) -> Pipeline:
    """Build the DALI image pipeline (see module docstring for the operators).

    Args:
        shard_paths: local tar shards; ``index_paths``: their index files, same length.
        batch_size: samples per batch (B); ``crop``: output side in pixels (H = W).
        seed: pipeline seed (shuffle, crop, flip); shard_id/num_shards: this rank's part of
            the samples (DALI splits the concatenated sample list into contiguous parts).
        device_id: CUDA device → mixed decoder + GPU operators; ``None`` → CPU only.
        shuffle: shuffle through a buffer of ``initial_fill`` samples.
        fused_crop: use ``fn.decoders.image_random_crop`` + ``fn.resize`` (same area and
            aspect ranges, decodes only the window) instead of decode + ``fn.random_resized_crop``.
        checkpoint: a DALI checkpoint (from ``Pipeline.checkpoint()``) to resume from.
    Returns:
        A built pipeline whose ``run()`` gives ``(images, labels)``: float32 ``[B, 3, crop, crop]``
        and the raw ``cls`` bytes per sample.
    Raises:
        RuntimeError: DALI cannot open a shard/index or use ``device_id``.
    """
    pipe = _image_pipeline(shard_paths, index_paths, crop, shard_id, num_shards, device_id is not None,
                           shuffle, initial_fill, image_ext, fused_crop, batch_size=batch_size, num_threads=num_threads,
                           device_id=device_id, seed=seed, checkpoint=checkpoint)
    pipe.build()
    return pipe


def _labels(tl) -> tuple[torch.Tensor, list[str]]:
    labels = np.array([int(np.asarray(tl[i]).tobytes()) for i in range(len(tl))], dtype=np.int64)
    # source_info is "<shard path>:<offset>:<member name>"; the key is the name up to its first dot
    keys = [tl[i].source_info().rsplit(":", 2)[-1].split(".", 1)[0] for i in range(len(tl))]
    return torch.from_numpy(labels), keys


def _images(tl) -> torch.Tensor:
    if isinstance(tl, backend.TensorListGPU):
        if torch.cuda.is_available():
            from nvidia.dali.plugin.pytorch import feed_ndarray
            out = torch.empty(tl.as_tensor().shape(), dtype=torch.float32, device="cuda")
            feed_ndarray(tl, out, cuda_stream=torch.cuda.current_stream())
            return out
        tl = tl.as_cpu()  # CPU-only torch build: hand the batch over in host memory
    return torch.from_numpy(np.array(tl.as_tensor()))


class DaliImageLoader:
    """Resumable torch-friendly iterator over image shards through DALI.

    ``for images, labels in loader`` yields one epoch of ``len(loader)`` batches:
    ``images`` float32 ``[B, 3, crop, crop]`` (normalised, CHW; on CUDA when torch and
    DALI both use the GPU, else on the CPU) and ``labels`` int64 ``[B]``. The sample keys
    of the last batch are in :attr:`last_keys`. DALI reads its samples as an endless
    stream, so an epoch is ``ceil(samples_of_this_rank / B)`` consecutive batches of it;
    a batch at an epoch boundary may hold samples of the next pass.

    Args:
        shard_paths: local (cached) shard files, in dataset order.
        batch_size, crop, shard_id, num_shards, num_threads, shuffle, initial_fill,
            image_ext, fused_crop: as in :func:`build_dali_image_pipeline`.
        seed: run seed; the pipeline seed is :func:`pipeline_seed` ``(seed, shard_id)``.
        device_id: ``"auto"`` (GPU 0 if CUDA is present, else CPU), an int, or ``None``.
        index_dir: where index files go (default: beside the shards).
        validate: decode every image once while indexing to leave bad ones out.
    Raises:
        ShardError / ValueError: see :func:`loaders.images.index.ensure_indexes`.
    """

    def __init__(self, shard_paths: list[str], batch_size: int = 32, crop: int = 224, seed: int = 0,
                 shard_id: int = 0, num_shards: int = 1, device_id: int | None | str = AUTO,
                 index_dir: str | None = None, num_threads: int = 2, shuffle: bool = True,
                 initial_fill: int = 256, image_ext: str = "jpg", fused_crop: bool = False,
                 validate: bool = True):
        self.device_id = default_device_id() if device_id == AUTO else device_id
        self.report: IndexReport = ensure_indexes(list(shard_paths), index_dir, image_ext, validate)
        self._args = dict(batch_size=batch_size, crop=crop, seed=pipeline_seed(seed, shard_id), shard_id=shard_id,
                          num_shards=num_shards, device_id=self.device_id, num_threads=num_threads,
                          shuffle=shuffle, initial_fill=initial_fill, image_ext=image_ext, fused_crop=fused_crop)
        n = self.report.samples
        rank_samples = n * (shard_id + 1) // num_shards - n * shard_id // num_shards
        self.batches_per_epoch = max(1, -(-rank_samples // batch_size))
        self.epoch = 0
        self.batch_in_epoch = 0
        self.last_keys: list[str] = []
        self._pipe = self._build(None)

    @classmethod
    def from_manifest(cls, manifest_dir: str, **kwargs) -> "DaliImageLoader":
        """Loader over the shards listed in a local ``manifest.json`` folder (e.g. the node cache)."""
        from shards import Manifest
        m = Manifest.load(manifest_dir)
        return cls([os.path.join(manifest_dir, s.name) for s in m.shards], **kwargs)

    def _build(self, checkpoint: bytes | None) -> Pipeline:
        return build_dali_image_pipeline(self.report.shards, self.report.indexes, checkpoint=checkpoint, **self._args)

    def _fingerprint(self) -> dict:
        return {**{k: v for k, v in self._args.items() if k not in ("device_id", "num_threads")},
                "shards": [os.path.basename(s) for s in self.report.shards]}

    def __len__(self) -> int:
        return self.batches_per_epoch

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the pipeline once: ``(images [B,3,crop,crop] float32, labels [B] int64)``; advances the position."""
        images, labels = self._pipe.run()
        self.batch_in_epoch += 1
        if self.batch_in_epoch == self.batches_per_epoch:
            self.epoch, self.batch_in_epoch = self.epoch + 1, 0
        label_tensor, self.last_keys = _labels(labels)
        return _images(images), label_tensor

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The rest of the current epoch (all of it when starting at its first batch)."""
        epoch = self.epoch
        while self.epoch == epoch:
            yield self.next_batch()

    def state_dict(self) -> dict:
        """Position after the last batch handed out: ``epoch``, ``batch_in_epoch``, ``batches``
        (total), ``dali_checkpoint`` (base64 text) and the settings it is valid for. JSON-serialisable."""
        return {"epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch,
                "batches": self.epoch * self.batches_per_epoch + self.batch_in_epoch,
                "dali_checkpoint": base64.b64encode(self._pipe.checkpoint()).decode("ascii"),
                "settings": self._fingerprint()}

    def load_state_dict(self, state: dict) -> None:
        """Resume at ``state`` (from :meth:`state_dict`); the next batch is the one that would have followed.

        Raises:
            ValueError: ``state`` was saved with other settings (seed, batch size, crop, shards, rank).
        """
        if state.get("settings") != self._fingerprint():
            raise ValueError(f"image loader state was saved with settings {state.get('settings')}, "
                             f"not {self._fingerprint()}; resume with the same config and shards")
        self._pipe = self._build(base64.b64decode(state["dali_checkpoint"]))
        self.epoch, self.batch_in_epoch = int(state["epoch"]), int(state["batch_in_epoch"])
        self.last_keys = []
