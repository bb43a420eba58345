"""The registry of batch formats (``data.format``): the form in which :class:`loaders.rank.dataset.TokenDataset`
hands a batch to a training loop that is not colaflow's.

* ``colaflow``: :class:`loaders.rank.batch.TokenBatch` as it is (colaflow's trainer, a plain loop, Lightning).
* ``hf``: :class:`HFBatch`, the keyword arguments of a Hugging Face causal LM (``model(**batch)``):
  ``input_ids``, ``labels`` *unshifted* (the model shifts them itself; ``-100`` where no loss is
  taken), ``position_ids`` restarting at 0 at each document, from which transformers builds its
  packed-sequence (block-diagonal causal) attention, and ``use_cache=False``. transformers detects
  packed rows only when there is neither an ``attention_mask`` nor a KV cache; a causal LM makes a
  cache by default (``config.use_cache``, also in training), and then documents attend to each other.
  Rows are padded on the right only, so no mask is needed and none is sent.
* ``torchtitan``: :class:`TitanBatch`, torchtitan's ``(input_dict, labels)`` pair:
  ``{"input": input_ids, "positions": position_ids}`` (torchtitan's ``block_causal`` mask reads
  per-document positions) and labels already shifted (``labels[t]`` is the target of ``input[t]``), as
  torchtitan's cross-entropy expects, with ``-100`` where no loss is taken.

Every format keeps colaflow's rule for document ends: each document ends with EOS, the label of its
last text token is that EOS, and no prediction is taken from the EOS itself (``-100``), so nothing is
learnt across a document boundary. Tensors are ``int64 [B, T]`` on the batch's device.

This module runs on the torch side but imports no torch itself (it only calls tensor methods), so
:mod:`loaders.config` can check ``data.format`` against :data:`FORMATS` in a loader worker.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

from loaders.pack.packed import IGNORE

if TYPE_CHECKING:
    from loaders.rank.batch import TokenBatch


class HFBatch(dict):
    """The ``hf`` format: a ``dict`` of ``input_ids``, ``labels`` (unshifted, ``-100`` where no loss is
    taken) and ``position_ids``, each ``int64 [B, T]``, and ``use_cache=False`` (so transformers keeps
    the packed documents apart); a type of its own so that collating several of them (a ``DataLoader``
    with ``batch_size=N``) is refused (:mod:`loaders.rank.dataset`)."""


class TitanBatch(NamedTuple):
    """The ``torchtitan`` format: ``inputs`` (``{"input": int64 [B, T], "positions": int64 [B, T]}``)
    and ``labels`` (``int64 [B, T]``, shifted, ``-100`` where no loss is taken); unpacks as the
    ``(input_dict, labels)`` pair torchtitan's training step takes."""

    inputs: dict
    labels: Any


def unshifted_labels(batch: "TokenBatch"):
    """Labels for a model that shifts them itself: ``out[:, t] = batch.labels[:, t - 1]`` and
    ``out[:, 0] = -100`` (``int64 [B, T]``): the loss the model takes at ``t - 1`` is colaflow's, so the
    first token of each document (and padding) is never a target of the token before it."""
    labels = batch.labels
    out = labels.new_full(labels.shape, IGNORE)
    out[:, 1:] = labels[:, :-1]
    return out


def _colaflow(batch: "TokenBatch") -> "TokenBatch":
    return batch


def _hf(batch: "TokenBatch") -> HFBatch:
    return HFBatch(input_ids=batch.input_ids, labels=unshifted_labels(batch), position_ids=batch.position_ids,
                   use_cache=False)


def _torchtitan(batch: "TokenBatch") -> TitanBatch:
    return TitanBatch({"input": batch.input_ids, "positions": batch.position_ids}, batch.labels)


@dataclass(frozen=True)
class BatchFormat:
    """One batch format: its ``name`` (the ``data.format`` value), what it ``expects`` of the training
    loop (one line, for the docs and errors) and ``convert`` (``TokenBatch`` -> the loop's batch)."""

    name: str
    expects: str
    convert: Callable[["TokenBatch"], Any]


FORMATS: dict[str, BatchFormat] = {f.name: f for f in (
    BatchFormat("colaflow", "loaders.rank.batch.TokenBatch (input_ids, shifted labels, position_ids, document_ids, "
                "keys)", _colaflow),
    BatchFormat("hf", "model(**batch): input_ids, unshifted labels, position_ids restarting per document, "
                "use_cache=False", _hf),
    BatchFormat("torchtitan", "(input_dict, labels): {'input', 'positions'} and shifted labels", _torchtitan),
)}
