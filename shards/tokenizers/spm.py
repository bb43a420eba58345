"""The ``sentencepiece`` kind: a ``.model`` file (Kudo & Richardson 2018), trained by the pipeline or given."""
from __future__ import annotations

import json
import os

import numpy as np

from shards.tokenizers.auto_form import CONFIG_NAME, TOKENIZER_CLASS, saved
from shards.tokenizers.contract import SpecialIds, TokenizerError, TokenizerFile

KIND = "sentencepiece"
FILE_NAME = "tokenizer.model"


class SentencePieceTokenizer:
    """A sentencepiece processor behind the :class:`~shards.tokenizers.contract.Tokenizer` contract.

    Args:
        file: the serialized model (``ModelProto`` bytes).

    Raises:
        TokenizerError: sentencepiece cannot load the bytes.
    """

    kind = KIND

    def __init__(self, file: TokenizerFile):
        import sentencepiece as spm  # imported by the kind that needs it

        self.file = file
        self._sp = spm.SentencePieceProcessor()
        try:
            self._sp.LoadFromSerializedProto(file.data)
        except (RuntimeError, TypeError) as e:
            raise TokenizerError(f"not a sentencepiece model ({e})") from None
        self.vocab_size = self._sp.get_piece_size()
        ids = (self._sp.bos_id(), self._sp.eos_id(), self._sp.pad_id())  # -1: the model has none
        self.special = SpecialIds(*(int(i) if i >= 0 else None for i in ids))
        self.adds_bos = False  # sentencepiece's encode adds no BOS unless asked

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Ids of each text (sentencepiece's batch encode)."""
        return self._sp.encode(texts)

    def decode(self, ids: np.ndarray | list[int]) -> str:
        """The text of ``ids`` (control tokens such as BOS/EOS decode to nothing)."""
        return self._sp.decode([int(i) for i in ids])

    def special_names(self) -> dict[str, str]:
        """``bos_token`` / ``eos_token`` / ``pad_token`` / ``unk_token`` -> piece, for those the model has."""
        ids = {"bos_token": self._sp.bos_id(), "eos_token": self._sp.eos_id(), "pad_token": self._sp.pad_id(),
               "unk_token": self._sp.unk_id()}
        return {key: self._sp.id_to_piece(i) for key, i in ids.items() if i >= 0}


def read(path: str, data: bytes) -> TokenizerFile:
    """The :class:`TokenizerFile` of a ``.model`` file's bytes (checked by loading it).

    Raises:
        TokenizerError: sentencepiece cannot load it.
    """
    file = TokenizerFile(KIND, FILE_NAME, data)
    SentencePieceTokenizer(file)
    return file


def auto_files(file: TokenizerFile) -> dict[str, bytes]:
    """``tokenizer.json`` and ``tokenizer_config.json`` for ``transformers.AutoTokenizer``: transformers'
    converter of ``.model`` files, which follows the model's own normaliser settings, so the result
    encodes as sentencepiece does (:func:`shards.tokenizers.auto_form.check` verifies it).

    Raises:
        TokenizerError: the model does not load.
    """
    from transformers import PreTrainedTokenizerFast

    names = SentencePieceTokenizer(file).special_names()

    def make(scratch: str):
        with open(os.path.join(scratch, FILE_NAME), "wb") as f:
            f.write(file.data)
        with open(os.path.join(scratch, CONFIG_NAME), "w", encoding="utf-8") as f:
            json.dump({"tokenizer_class": TOKENIZER_CLASS, **names}, f)
        return PreTrainedTokenizerFast.from_pretrained(scratch, local_files_only=True)

    return saved(make)
