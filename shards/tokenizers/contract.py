"""The tokenizer contract every kind meets, and the file that carries a tokenizer between stages."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np


class TokenizerError(ValueError):
    """A tokenizer file that no kind reads, or one that lacks what was asked of it (an EOS token
    with ``tokenizer.add_eos``); the message names the file and what to do."""


@dataclass(frozen=True)
class SpecialIds:
    """Ids of the tokens that mark documents, each ``None`` when the tokenizer has none.

    Attributes:
        bos: beginning of a document.
        eos: end of a document (written after every document when ``tokenizer.add_eos``).
        pad: padding (the trainer falls back to ``eos`` when there is none).
    """

    bos: int | None = None
    eos: int | None = None
    pad: int | None = None


@dataclass(frozen=True)
class TokenizerFile:
    """A tokenizer as bytes: what travels to Beam workers and is written beside the shards.

    Attributes:
        kind: the registry name (``sentencepiece``, ``hf``, ``tiktoken``).
        name: the file name in a shard folder (``tokenizer.model``, ``tokenizer.json``, ``tokenizer.tiktoken``).
        data: the file's bytes, in the kind's own format.
        extra: settings the file itself does not hold, saved as ``NAME.json`` beside it (tiktoken's
            split pattern and special tokens; an HF folder's special-token names); empty for none.
    """

    kind: str
    name: str
    data: bytes
    extra: dict = field(default_factory=dict)

    @property
    def sha256(self) -> str:
        """Hex sha256 of :attr:`data`: the fingerprint the manifest records."""
        return hashlib.sha256(self.data).hexdigest()


@runtime_checkable
class Tokenizer(Protocol):
    """What the pipeline, the shard tools and the trainer need of a tokenizer.

    Attributes:
        kind: the registry name.
        vocab_size: ids are ``0 <= id < vocab_size`` (special tokens included).
        special: the bos/eos/pad ids.
        adds_bos: the tokenizer's own convention: whether a document starts with BOS.
        file: the bytes it was built from.
    """

    kind: str
    vocab_size: int
    special: SpecialIds
    adds_bos: bool
    file: TokenizerFile

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Ids of each text, no special token added, through the library's batch call (its threads)."""
        ...

    def decode(self, ids: np.ndarray | list[int]) -> str:
        """The text of ``ids``; special tokens decode to nothing."""
        ...
