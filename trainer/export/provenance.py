"""Provenance stored in every exported model: where it came from, so a result can be reproduced."""
from __future__ import annotations

import hashlib
from importlib import metadata as importlib_metadata

import fsspec

from trainer.checkpointing.layout import git_commit, package_versions, read_meta

EXPORT_PACKAGES = ("onnx", "onnxscript", "onnxruntime", "transformers", "safetensors")


def file_sha256(url: str) -> str:
    """Hex SHA-256 of the bytes at ``url`` (local path or fsspec URL).

    Raises:
        FileNotFoundError: nothing at ``url``.
    """
    digest = hashlib.sha256()
    with fsspec.open(url, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def versions() -> dict:
    """Python, torch, numpy, colaflow and the export packages' versions (``"unknown"`` when absent)."""
    out = package_versions()
    for name in EXPORT_PACKAGES:
        try:
            out[name] = importlib_metadata.version(name)
        except importlib_metadata.PackageNotFoundError:
            out[name] = "unknown"
    return out


def provenance(checkpoint: str, config: dict, data_manifest: str | None, val_manifest: str | None) -> dict:
    """The provenance record of a model exported from ``checkpoint``.

    Keys: ``checkpoint`` (folder), ``step``, ``trained_git_commit`` (from the checkpoint's
    ``meta.json``), ``export_git_commit``, ``config`` (the training config), ``data_manifest`` and
    ``data_manifest_sha256`` (the training dataset's manifest file), ``validation_manifest`` and its
    ``validation_manifest_sha256``, ``init_from`` (the pretrained weights the run started from,
    ``{path, kind, sha256}``, from ``meta.json``; ``None`` for a random start), ``versions``
    (:func:`versions`). Manifests that are ``None`` (no validation data was reachable) get a ``None`` digest.
    """
    meta = read_meta(checkpoint)
    return {"checkpoint": checkpoint, "step": meta.get("step"), "trained_git_commit": meta.get("git_commit"),
            "export_git_commit": git_commit(), "init_from": meta.get("init_from"), "config": config,
            "data_manifest": data_manifest,
            "data_manifest_sha256": data_manifest and file_sha256(manifest_file(data_manifest)),
            "validation_manifest": val_manifest,
            "validation_manifest_sha256": val_manifest and file_sha256(manifest_file(val_manifest)),
            "versions": versions()}


def manifest_file(url: str) -> str:
    """``url`` itself when it names a ``.json`` file, else ``url/manifest.json`` (a dataset folder)."""
    return url if url.endswith(".json") else url.rstrip("/") + "/manifest.json"
