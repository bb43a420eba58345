"""Checkpoint verification: per-tensor checksums and object digests (SHA-256 of the loader, trainer
and per-rank RNG state and the step, :func:`object_digests`) of what was saved, compared with the
same figures computed from the stored bytes (online, every save, one stored item in CPU memory at
a time), plus one forward pass (offline, ``python -m trainer verify``).

Checksum of a tensor: its elements' bit patterns read as integers ``w_i`` (uint8/int16/int32/int64
by element size) give ``(sum w_i, sum w_i * (i mod 65521 + 1))`` modulo 2^64, where ``i`` is the
element's index in the flattened FULL tensor. Both sums are additive over disjoint slices, so the
checksum of a tensor sharded on dim 0 (FSDP2 DTensors) is the all-reduced sum of its shards'
checksums — computed on the device, one all-reduce for the whole state — and equals the checksum
of the unsharded tensor that an offline, single-process check computes. The position weights
(Adler-32's modulus) make swapped or shifted elements visible, not only changed bytes.
"""
from __future__ import annotations

import hashlib
import io
import os
import pickle

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.tensor import DTensor

from trainer.checkpointing.layout import COMPLETE, exists, open_file, read_meta, storage_reader
from trainer.checkpointing.state import load_full_state
from trainer.evaluation.synthetic import synthetic_batch

_WORD = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_MOD = 65521
LOSS_RTOL = {"fp32": 1e-4, "bf16": 3e-2}  # offline forward pass vs the live loss in meta.json


class CheckpointVerifyError(RuntimeError):
    """A checkpoint failed verification; the message names the checkpoint, files and tensors."""


def flatten_tensors(state, prefix: str = "") -> dict[str, torch.Tensor]:
    """``{"a.b.c": tensor}`` for every tensor in nested dicts/lists (DCP's flattened key names)."""
    items = state.items() if isinstance(state, dict) else enumerate(state) if isinstance(state, list) else ()
    out = {}
    for k, v in items:
        key = f"{prefix}{k}"
        if torch.is_tensor(v):
            out[key] = v
        elif isinstance(v, (dict, list)):
            out.update(flatten_tensors(v, key + "."))
    return out


def tensor_checksum(t: torch.Tensor, elem_offset: int = 0) -> torch.Tensor:
    """``int64 [2]`` checksum (see module doc) of ``t``, whose first element sits at flat index
    ``elem_offset`` of the full tensor. Runs on ``t``'s device; no host sync."""
    flat = t.detach().contiguous().reshape(-1)
    if flat.numel() == 0:
        return torch.zeros(2, dtype=torch.int64, device=flat.device)
    words = flat.view(_WORD[flat.element_size()]).to(torch.int64)
    weights = (torch.arange(words.numel(), device=flat.device, dtype=torch.int64) + elem_offset) % _MOD + 1
    return torch.stack([words.sum(), (words * weights).sum()])


def _local_part(t: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Local shard of a DTensor and the flat index of its first element in the full tensor."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    _, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
    if any(offset[1:]):
        raise NotImplementedError(f"checksums support dim-0 sharding only, got placements {t.placements}")
    row = 1
    for n in t.shape[1:]:
        row *= n
    return t.to_local(), offset[0] * row if len(offset) else 0


def state_checksums(state: dict, device: torch.device) -> dict[str, list[int]]:
    """Checksums of every tensor of a (possibly sharded) state dict; collective when distributed.

    DTensor shards all contribute; a plain tensor held by several ranks (replicated) is counted
    once, by the lowest rank holding it. One ``all_gather_object`` of key names and one int64
    all-reduce of ``[n_tensors, 2]``. Returns ``{flattened key: [sum, weighted sum]}``.
    """
    flat = flatten_tensors(state)
    distributed = dist.is_initialized()
    rank = dist.get_rank() if distributed else 0
    plain = sorted(k for k, t in flat.items() if not isinstance(t, DTensor))
    gathered = [None] * dist.get_world_size() if distributed else [None]
    if distributed:
        dist.all_gather_object(gathered, (sorted(flat), plain))
    else:
        gathered = [(sorted(flat), plain)]
    keys = sorted({k for names, _ in gathered for k in names})
    owner = {}
    for r, (_, names) in enumerate(gathered):
        for k in names:
            owner.setdefault(k, r)
    out = torch.zeros(len(keys), 2, dtype=torch.int64, device=device)
    for i, k in enumerate(keys):
        t = flat.get(k)
        if t is None:
            continue
        if isinstance(t, DTensor):
            local, offset = _local_part(t)
            out[i] = tensor_checksum(local, offset).to(device)
        elif owner.get(k) == rank:
            out[i] = tensor_checksum(t).to(device)
    if distributed:
        dist.all_reduce(out)
    return dict(zip(keys, out.tolist()))


OBJECT_KEYS = ("step", "loader", "trainer")  # plus rng_rank<R>: top-level non-tensor state entries


def _is_object_key(key: str) -> bool:
    return key in OBJECT_KEYS or key.startswith("rng_rank")


def _digest(obj) -> str:
    return hashlib.sha256(obj if isinstance(obj, bytes) else pickle.dumps(obj)).hexdigest()


def object_digests(state: dict) -> dict[str, list[str]]:
    """SHA-256 of each top-level non-tensor entry of a state dict (step, loader, trainer, RNG);
    collective when distributed (one ``all_gather_object``). Returns ``{key: [digests]}``: the
    distinct values ranks hold for the key (DCP stores one of them)."""
    mine = {k: _digest(v) for k, v in state.items() if _is_object_key(k)}
    gathered = [None] * dist.get_world_size() if dist.is_initialized() else [None]
    if dist.is_initialized():
        dist.all_gather_object(gathered, mine)
    else:
        gathered = [mine]
    out: dict[str, set] = {}
    for d in gathered:
        for k, v in d.items():
            out.setdefault(k, set()).add(v)
    return {k: sorted(v) for k, v in out.items()}


def _read_item(path: str, info):
    with open_file(os.path.join(path, info.relative_path)) as f:
        f.seek(info.offset)
        data = f.read(info.length)
    if len(data) != info.length:
        raise EOFError(f"{len(data)} of {info.length} bytes")
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)


def _flat_offset(offsets, size) -> int:
    if any(offsets[1:]):
        raise NotImplementedError(f"checksums support dim-0 chunks only, got chunk offsets {tuple(offsets)}")
    row = 1
    for n in size[1:]:
        row *= n
    return offsets[0] * row if len(offsets) else 0


def stored_checksums(path: str, device: torch.device) -> tuple[dict[str, list[int]], dict[str, str], list[str]]:
    """Checksums of every tensor and digests of the top-level objects, from the bytes stored in DCP
    checkpoint ``path`` (a local folder or an fsspec URL); collective when distributed.

    Stored items are split round-robin over the ranks; each reads its items one at a time on the
    CPU (memory: the largest stored chunk) and adds each tensor chunk's checksum at its flat offset
    in the full tensor (module doc), then one int64 all-reduce and one ``all_gather_object``.
    Returns ``(checksums {key: [sum, weighted sum]}, digests {key: sha256}, unreadable
    ["FILE: KEY: error", ...])``.
    """
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    md = storage_reader(path).read_metadata()
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    keys = sorted(k for k, m in md.state_dict_metadata.items() if isinstance(m, TensorStorageMetadata))
    row = {k: i for i, k in enumerate(keys)}
    sums = torch.zeros(len(keys), 2, dtype=torch.int64)
    digests, bad = {}, []
    items = sorted(md.storage_data.items(), key=lambda kv: (kv[1].relative_path, kv[1].offset))
    for n, (index, info) in enumerate(items):
        if n % world != rank or not (index.fqn in row or _is_object_key(index.fqn)):
            continue
        try:
            obj = _read_item(path, info)
        except Exception as e:  # noqa: BLE001 - every unreadable item is reported by name
            bad.append(f"{os.path.join(path, info.relative_path)}: {index.fqn}: {type(e).__name__}: "
                       f"{str(e).splitlines()[0] if str(e) else ''}")
            continue
        if index.fqn in row:
            offset = _flat_offset(index.offset, md.state_dict_metadata[index.fqn].size)
            sums[row[index.fqn]] += tensor_checksum(obj, offset)
        else:
            digests[index.fqn] = _digest(obj)
    if dist.is_initialized():
        sums = sums.to(device)
        dist.all_reduce(sums)
        gathered = [None] * world
        dist.all_gather_object(gathered, (digests, bad))
        digests = {k: v for d, _ in gathered for k, v in d.items()}
        bad = [line for _, b in gathered for line in b]
    return dict(zip(keys, sums.tolist())), digests, sorted(bad)


def check_stored(path: str, name: str, checksums: dict, digests: dict, device: torch.device) -> None:
    """Compare checkpoint ``path`` as stored (disk or object store) with the ``checksums``/``digests`` taken of the live
    state at save time (:func:`state_checksums`, :func:`object_digests`); collective.

    Raises:
        CheckpointVerifyError: naming ``name`` and the unreadable or differing items and their files.
    """
    try:
        got, got_digests, unreadable = stored_checksums(path, device)
    except (OSError, ValueError, CheckpointException) as e:
        raise CheckpointVerifyError(f"checkpoint {name}: cannot read its DCP metadata ({last_line(e)})") from e
    if unreadable:
        raise CheckpointVerifyError(f"checkpoint {name}: {len(unreadable)} stored item(s) do not load:\n"
                                    + "\n".join(unreadable[:10]))
    bad = compare(checksums, got)
    if bad:
        raise CheckpointVerifyError(f"checkpoint {name}: {len(bad)} tensor(s) read back differ from "
                                    f"what was saved:\n{describe_mismatches(path, bad)}")
    odd = sorted(k for k, allowed in digests.items() if got_digests.get(k) not in allowed)
    if odd:
        raise CheckpointVerifyError(f"checkpoint {name}: state read back differs from what was saved "
                                    f"(step/loader/trainer/RNG):\n{describe_mismatches(path, odd)}")


def fixed_batch(vocab_size: int, seq_len: int):
    """The verification batch: two packed documents in one row, fixed seed (a ``TokenBatch``)."""
    half = max(2, seq_len // 2)
    return synthetic_batch([[half, seq_len - half]], seq_len, vocab=max(2, vocab_size), seed=1234)


def reference_loss(model, batch, device: torch.device, precision: str = "fp32", stage: int = 0) -> float:
    """Summed loss (nats) of ``model`` on ``batch`` without gradients; collective under FSDP/DDP.

    FSDP2 modules are resharded afterwards (stage 2 keeps parameters gathered after forward).
    """
    from torch.distributed.fsdp import FSDPModule

    from trainer.distributed import parallel
    with torch.no_grad(), parallel.autocast(device, precision, stage):
        loss = model(*(x.to(device) for x in (batch.input_ids, batch.position_ids, batch.document_ids,
                                              batch.labels)))
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()
    return float(loss)


def compare(expected: dict, got: dict) -> list[str]:
    """Keys whose checksums differ or that are missing on one side (sorted)."""
    return sorted(k for k in set(expected) | set(got) if list(expected.get(k, [])) != list(got.get(k, [])))


def files_of(path: str, keys) -> dict[str, list[str]]:
    """``{key: [.distcp files holding its chunks]}`` from the checkpoint's DCP metadata."""
    wanted, out = set(keys), {}
    try:
        storage = storage_reader(path).read_metadata().storage_data
    except Exception:  # unreadable metadata: the caller reports the keys without files
        return {}
    for index, info in storage.items():
        if index.fqn in wanted:
            out.setdefault(index.fqn, []).append(info.relative_path)
    return {k: sorted(set(v)) for k, v in out.items()}


def unreadable_items(path: str) -> list[str]:
    """Read every stored item of a DCP checkpoint one by one; describe those that fail to load.

    Returns ``["FILE: KEY: error", ...]`` (empty when every item deserialises).
    """
    try:
        storage = storage_reader(path).read_metadata().storage_data
    except Exception as e:
        return [f"{os.path.join(path, '.metadata')}: {e}"]
    bad = []
    for index, info in sorted(storage.items(), key=lambda kv: (kv[1].relative_path, kv[1].offset)):
        file = os.path.join(path, info.relative_path)
        try:
            with open_file(file) as f:
                f.seek(info.offset)
                data = f.read(info.length)
            if len(data) != info.length:
                raise EOFError(f"{len(data)} of {info.length} bytes")
            torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
        except Exception as e:
            bad.append(f"{file}: {index.fqn}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    return bad


def last_line(e: BaseException) -> str:
    """The last non-empty line of an exception's text (DCP wraps the cause in a traceback dump)."""
    lines = [line for line in str(e).splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def describe_mismatches(path: str, keys: list[str], limit: int = 10) -> str:
    """One line per mismatching tensor naming the files that hold it."""
    files = files_of(path, keys[:limit])
    lines = [f"  {k} (in {', '.join(os.path.join(path, f) for f in files.get(k, [])) or 'no stored file'})"
             for k in keys[:limit]]
    more = f"\n  ... and {len(keys) - limit} more" if len(keys) > limit else ""
    return "\n".join(lines) + more


def verify_offline(path: str, config_path: str | None = None) -> list[str]:
    """Verify a checkpoint in one process (no process group): load every tensor unsharded
    (``_EmptyStateDictLoadPlanner``, as ``dcp_to_torch_save`` does), compare checksums with
    ``meta.json``, run the fixed batch through an unsharded model built from the saved config
    (or ``config_path``) and compare its loss. Returns the problems found (empty = passed).
    """
    from colaflow.config import load_config
    from trainer.config import TrainConfig, read_saved_config
    from trainer.model import GPT
    problems = []
    if not exists(os.path.join(path, COMPLETE)):
        problems.append(f"{path}: no {COMPLETE} marker (an unfinished or unverified save)")
    try:
        meta = read_meta(path)
    except (OSError, ValueError) as e:
        return problems + [f"{path}: cannot read meta.json ({e}); not a colaflow checkpoint?"]
    try:
        state = load_full_state(path)
    except (Exception, CheckpointException) as e:
        found = unreadable_items(path)
        return problems + [f"{path}: loading failed: {type(e).__name__}: {last_line(e)}"] + found
    got = {k: tensor_checksum(t).tolist() for k, t in flatten_tensors(state).items()}
    bad = compare(meta.get("checksums", {}), got)
    if bad:
        problems.append(f"{path}: {len(bad)} tensor(s) differ from their saved checksums:\n"
                        + describe_mismatches(path, bad))
    saved = os.path.join(path, "config.yaml")
    cfg = load_config(TrainConfig, config_path) if config_path else read_saved_config(saved)
    if cfg.model.vocab_size == 0:  # a training YAML that takes the vocabulary from the manifest
        cfg.model.vocab_size = read_saved_config(saved).model.vocab_size
    ref = meta.get("verify", {})
    if "model" in state and "loss" in ref:
        model = GPT(cfg.model)
        try:
            model.load_state_dict(state["model"])
        except RuntimeError as e:
            return problems + [f"{path}: weights do not fit the model of the config: {e}"]
        model.eval()
        batch = fixed_batch(cfg.model.vocab_size, ref["seq_len"])
        loss = reference_loss(model, batch, torch.device("cpu"), cfg.precision, 0)
        rtol = LOSS_RTOL[cfg.precision]
        if not abs(loss - ref["loss"]) <= rtol * abs(ref["loss"]) + 1e-6:
            problems.append(f"{path}: forward pass on the fixed batch gives loss {loss!r}, the live model "
                            f"gave {ref['loss']!r} (tolerance {rtol:g} relative)")
    return problems


def main(argv: list[str] | None = None, prog: str = "python -m trainer verify") -> int:
    """``python -m trainer verify CKPT [--config FILE]``: :func:`verify_offline`; returns the exit code
    (0 passed, 1 failed: the problems are printed, 2 usage)."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog=prog, description="Verify a checkpoint offline.")
    parser.add_argument("checkpoint", help="checkpoint folder (step_XXXXXX or weights_XXXXXX)")
    parser.add_argument("--config", help="training config (default: the checkpoint's config.yaml)")
    args = parser.parse_args(argv)
    problems = verify_offline(args.checkpoint, args.config)
    if problems:
        print(f"FAILED: {args.checkpoint}", file=sys.stderr)
        for p in problems:
            print(p, file=sys.stderr)
        print("Resume from an older checkpoint (checkpoint.resume=PATH) or re-export from a good copy.",
              file=sys.stderr)
        return 1
    print(f"OK: {args.checkpoint} (every tensor matches its checksum; forward pass matches)")
    return 0
