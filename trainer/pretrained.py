"""``model.init_from``: start a new run from pretrained weights (step 0, fresh optimizer).

One registry of sources, found by what ``PATH`` holds:

========== ======================================== ============================================
kind       PATH                                     sizes from / fingerprint (sha256 of)
========== ======================================== ============================================
hf         folder with ``config.json`` and           ``config.json`` (a Llama config) / every
           ``model.safetensors`` (or its sharded     ``config.json`` and ``*.safetensors`` byte,
           index): Hugging Face ``LlamaForCausalLM`` (``name sha256`` lines of each file)
pt         ``NAME.pt`` from ``python -m trainer       its ``provenance.config.model`` / the file
           export CKPT NAME.pt``
checkpoint a colaflow checkpoint folder              its ``config.yaml`` / its ``meta.json``
           (``step_*`` or ``weights_*``: only its    (which holds every tensor's checksum)
           model is read)
========== ======================================== ============================================

Every rank reads the sizes (small files); rank 0 alone reads the weights, checks every tensor's
name and shape against the model, and ``set_model_state_dict(full_state_dict=True,
broadcast_from_rank0=True)`` scatters them into the wrapped model (DDP, or FSDP2's shards).
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass

import torch

from trainer.config import ModelConfig

KINDS = ("hf", "pt", "checkpoint")


@dataclass
class Pretrained:
    """Where a run's initial weights come from.

    Attributes:
        kind: one of :data:`KINDS`.
        path: the absolute path given as ``model.init_from``.
        architecture: :meth:`ModelConfig.architecture` fields the weights have.
    """

    kind: str
    path: str
    architecture: dict

    def weights(self, cfg: ModelConfig) -> dict:
        """The full state dict for a ``GPT(cfg)`` (colaflow names, CPU tensors) read from :attr:`path`.

        Raises:
            ValueError: a tensor is missing or has another shape (one line naming it).
            OSError: the files cannot be read.
        """
        if self.kind == "hf":
            from safetensors.torch import load_file

            from trainer.llama import from_hf
            tensors: dict = {}
            for name in _safetensors_files(self.path):
                tensors.update(load_file(os.path.join(self.path, name)))
            return from_hf(tensors, cfg, self.path)
        if self.kind == "pt":
            return torch.load(self.path, map_location="cpu", weights_only=True)["model"]
        from trainer.checkpointing import load_full_state
        return load_full_state(self.path)["model"]

    def fingerprint(self) -> dict:
        """``{"path", "kind", "sha256"}`` for the run's provenance (reads every byte the table names)."""
        from trainer.export.provenance import file_sha256
        if self.kind == "pt":
            digest = file_sha256(self.path)
        elif self.kind == "checkpoint":
            digest = file_sha256(os.path.join(self.path, "meta.json"))
        else:
            names = ["config.json", *sorted(_safetensors_files(self.path))]
            lines = "".join(f"{n} {file_sha256(os.path.join(self.path, n))}\n" for n in names)
            digest = hashlib.sha256(lines.encode()).hexdigest()
        return {"path": self.path, "kind": self.kind, "sha256": digest}


def _safetensors_files(folder: str) -> list[str]:
    """The safetensors files of an HF folder: ``model.safetensors``, or those its index maps to.

    Raises:
        ValueError: neither is there (a ``pytorch_model.bin``-only folder, say).
    """
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index, encoding="utf-8") as f:
            return sorted(set(json.load(f)["weight_map"].values()))
    if os.path.exists(os.path.join(folder, "model.safetensors")):
        return ["model.safetensors"]
    raise ValueError(f"model.init_from={folder}: no model.safetensors or model.safetensors.index.json; load it "
                     "with transformers and save_pretrained() it again to get safetensors")


def open_source(path: str) -> Pretrained:
    """The :class:`Pretrained` at ``path`` with its architecture (small files only; no weights).

    Raises:
        ValueError: nothing there, a folder that is none of the kinds (no ``config.json``), not a
            Llama ``config.json``, or a feature colaflow does not implement (one line each).
    """
    from colaflow.config import from_dict
    path = os.path.abspath(path)
    where = f"model.init_from={path}"
    if not os.path.exists(path):
        raise ValueError(f"{where}: no such file or folder")
    if os.path.isfile(path):
        if not path.endswith(".pt"):
            raise ValueError(f"{where}: a file, but not a .pt export; give a Hugging Face folder, a .pt export or "
                             "a checkpoint folder")
        saved = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        config = (saved.get("provenance") or {}).get("config") if isinstance(saved, dict) else None
        if not config or "model" not in saved:
            raise ValueError(f"{where}: no model and provenance config inside; export it with python -m trainer "
                             "export CKPT NAME.pt")
        return Pretrained("pt", path, from_dict(ModelConfig, config.get("model")).architecture())
    if os.path.exists(os.path.join(path, "meta.json")) and os.path.exists(os.path.join(path, "config.yaml")):
        from trainer.config import read_saved_config
        return Pretrained("checkpoint", path, read_saved_config(os.path.join(path, "config.yaml")).model.architecture())
    config_file = os.path.join(path, "config.json")
    if not os.path.exists(config_file):
        raise ValueError(f"{where}: no config.json in this folder; a Hugging Face model folder holds config.json "
                         "and model.safetensors (a colaflow checkpoint folder: meta.json and config.yaml)")
    from trainer.llama import architecture_of
    try:
        with open(config_file, encoding="utf-8") as f:
            config = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{config_file}: not JSON ({e})") from None
    architecture = architecture_of(config, config_file)
    _safetensors_files(path)
    return Pretrained("hf", path, architecture)


def fill_sizes(cfg: ModelConfig, source: Pretrained) -> None:
    """Set the fields of ``cfg`` still at their defaults to the source's values; check the others.

    ``max_seq_len`` set by the config is kept (it sizes no tensor); ``ffn_hidden`` counts as set
    when ``ffn_mult`` was changed. ``cfg`` is validated again afterwards.

    Raises:
        ValueError: a set field differs from the source (all named, one line), or the filled
            sizes are invalid.
    """
    default, arch, differ = ModelConfig(), source.architecture, []
    for key, value in arch.items():
        if key == "ffn_hidden":
            unset = cfg.ffn_hidden == default.ffn_hidden and cfg.ffn_mult == default.ffn_mult
            have = cfg.ffn_width
        elif key == "n_kv_heads":
            unset, have = cfg.n_kv_heads == default.n_kv_heads, cfg.kv_heads
        else:
            unset, have = getattr(cfg, key) == getattr(default, key), getattr(cfg, key)
        if unset:
            setattr(cfg, key, value)
        elif have != value and key != "max_seq_len":
            differ.append(f"model.{key}={have!r} (the weights have {value!r})")
    if differ:
        raise ValueError(f"model.init_from={source.path}: {', '.join(differ)}; leave these at their defaults (they "
                         "are then taken from it) or set them to its values")
    cfg.validate()


def expected_shapes(cfg: ModelConfig) -> dict:
    """``{name: shape}`` of a ``GPT(cfg)`` state dict (built on the meta device: no memory)."""
    from trainer.model import GPT
    with torch.device("meta"):
        return {k: tuple(v.shape) for k, v in GPT(cfg).state_dict().items()}


def check_weights(state: dict, cfg: ModelConfig, where: str) -> None:
    """Raise ``ValueError`` (one line) when ``state`` lacks a tensor ``GPT(cfg)`` has, holds one it
    does not, or one of another shape."""
    want = expected_shapes(cfg)
    missing, extra = sorted(set(want) - set(state)), sorted(set(state) - set(want))
    wrong = [f"{k} {tuple(state[k].shape)} (need {want[k]})" for k in sorted(set(want) & set(state))
             if tuple(state[k].shape) != want[k]]
    if missing or extra or wrong:
        parts = [f"missing {', '.join(missing[:3])}" if missing else "", f"unexpected {', '.join(extra[:3])}"
                 if extra else "", f"shape {', '.join(wrong[:3])}" if wrong else ""]
        raise ValueError(f"{where}: the weights do not fit the model: {'; '.join(p for p in parts if p)}")


def load_into(model: torch.nn.Module, source: Pretrained, cfg: ModelConfig) -> None:
    """Copy the source's weights into ``model`` (DDP-wrapped or FSDP2-sharded, on every rank);
    collective. Rank 0 reads and checks them; the others receive them by broadcast.

    Raises:
        ValueError: rank 0 could not read or fit the weights (raised on every rank, same line).
    """
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    state, error = {}, [None]
    rank0 = not dist.is_initialized() or dist.get_rank() == 0
    if rank0:
        try:
            state = {k: v.to(torch.float32) for k, v in source.weights(cfg).items()}
            check_weights(state, cfg, f"model.init_from={source.path}")
        except (ValueError, OSError, RuntimeError) as e:
            error[0] = f"{e}" if isinstance(e, ValueError) else f"model.init_from={source.path}: {type(e).__name__}: {e}"
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(error, src=0)
    if error[0] is not None:
        raise ValueError(error[0])
    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
