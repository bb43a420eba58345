"""Where a run's weights and tokens come from, found before the model is built: the sizes of
``model.init_from`` and the data manifest's vocabulary and tokenizer. Torch-free without
``model.init_from``, so ``--dry-run`` checks them without loading torch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainer.config import TrainConfig

if TYPE_CHECKING:
    from trainer.pretrained import Pretrained


def resolve_vocab_size(cfg: TrainConfig) -> dict | None:
    """Fill ``model.vocab_size`` from the manifest when it is 0, check that a set one covers the
    data's token ids, and that the tokenizer beside the shards is the one that wrote them.

    Returns:
        ``{kind, sha256}`` of the tokenizer that wrote the data (kept in checkpoints' ``meta.json``),
        ``None`` for an older manifest that recorded none.

    Raises:
        ValueError: no vocabulary size anywhere, ``model.vocab_size`` below the manifest's, or the
            tokenizer file changed since the manifest was written (``shards.tokenizers.TokenizerError``).
    """
    from shards.format.manifest import Manifest
    from shards.tokenizers import of_shards
    url = cfg.data.mixture[0].get("manifest", "") if cfg.data.mixture else cfg.data.manifest  # sources share one
    manifest = Manifest.load(url)
    if manifest.tokenizer_identity is not None:  # older manifests recorded no fingerprint to check
        of_shards(url, manifest)
    vocab = manifest.vocab_size
    if cfg.model.vocab_size == 0:
        if vocab < 1:
            raise ValueError(f"{url}: manifest has no vocab_size; set model.vocab_size")
        cfg.model.vocab_size = vocab
    elif vocab > cfg.model.vocab_size and cfg.model.init_from:
        raise ValueError(f"the data's vocabulary ({vocab} in {url}) is larger than the embedding of "
                         f"model.init_from={cfg.model.init_from} ({cfg.model.vocab_size} rows): its token ids would not "
                         "fit; tokenize the data with that model's tokenizer")
    elif vocab > cfg.model.vocab_size:
        raise ValueError(f"model.vocab_size={cfg.model.vocab_size} is below the data's vocabulary ({vocab} in {url}): "
                         f"its token ids would not fit the embedding; set model.vocab_size={vocab} (or 0: the manifest's)")
    ident = manifest.tokenizer_identity
    return None if ident is None else {"kind": ident.kind, "sha256": ident.sha256}


def check_resume_tokenizer(meta: dict, tokenizer: dict | None, checkpoint: str) -> None:
    """Refuse to resume a run on data written by another tokenizer than its checkpoint's run read
    (the same ids would mean other text). Checkpoints of older runs, and older manifests, record
    none: nothing to compare.

    Args:
        meta: the checkpoint's ``meta.json``; ``tokenizer``: :func:`resolve_vocab_size`'s result.
    Raises:
        ValueError: both record a tokenizer file and their sha256 differ (one line).
    """
    before = meta.get("tokenizer") or {}
    if tokenizer is None or not before.get("sha256") or before["sha256"] == tokenizer.get("sha256"):
        return
    raise ValueError(f"{checkpoint} was trained on data tokenized by a {before.get('kind')} tokenizer "
                     f"(sha256 {before['sha256'][:12]}), but data.manifest's shards were tokenized by a "
                     f"{tokenizer.get('kind')} tokenizer (sha256 {str(tokenizer.get('sha256'))[:12]}): the same ids "
                     "would mean other text. Resume on the run's own data, or start a new run from these weights "
                     f"(model.init_from={checkpoint} in a fresh run_dir)")


@dataclass(frozen=True)
class Origins:
    """Where a run's weights and tokens come from, found before the model is built.

    Attributes:
        pretrained: the ``model.init_from`` weights, ``None`` without it.
        tokenizer: ``{kind, sha256}`` of the data's tokenizer (:func:`resolve_vocab_size`).
    """
    pretrained: Pretrained | None
    tokenizer: dict | None


def resolve_model(cfg: TrainConfig) -> Origins:
    """Complete ``cfg.model`` before the model is built: sizes from ``model.init_from`` (its small
    files only), then ``vocab_size`` from the manifest (:func:`resolve_vocab_size`).

    Raises:
        ValueError: see :func:`trainer.pretrained.open_source`, :func:`trainer.pretrained.fill_sizes`
            and :func:`resolve_vocab_size`.
    """
    source = None
    if cfg.model.init_from:
        from trainer import pretrained  # torch: its sources are torch files; a run without it needs none
        source = pretrained.open_source(cfg.model.init_from)
        pretrained.fill_sizes(cfg.model, source)
    return Origins(source, resolve_vocab_size(cfg))
