"""The ``hf`` export's parts: a Hugging Face Llama folder written with ``transformers`` and
``safetensors``, the tokenizer files that go with it, and the runners that check it.

The folder: ``config.json`` (:func:`trainer.llama.llama_config`), ``generation_config.json``,
``model.safetensors`` (or shards plus ``model.safetensors.index.json`` above
``ExportConfig.max_shard_size``, by ``save_pretrained``), the shard folder's ``tokenizer.json`` and
``tokenizer_config.json`` when it has them, and ``colaflow_provenance.json``. It loads offline with
``AutoModelForCausalLM.from_pretrained(folder)`` and ``AutoTokenizer.from_pretrained(folder)``.
"""
from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field

import numpy as np
import torch

from trainer.llama import SpecialIds, llama_config, to_hf

PROVENANCE_FILE = "colaflow_provenance.json"


@dataclass
class TokenizerFiles:
    """What the export copies from the shard folder: ``files`` (name → bytes) and the special ids of
    the manifest's ``tokenizer_identity``; ``note`` says why nothing was copied (``None`` when copied)."""

    files: dict = field(default_factory=dict)
    ids: SpecialIds = field(default_factory=SpecialIds)
    note: str | None = None


def tokenizer_files(data: str | None) -> TokenizerFiles:
    """The tokenizer files and special ids of the dataset at ``data`` (manifest URL or folder; ``None``
    when no data was reachable), the files encoding a prompt as its documents began (:func:`framed`). The
    pad id falls back to the eos id."""
    if data is None:
        return TokenizerFiles(note="no dataset reachable: exported without a tokenizer (pass --data DATASET)")
    from shards.format.manifest import Manifest
    from shards.tokenizers import auto_files_of_shards
    ident = Manifest.load(data).tokenizer_identity
    ids = SpecialIds() if ident is None else SpecialIds(
        ident.bos_id, ident.eos_id, ident.pad_id if ident.pad_id is not None else ident.eos_id)
    files = auto_files_of_shards(data)
    note = None if "tokenizer.json" in files else (
        f"{data} has no tokenizer.json (shards written before colaflow saved the transformers tokenizer "
        "files): exported without a tokenizer")
    if note is not None:
        return TokenizerFiles({}, ids, note)
    return TokenizerFiles(files if ident is None else framed(files, ident.bos_id if ident.add_bos else None), ids)


def framed(files: dict[str, bytes], bos_id: int | None) -> dict[str, bytes]:
    """``files`` (``tokenizer.json``, ``tokenizer_config.json``) set to encode a prompt as the training
    documents began (``tokenizer.add_bos`` may differ from the tokenizer's own convention).

    Args:
        files: the shard folder's transformers files, by name.
        bos_id: the id every document started with; ``None``: documents started with text.

    Returns:
        ``files`` whose ``tokenizer.json`` puts ``bos_id`` first and no EOS last (its post-processor is
        replaced only where it did otherwise: transformers follows it, not ``add_bos_token``), and whose
        ``tokenizer_config.json`` says the same in ``add_bos_token`` / ``add_eos_token``.
    """
    from tokenizers import Tokenizer, processors

    config = json.loads(files.get("tokenizer_config.json", b"{}"))
    files = {**files, "tokenizer_config.json": (json.dumps(
        {**config, "add_bos_token": bos_id is not None, "add_eos_token": False}, indent=2, sort_keys=True,
        ensure_ascii=False) + "\n").encode("utf-8")}
    tok = Tokenizer.from_str(files["tokenizer.json"].decode("utf-8"))
    if tok.encode("a").ids == ([] if bos_id is None else [bos_id]) + tok.encode("a", add_special_tokens=False).ids:
        return files
    bos = None if bos_id is None else tok.id_to_token(bos_id)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A" if bos else "$A", pair=f"{bos} $A {bos}:1 $B:1" if bos else "$A $B:1",
        special_tokens=[(bos, bos_id)] if bos else [])
    return {**files, "tokenizer.json": tok.to_str().encode("utf-8")}


def write_folder(model, folder: str, tokenizer: TokenizerFiles, record: dict, max_shard_size: str) -> None:
    """Write ``model`` (a fp32 :class:`trainer.model.GPT`) as a Hugging Face Llama folder at ``folder``.

    Args:
        model: the colaflow model; its weights are saved in float32.
        folder: created; must not exist yet.
        tokenizer: files to copy and the special ids the configs carry.
        record: provenance, written as ``colaflow_provenance.json``.
        max_shard_size: ``save_pretrained``'s shard limit (``"5GB"``, ``"200MB"``).

    Raises:
        trainer.llama.NotExpressible: the model's config has no Llama equivalent.
    """
    from transformers import GenerationConfig, LlamaForCausalLM
    cfg = model.cfg
    config = llama_config(cfg, tokenizer.ids, "float32")
    hf = LlamaForCausalLM(config)
    result = hf.load_state_dict(to_hf(model.state_dict(), cfg), strict=False)
    tied = {"lm_head.weight"} if cfg.tie_embeddings else set()
    if result.unexpected_keys or set(result.missing_keys) - tied:
        raise RuntimeError(f"weights do not map onto LlamaForCausalLM: missing {result.missing_keys}, "
                           f"unexpected {result.unexpected_keys}")
    ids = tokenizer.ids
    hf.generation_config = GenerationConfig(bos_token_id=ids.bos_id, eos_token_id=ids.eos_id, pad_token_id=ids.pad_id)
    with quiet():
        hf.save_pretrained(folder, max_shard_size=max_shard_size)
    # transformers 5 writes the weights' dtype as "dtype"; readers on transformers 4 look for "torch_dtype"
    path = os.path.join(folder, "config.json")
    with open(path, encoding="utf-8") as f:
        saved = json.load(f)
    saved["torch_dtype"] = "float32"
    with open(path, "w", encoding="utf-8") as f:
        json.dump(saved, f, indent=2, sort_keys=True)
        f.write("\n")
    for name, data in tokenizer.files.items():
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)
    with open(os.path.join(folder, PROVENANCE_FILE), "w", encoding="utf-8") as f:
        json.dump(record, f, indent=2, sort_keys=True, default=str)
    umask = os.umask(0)
    os.umask(umask)
    for name in os.listdir(folder):  # safetensors files come out owner-only; a server may run as another user
        os.chmod(os.path.join(folder, name), 0o666 & ~umask)


@contextlib.contextmanager
def quiet():
    """Hold back transformers' progress bars while it writes and loads (the export prints its own table)."""
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.enable_progress_bar()


def load_folder(folder: str, dtype: torch.dtype):
    """``AutoModelForCausalLM.from_pretrained(folder)`` in ``dtype``, offline, in eval mode."""
    from transformers import AutoModelForCausalLM
    with quiet():
        return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, local_files_only=True).eval()


def document_runner(hf_model):
    """A ``logits`` callable (numpy int64 ``[B, T]`` ids, positions, document ids → float32
    ``[B, T, vocab]``) running a transformers causal LM on each document of each row by itself,
    so it sees what colaflow's block-diagonal attention lets a token see."""
    def run(input_ids, position_ids, document_ids):
        b, t = input_ids.shape
        out = None
        with torch.no_grad():
            for r in range(b):
                starts = np.flatnonzero(np.r_[True, document_ids[r, 1:] != document_ids[r, :-1]])
                for s, e in zip(starts, np.r_[starts[1:], t]):
                    logits = hf_model(input_ids=torch.from_numpy(input_ids[r:r + 1, s:e]),
                                      position_ids=torch.from_numpy(position_ids[r:r + 1, s:e])).logits[0]
                    if out is None:
                        out = np.zeros((b, t, logits.shape[-1]), dtype=np.float32)
                    out[r, s:e] = logits.float().numpy()
        return out
    return run


def row_runner(hf_model):
    """A ``logits`` callable running whole rows through a transformers causal LM (as a server would;
    for latency, not parity: documents of a row see each other)."""
    def run(input_ids, position_ids, document_ids):
        with torch.no_grad():
            return hf_model(input_ids=torch.from_numpy(input_ids),
                            position_ids=torch.from_numpy(position_ids)).logits.float().numpy()
    return run


def greedy_hf(hf_model, prompt: list[int], new_tokens: int) -> list[int]:
    """``generate(do_sample=False)`` continuation of ``prompt`` (the folder's generation config: it
    stops at its eos id); returns the new ids."""
    with torch.no_grad():
        out = hf_model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                max_new_tokens=new_tokens, do_sample=False)
    return out[0, len(prompt):].tolist()
