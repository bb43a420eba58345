"""The one decoder of ``.npy[.zst]`` members (token arrays): the loader's hot path and
:func:`shards.format.sample.decode_member`.

One ``zstandard.ZstdDecompressor`` is reused (the writer stores the content size in each frame, so
``decompress`` sizes its output once), and the ``.npy`` header (NEP 1 / ``numpy.lib.format``) is only
checked, not evaluated: when it declares the expected dtype and a 1-D shape that matches the data
length, the array is a zero-copy ``np.frombuffer`` view after the header. Anything else (another
dtype or version, a malformed header) goes through ``np.load``, which accepts or rejects it.
"""
from __future__ import annotations

import io
import struct
from typing import Callable

import numpy as np
import zstandard

_MAGIC = b"\x93NUMPY"
_LEN_FORMAT = {1: "<H", 2: "<I", 3: "<I"}  # header-length field per .npy major version


class TokenDecoder:
    """Decode token members of one dataset.

    Args:
        dtype: the manifest's ``token_dtype`` (``uint16`` or ``uint32``): the fast path's dtype.
    """

    def __init__(self, dtype: str = "uint16"):
        self.dtype = np.dtype(dtype)
        self._descr = f"'descr': '{self.dtype.str}'"
        self._dctx = zstandard.ZstdDecompressor()

    def decompress(self, data: bytes | memoryview) -> bytes:
        """One zstd frame's content. Raises ``zstandard.ZstdError`` on corrupt input."""
        try:
            return self._dctx.decompress(data)
        except zstandard.ZstdError:
            # frames written without a content size need the streaming decoder
            return self._dctx.decompressobj().decompress(data)

    def tokens(self, suffix: str, data: bytes | memoryview) -> np.ndarray:
        """The 1-D token array of member ``suffix`` (``tokens.npy`` or ``tokens.npy.zst``).

        ``data``: the member's bytes (for ``.zst``, any buffer, e.g. a ``memoryview`` of a memory map).
        Returns a read-only array (a view of the decompressed bytes) on the fast path.
        Raises ``zstandard.ZstdError`` or ``ValueError`` on undecodable data.
        """
        raw = self.decompress(data) if suffix.endswith(".zst") else data
        return self.npy(raw)

    def npy(self, raw: bytes) -> np.ndarray:
        """Array of ``.npy`` bytes; fast path for a 1-D array of this dataset's dtype."""
        if raw[:6] == _MAGIC and raw[6] in _LEN_FORMAT:
            fmt = _LEN_FORMAT[raw[6]]
            at = 8 + struct.calcsize(fmt)
            start = at + struct.unpack_from(fmt, raw, 8)[0]
            n, rest = divmod(len(raw) - start, self.dtype.itemsize)
            header = raw[at:start].decode("latin1")
            if not rest and self._descr in header and f"'shape': ({n},)" in header:
                return np.frombuffer(raw, self.dtype, n, start)
        return np.load(io.BytesIO(raw), allow_pickle=False)


class TokenRangeError(RuntimeError):
    """Token ids at or above the vocabulary they are used with: the data was written with another
    tokenizer than its manifest (or the model) says. A data error (exit 1), not a usage error."""


def check_token_ids(tokens, vocab_size: int, what: str | Callable[[], str]) -> None:
    """Raise when a token id of ``tokens`` lies outside ``[0, vocab_size)``.

    Args:
        tokens: token ids, a numpy array or a torch tensor of any shape (padding included: pad ids
            are vocabulary ids too).
        vocab_size: the vocabulary they index (a manifest's ``vocab_size``, a model's embedding rows).
        what: where they come from, for the message (``"training batch of doc0001, doc0002"``), or a
            function giving it, called only to raise (a batch's keys are decoded only then).
    Raises:
        TokenRangeError: naming ``what``, the largest id and ``vocab_size``.
    """
    size = tokens.numel() if hasattr(tokens, "numel") else tokens.size
    if vocab_size <= 0 or size == 0:
        return
    top, low = int(tokens.max()), int(tokens.min())
    if top >= vocab_size or low < 0:
        bad = top if top >= vocab_size else low
        what = what() if callable(what) else what
        raise TokenRangeError(f"{what}: token id {bad} is outside the vocabulary of {vocab_size}; the data was "
                              "tokenized with another tokenizer than its manifest's vocab_size (or the model's) "
                              "says: check it with colaflow shards verify, and rewrite the data or set the matching "
                              "model.vocab_size")
