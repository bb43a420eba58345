"""The ``sentencepiece`` kind: a ``.model`` file (Kudo & Richardson 2018), trained by the pipeline or given."""
from __future__ import annotations

import numpy as np

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


def read(path: str, data: bytes) -> TokenizerFile:
    """The :class:`TokenizerFile` of a ``.model`` file's bytes (checked by loading it).

    Raises:
        TokenizerError: sentencepiece cannot load it.
    """
    file = TokenizerFile(KIND, FILE_NAME, data)
    SentencePieceTokenizer(file)
    return file
