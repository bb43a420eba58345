"""Synthetic packed ``TokenBatch``es with the loader's layout: the parity checks of exports and checkpoints."""
from __future__ import annotations

import torch

from loaders.rank.batch import TokenBatch


def synthetic_batch(doc_lengths_per_row: list[list[int]], seq_len: int, vocab: int = 97, seed: int = 0) -> TokenBatch:
    """Pack random documents into ``len(doc_lengths_per_row)`` rows of ``seq_len`` tokens.

    Follows the loader contract: positions restart at 0 per document, the last token of each
    document and all padding have label -100 (so a document of n tokens carries n - 1 real tokens),
    padding has document id -1 and token 0.
    Token ids are uniform in ``[1, vocab)`` from a generator seeded with ``seed``.

    Raises:
        ValueError: a row's documents exceed ``seq_len``.
    """
    g = torch.Generator().manual_seed(seed)
    b = len(doc_lengths_per_row)
    ids = torch.zeros(b, seq_len, dtype=torch.long)
    labels = torch.full((b, seq_len), -100, dtype=torch.long)
    pos = torch.zeros(b, seq_len, dtype=torch.long)
    doc = torch.full((b, seq_len), -1, dtype=torch.long)
    for r, lengths in enumerate(doc_lengths_per_row):
        if sum(lengths) > seq_len:
            raise ValueError(f"row {r}: documents {lengths} exceed seq_len={seq_len}")
        t = 0
        for d, n in enumerate(lengths):
            toks = torch.randint(1, vocab, (n,), generator=g)
            ids[r, t:t + n], pos[r, t:t + n], doc[r, t:t + n] = toks, torch.arange(n), d
            labels[r, t:t + n - 1] = toks[1:]
            t += n
    keys = [f"synthetic-{seed}-{r}-{d}" for r, lengths in enumerate(doc_lengths_per_row) for d in range(len(lengths))]
    return TokenBatch(ids, labels, pos, doc, keys)
